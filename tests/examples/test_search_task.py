"""The search example's world, questions, traces, grader and BM25 retriever (examples/agentic/search)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from examples.agentic.search import retriever, task

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world():
    return task.make_world(0, people=40, cities=6, countries=2, rivers=3)


def test_the_world_is_seeded_and_its_names_distinct(world):
    assert task.make_world(0, people=40, cities=6, countries=2, rivers=3) == world
    assert task.make_world(1, people=40, cities=6, countries=2, rivers=3) != world
    names = [*world.people, *world.country, *set(world.country.values()), *set(world.river.values())]
    assert len(names) == len(set(names))
    assert all(city in world.country for city in world.people.values())


def test_the_corpus_has_one_passage_per_fact(world):
    passages = world.passages()
    assert len(passages) == 40 + 2 * 6
    person, city = next(iter(world.people.items()))
    assert f"{person} was born in the city {city}." in passages
    assert f"The country of the city {city} is {world.country[city]}." in passages
    assert f"The river of the city {city} is {world.river[city]}." in passages


def test_a_hand_built_world_answers_two_hops():
    world = task.World(people={"person 1234": "Nota"}, country={"Nota": "Zeta"}, river={"Nota": "Sava"})
    assert world.answer("person 1234", "country") == "Zeta"
    assert world.answer("person 1234", "river") == "Sava"
    assert task.Question("person 1234", "river").text == "What is the river of the birth city of person 1234?"


def test_held_out_questions_are_about_people_no_training_question_names(world):
    train, heldout = task.split_questions(world, heldout_people=5)
    assert len(heldout) == 10 and len(train) == 70
    assert {q.person for q in heldout}.isdisjoint({q.person for q in train})
    assert {q.relation for q in heldout} == {"country", "river"}


def test_the_trace_searches_twice_and_answers():
    world = task.World(people={"person 1234": "Nota"}, country={"Nota": "Zeta"}, river={"Nota": "Sava"})
    index = retriever.Retriever(world.passages())
    segments = task.trace(world, task.Question("person 1234", "country"), lambda q: index.search(q, 1))
    assert segments == [
        ("<search> person 1234</search>", True),
        ("<information> person 1234 was born in the city Nota.</information>", False),
        ("<search> country of the city Nota</search>", True),
        ("<information> The country of the city Nota is Zeta.</information>", False),
        ("<answer> Zeta</answer>", True),
    ]


@pytest.mark.parametrize("response, label, expected", [
    ("<search> x</search><information> y</information><answer> Zeta</answer>", "Zeta", 1.0),
    ("<answer>zeta.</answer>", "Zeta", 1.0),  # case and a final period are ignored
    ("<answer> Zeta</answer><answer> Sava</answer>", "Zeta", 0.0),  # the last answer counts
    ("the answer is Zeta", "Zeta", 0.0),  # no answer tag
    ("\\boxed{Zeta}", "Zeta", 1.0),
    ("<answer> Zetas</answer>", "Zeta", 0.0),
])
def test_grade_is_exact_match_of_the_last_answer(response, label, expected):
    assert task.grade(response, label) == expected


@pytest.mark.parametrize("response, found, expected", [
    ("<answer> Zeta</answer>", True, 1.0),  # the right answer is worth 1 whatever was retrieved
    ("<answer> Sava</answer>", True, 0.25),  # wrong answer after the right second search: the credit
    ("<answer> Sava</answer>", False, 0.0),
    ("", True, 0.25),  # no answer at all, but the evidence was found
])
def test_a_wrong_answer_earns_the_evidence_credit_only_when_the_evidence_was_retrieved(response, found, expected):
    assert task.grade(response, "Zeta", evidence_found=found, evidence_credit=0.25) == expected
    assert task.grade(response, "Zeta", evidence_found=found) == (1.0 if expected == 1.0 else 0.0)  # default: none


def test_a_search_query_counts_only_when_the_turn_ends_with_the_call():
    assert task.last_search_query("<search> person 12</search>") == "person 12"
    assert task.last_search_query("<search> a</search> and more") is None
    assert task.last_search_query("<answer> a</answer>") is None


def test_the_right_passage_is_top_1_for_every_query_of_a_trace(world):
    index = retriever.Retriever(world.passages())
    for person, city in world.people.items():
        assert index.search(person, 1) == [f"{person} was born in the city {city}."]
        for relation in task.RELATIONS:  # the second query, as the trace writes it
            assert index.search(f"{relation} of the city {city}", 1) == [task.city_passage(world, city, relation)]


def test_a_query_of_unknown_words_finds_nothing(world):
    assert retriever.Retriever(world.passages()).search("zzz qqq", 3) == []


def test_prepare_writes_consistent_files(tmp_path):
    out = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "examples/agentic/search/prepare.py"), "--out", str(out),
                    "--heldout-people", "10"], check=True, capture_output=True)
    read = lambda name: [json.loads(line) for line in (out / name).read_text().splitlines()]  # noqa: E731
    train, heldout, sft = read("train.jsonl"), read("heldout.jsonl"), read("sft.jsonl")
    assert len(heldout) == 20 and len(sft) == len(train)
    assert [r["prompt"] for r in sft] == [r["prompt"] for r in train]
    assert all(row["label"][-1]["text"] == f"<answer> {t['label']}</answer>" for row, t in zip(sft, train))
    assert [s["train"] for s in sft[0]["label"]] == [True, False, True, False, True]
    assert "corpus" in (out / "settings.yaml").read_text()
    assert "evidence_credit: 0.25" in (out / "settings.yaml").read_text()
    # every RL row names the passage that holds its answer (the partial credit's evidence)
    corpus = {json.loads(line)["text"] for line in (out / "corpus.jsonl").read_text().splitlines()}
    for row in train + heldout:
        evidence = row["metadata"]["evidence"]
        assert evidence in corpus and evidence.endswith(f" is {row['label']}.")
        assert evidence.startswith("The country of" if "country" in row["prompt"] else "The river of")
    assert all("metadata" not in row for row in sft)


def test_prepare_refuses_an_evidence_credit_worth_as_much_as_the_answer(tmp_path, capsys):
    from examples.agentic.search import prepare

    with pytest.raises(SystemExit) as exit_info:
        prepare.main(["--out", str(tmp_path / "d"), "--evidence-credit", "1"])
    assert exit_info.value.code == 2 and not (tmp_path / "d").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "--evidence-credit must be in [0, 1): the right answer must stay worth the most")


def test_prepare_writes_chat_messages_for_a_tokenizer_with_a_chat_template(tmp_path):
    from examples.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", seed=0)
    out = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "examples/agentic/search/prepare.py"), "--out", str(out),
                    "--chat-tokenizer", str(model)], check=True, capture_output=True)
    row = json.loads((out / "train.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"].startswith("What is the ")


def test_prepare_refuses_a_directory_without_a_tokenizer(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "examples/agentic/search/prepare.py"), "--out",
                             str(tmp_path / "d"), "--chat-tokenizer", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(f"--chat-tokenizer {tmp_path}: ")
