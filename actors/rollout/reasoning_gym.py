"""reasoning-gym tasks as prompt data and reward (``--rm-type reasoning_gym``).

reasoning-gym (the optional ``reasoning-gym`` extra) generates procedural tasks: an entry is
``{question, answer, metadata}`` and the dataset's own ``score_answer(answer, entry)`` grades a
response. Here:

- ``prepare`` (``slime-async prepare-reasoning-gym``) writes ``train.jsonl`` and ``heldout.jsonl``
  from one generator with two seeds (``--seed`` and ``--seed + 1``); a held-out question that
  also appears in the training draw is dropped from training, so the two sets never overlap.
  A row: ``{"prompt": question + ANSWER_INSTRUCTION, "label": "<answer>A</answer>",
  "metadata": {"reasoning_gym": {"dataset": NAME, "config": {...}, "entry": {...}}}}``. The
  label is the completion in the format the prompt asks for (what a supervised warm start
  trains on); the reward never reads it.
- ``ReasoningGymReward`` rebuilds the generator from the row's ``dataset`` and ``config``
  (cached per generator), takes the answer with reasoning-gym's own ``extract_answer`` (the last
  ``<answer>...</answer>``) and returns the generator's ``score_answer`` on the row's entry.
  Many scorers give partial credit (``spell_backward``: per matching leading letter), so
  ``exact_match`` (the extracted answer equals the entry's answer) is logged beside the reward
  as ``rollout/exact_match`` and ``eval/exact_match``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import threading
from pathlib import Path
from typing import Any

# Said in every prompt, so the model knows the format extract_answer reads.
ANSWER_INSTRUCTION = "\nPut the final answer in <answer></answer> tags."
METADATA_KEY = "reasoning_gym"


def require_package() -> Any:
    """The reasoning_gym module, or ValueError in one line saying how to install it."""
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError("reasoning-gym is not installed: pip install 'slime-async[reasoning-gym]' "
                         "(or reasoning-gym==0.1.25)") from None
    return reasoning_gym


def create_generator(name: str, config: dict[str, Any]) -> Any:
    """``reasoning_gym.create_dataset(name, **config)``; a bad name or field fails in one line."""
    package = require_package()
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"choose from {', '.join(sorted(DATASETS))}"
        raise ValueError(f"reasoning-gym has no generator {name!r}: {hint}")
    try:
        return package.create_dataset(name, **config)
    except TypeError as error:  # an unknown config field: the dataclass names it
        raise ValueError(f"reasoning-gym generator {name!r}: bad config ({error})") from None
    except AssertionError as error:  # the config's validate() asserts
        raise ValueError(f"reasoning-gym generator {name!r}: invalid config ({error})") from None


def rows(name: str, config: dict[str, Any], *, size: int, seed: int) -> list[dict[str, Any]]:
    """``size`` prompt rows drawn by generator ``name`` with ``seed`` (see the module docstring)."""
    full = {**config, "size": size, "seed": seed}
    generator = create_generator(name, full)
    out = []
    for index in range(size):
        entry = generator[index]
        record = {"question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"]}
        try:
            json.dumps(record)
        except (TypeError, ValueError) as error:
            raise ValueError(f"reasoning-gym generator {name!r}: entry {index} is not JSON-serialisable ({error}); "
                             "its scorer cannot be rebuilt from a row") from None
        out.append({"prompt": entry["question"] + ANSWER_INSTRUCTION, "label": f"<answer>{entry['answer']}</answer>",
                    "metadata": {METADATA_KEY: {"dataset": name, "config": full, "entry": record}}})
    return out


class ReasoningGymReward:
    """``score(response, metadata) -> float``: the row's generator's own scorer. Thread-safe:
    built-in rewards run in worker threads, several at once."""

    def __init__(self) -> None:
        require_package()
        self._generators: dict[str, Any] = {}
        self._lock = threading.Lock()

    def score(self, response: str, metadata: dict[str, Any]) -> float:
        from reasoning_gym.utils import extract_answer

        task = metadata.get(METADATA_KEY)
        if not isinstance(task, dict) or not {"dataset", "config", "entry"} <= set(task):
            raise ValueError(f"--rm-type reasoning_gym: the sample's metadata has no {METADATA_KEY!r} object with "
                             "dataset, config and entry (write the data with slime-async prepare-reasoning-gym)")
        generator = self._generator(task["dataset"], task["config"])
        return float(generator.score_answer(answer=extract_answer(response), entry=task["entry"]))

    @staticmethod
    def exact_match(response: str, metadata: dict[str, Any]) -> bool:
        """Whether the response's answer (``extract_answer``, stripped) is the entry's answer exactly."""
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(response)
        entry = metadata[METADATA_KEY]["entry"]  # score() has checked the row's shape
        return answer is not None and answer.strip() == str(entry["answer"]).strip()

    def _generator(self, name: str, config: dict[str, Any]) -> Any:
        key = json.dumps([name, config], sort_keys=True)
        with self._lock:
            if key not in self._generators:
                self._generators[key] = create_generator(name, config)
            return self._generators[key]


def prepare(name: str, config: dict[str, Any], *, train_size: int, heldout_size: int, seed: int,
            out: Path) -> tuple[int, int]:
    """Write ``out/train.jsonl`` and ``out/heldout.jsonl``; (train rows, held-out rows) written."""
    heldout = rows(name, config, size=heldout_size, seed=seed + 1)
    seen = {row["metadata"][METADATA_KEY]["entry"]["question"] for row in heldout}
    train = [row for row in rows(name, config, size=train_size, seed=seed)
             if row["metadata"][METADATA_KEY]["entry"]["question"] not in seen]
    out.mkdir(parents=True, exist_ok=True)
    for file, data in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(out / file, "w") as handle:
            for row in data:
                handle.write(json.dumps(row) + "\n")
    return len(train), len(heldout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slime-async prepare-reasoning-gym", description=(
        "Write train.jsonl and heldout.jsonl from a reasoning-gym generator, for --prompt-data / "
        "--eval-prompt-data with --rm-type reasoning_gym."))
    parser.add_argument("--dataset", required=True, help="generator name, e.g. chain_sum, basic_arithmetic, leg_counting")
    parser.add_argument("--config", default="{}", help="JSON object of the generator's config fields")
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--heldout-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="training seed; the held-out set uses seed + 1")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        config = json.loads(args.config)
        if not isinstance(config, dict):
            raise ValueError("--config must be a JSON object")
        if args.train_size <= 0 or args.heldout_size <= 0:
            raise ValueError("--train-size and --heldout-size must be > 0")
        train, heldout = prepare(args.dataset, config, train_size=args.train_size, heldout_size=args.heldout_size,
                                 seed=args.seed, out=args.out)
    except json.JSONDecodeError as error:
        print(f"error: --config is not JSON ({error.msg})", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {train} training and {heldout} held-out {args.dataset} problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
