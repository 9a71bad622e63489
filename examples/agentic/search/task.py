"""The search example's world: a seeded corpus of facts about fictional entities, two-hop
questions that only the corpus answers, the search traces the warm start imitates, and the grader.

Every fact is one passage, all of one shape (the fact's object last, where a small model finds it):

    "<person> was born in the city <city>."
    "The country of the city <city> is <country>."
    "The river of the city <city> is <river>."

A question names a person and asks for the country or the river of the city they were born in,
so it takes two searches: ``<person>`` finds the city, ``country of the city <city>`` (or
``river of ...``) the answer. The second query ends with the words that precede the city in the
first passage ("the city <city>"), so writing it is the copy a 2-layer model learns early (an
induction pattern: the next token is the one that followed the same words before). With the
query ``<city> country`` the model had to find the city by its position in the passage; a
warm start took ~260 SFT steps to learn that, against ~120 now (~100 for copying the person's
number). 30 countries and 30 rivers keep a guess worth little (with 6 countries, always naming
the most common one scored 0.19 held-out).

People are numbered ("person 4821": digits are single tokens, so a 2-layer model learns to copy
the number into its query within a short warm start; made-up multi-token names it did not),
places have made-up names (syllables), so no model knows any fact. Held-out questions are about
people no training question names, so at least the first hop must be looked up. (Cities are shared:
the tokenizer (``--vocab-size 1024``) makes every place name one token, and a token no training sample ever emits
cannot be copied by a model that never learned to write it.)
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

CONSONANTS = "bdgklmnprstvz"
VOWELS = "aeiou"
RELATIONS = ("country", "river")  # what a question asks about the person's birth city

QUESTION = "What is the {relation} of the birth city of {person}?"
# For chat models (a tokenizer with a chat template): the rules, as a system message.
SYSTEM_PROMPT = (
    "Answer the question with the search tool. Write <search>query</search> to search a corpus of "
    "facts; the results come back as <information>...</information>. Search as often as you need, "
    "then give the final answer as <answer>name</answer>."
)


@dataclass(frozen=True)
class World:
    people: dict[str, str]  # person -> birth city
    country: dict[str, str]  # city -> country
    river: dict[str, str]  # city -> river

    def passages(self) -> list[str]:
        """The corpus, one fact per passage (people first, then cities)."""
        out = [person_passage(person, city) for person, city in self.people.items()]
        for city in self.country:
            out += [city_passage(self, city, relation) for relation in RELATIONS]
        return out

    def answer(self, person: str, relation: str) -> str:
        city = self.people[person]
        return self.country[city] if relation == "country" else self.river[city]


def make_world(seed: int, *, people: int = 1200, cities: int = 60, countries: int = 30, rivers: int = 30) -> World:
    """A seeded world: people are distinct 4-digit numbers, places distinct made-up words."""
    rng = random.Random(seed)
    used: set[str] = set()

    def names(count: int, syllables: int) -> list[str]:
        out = []
        while len(out) < count:
            word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables)).capitalize()
            if word not in used:
                used.add(word)
                out.append(word)
        return out

    country_names = names(countries, 3)
    river_names = names(rivers, 2)
    city_names = names(cities, 2)
    person_names = [f"person {n}" for n in rng.sample(range(1000, 10000), people)]
    country = {city: rng.choice(country_names) for city in city_names}
    river = {city: rng.choice(river_names) for city in city_names}
    return World({p: rng.choice(city_names) for p in person_names}, country, river)


@dataclass(frozen=True)
class Question:
    person: str
    relation: str

    @property
    def text(self) -> str:
        return QUESTION.format(relation=self.relation, person=self.person)


def split_questions(world: World, heldout_people: int) -> tuple[list[Question], list[Question]]:
    """(train, held-out): every person is asked about both relations; the questions about the first
    ``heldout_people`` people (a random subset: names are drawn at random) are held out."""
    train, heldout = [], []
    for k, person in enumerate(world.people):
        for relation in RELATIONS:
            (heldout if k < heldout_people else train).append(Question(person, relation))
    return train, heldout


def trace(world: World, question: Question, search: Callable[[str], list[str]]) -> list[tuple[str, bool]]:
    """The search trace a warm start imitates, as ``(text, written_by_the_model)`` segments; the
    observations come from ``search(query)``, the retriever the generate hook uses."""
    city = world.people[question.person]
    segments: list[tuple[str, bool]] = []
    for query in (question.person, f"{question.relation} of the city {city}"):
        segments += [(search_call(query), True), (information(search(query)), False)]
    return segments + [(f"<answer> {world.answer(question.person, question.relation)}</answer>", True)]


def person_passage(person: str, city: str) -> str:
    return f"{person} was born in the city {city}."


def city_passage(world: World, city: str, relation: str) -> str:
    value = world.country[city] if relation == "country" else world.river[city]
    return f"The {relation} of the city {city} is {value}."


# A space after each opening tag: a name is then always the pre-token " Name", in the question,
# the passages, the queries and the answer alike (byte-level BPE would glue ">Name" otherwise),
# so copying it is copying the same tokens.
def search_call(query: str) -> str:
    return f"<search> {query}</search>"


def information(passages: list[str]) -> str:
    """The observation appended after a search: the retrieved passages, tagged."""
    return "<information> " + " ".join(passages) + "</information>"


_SEARCH = re.compile(r"<search>(.*?)</search>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def last_search_query(turn_text: str) -> str | None:
    """The query of a turn that ends with a search call, else None."""
    found = _SEARCH.findall(turn_text)
    return found[-1].strip() if found and turn_text.rstrip().endswith("</search>") else None


def extract_answer(response: str) -> str | None:
    """The last ``<answer>…</answer>`` (or, failing that, the last ``\\boxed{…}``) of a response."""
    found = _ANSWER.findall(response) or _BOXED.findall(response)
    return found[-1] if found else None


def normalize(text: str) -> str:
    return " ".join(text.lower().strip().strip(".").split())


def grade(response: str, label: str, *, evidence_found: bool = False, evidence_credit: float = 0.0) -> float:
    """1.0 when the final answer equals the label (case and surrounding space ignored); else
    ``evidence_credit`` when a search retrieved the passage that holds the answer (the second hop
    was right), else 0.0. The partial credit is what makes the second hop learnable by RL: a right
    city in the second query is rare after the warm start, and rarer still followed by the right
    answer, so an all-or-nothing reward left most groups without a difference to learn from."""
    answer = extract_answer(response)
    if answer is not None and normalize(answer) == normalize(label):
        return 1.0
    return evidence_credit if evidence_found else 0.0
