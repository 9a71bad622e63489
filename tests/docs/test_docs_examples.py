"""Every example in README.md and docs/*.md is checked here, in-process and without training.

- fenced ``toml`` / ``yaml`` blocks are run configs: they parse with ``parse_run_config`` (and pass
  ``preflight`` where every path they name exists);
- fenced ``python`` blocks compile; ``jsonl`` blocks are prompt data that ``PromptDataset`` reads
  without a bad row;
- every ``slime-async ...`` command (in ``bash`` blocks and inline code): ``train`` commands parse
  with ``parse_run_config``; other commands' flags appear in that command's ``--help``;
- every other line of a ``bash`` block and every inline ``bash`` / ``python`` command names a
  script that exists, or is one of ``OTHER_COMMANDS`` with the place that runs it;
- every relative link points at a file (and heading) that exists, and so does every repository
  path in inline code (`tests/e2e/test_resume.py`).

An example this file cannot check fails it: extend the checks rather than skipping the example.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from actors.loop.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
# Lines of bash blocks that are not checked by running them here, and what covers them.
OTHER_COMMANDS = {
    "pip install torch": "the user's CUDA build (docs/gpu.md); .ci/setup-venv installs the CPU one",
}


@dataclass(frozen=True)
class Example:
    page: str
    kind: str  # toml, yaml, python, command
    text: str

    def __str__(self) -> str:
        return f"{self.page}: {self.text.splitlines()[0][:70]}"


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line).strip()


def _commands(block: str) -> list[str]:
    """The commands of a bash block: comments dropped, backslash continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [c for c in (_strip_comment(line) for line in joined.splitlines()) if c]


def collect() -> list[Example]:
    examples = []
    for page in PAGES:
        text = page.read_text()
        name = str(page.relative_to(ROOT))
        for lang, body in FENCE.findall(text):
            if lang in ("toml", "yaml", "python", "jsonl"):
                examples.append(Example(name, lang, body))
            elif lang in ("bash", "sh", "shell"):
                examples += [Example(name, "command", c) for c in _commands(body)]
            elif lang not in ("", "text"):  # plain blocks are pictures and output, not examples
                raise AssertionError(f"{name}: a ```{lang} block, which this test does not check")
        for span in INLINE.findall(FENCE.sub("", text)):
            span = " ".join(span.split())
            if re.match(r"slime-async |(bash|python|\.venv/bin/python) \S+\.(py|sh)\b", span):
                examples.append(Example(name, "command", span))
    return examples


EXAMPLES = collect()


def _ids(kind: str) -> list[Example]:
    return [e for e in EXAMPLES if e.kind == kind]


def _unbracket(command: str) -> list[str]:
    """argv of a documented command line: optional ``[--flag VALUE]`` groups taken as given,
    ``[URL ...]``-style placeholders dropped."""
    command = re.sub(r"\[(?!-)[^\]]*\]", " ", command)
    return shlex.split(command.replace("[", " ").replace("]", " "))


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        COMMANDS[command][0](["--help"])
    assert exit_.value.code == 0
    return out.getvalue()


def _paths_exist(values: list[object]) -> bool:
    paths = [v for v in values if isinstance(v, str) and not v.startswith("-")
             and ("/" in v or re.search(r"\.(jsonl|toml|yaml)$", v))]
    return all((ROOT / p).exists() for p in paths)


def _leaves(tree: object) -> list[object]:
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    if isinstance(tree, list):
        return [leaf for value in tree for leaf in _leaves(value)]
    return [tree]


def check_train(argv: list[str], paths: list[object]) -> None:
    """``argv`` parses; with every path in ``paths`` present it passes ``preflight`` too."""
    from actors.loop.run_config import parse_run_config
    from slime_async.config.loader import preflight

    config = parse_run_config(argv)
    if _paths_exist(paths):
        preflight(config)


def check_command(text: str) -> None:
    argv = _unbracket(text) if text.startswith("slime-async ") else shlex.split(text)
    program, rest = argv[0], argv[1:]
    if program == "slime-async":
        if not rest or rest[0] in ("-h", "--help"):
            return
        subcommand, args = rest[0], rest[1:]
        assert subcommand in COMMANDS, f"unknown command {subcommand!r}"
        if not args or "--help" in args or "--help-all" in args:
            return
        if subcommand == "train":
            check_train(args, args)
            return
        usage = _help(subcommand)
        for arg in args:
            if arg.startswith("--"):
                assert re.search(rf"(?<![\w-]){re.escape(arg)}(?![\w-])", usage), f"{arg} is not in {subcommand} --help"
            elif "|" in arg:  # alternatives: `convert hf-to-megatron|megatron-to-hf`
                for choice in arg.split("|"):
                    assert choice in usage, f"{choice} is not in {subcommand} --help"
        return
    if program == "sbatch":  # options, then the batch script (whose own arguments go to slime-async train)
        script = next(arg for arg in rest if arg.endswith(".sbatch"))
        assert (ROOT / script).is_file(), f"{script} does not exist"
        return
    if program in ("bash", "python", ".venv/bin/python"):
        assert (ROOT / rest[0]).is_file(), f"{rest[0]} does not exist"
        return
    if program == "pip" and rest[:2] == ["install", "-e"]:
        extra = re.fullmatch(r"\.\[(\w+)\]", rest[2])
        setup = configparser.ConfigParser()
        setup.read(ROOT / "setup.cfg")
        assert extra and extra.group(1) in setup["options.extras_require"], f"no extra {rest[2]} in setup.cfg"
        return
    assert text in OTHER_COMMANDS, f"no check for {text!r}: add one here, or to OTHER_COMMANDS with what runs it"


def test_the_docs_have_examples_of_each_kind():
    assert {"toml", "yaml", "python", "jsonl", "command"} <= {e.kind for e in EXAMPLES}
    assert any(e.text.startswith("slime-async train ") for e in _ids("command"))


@pytest.mark.parametrize("example", _ids("toml") + _ids("yaml"), ids=str)
def test_config_example_parses(example, tmp_path):
    path = tmp_path / f"run.{example.kind}"
    path.write_text(example.text)
    tree = tomllib.loads(example.text) if example.kind == "toml" else yaml.safe_load(example.text)
    check_train(["--config", str(path)], _leaves(tree))


@pytest.mark.parametrize("example", _ids("python"), ids=str)
def test_python_example_compiles(example):
    compile(example.text, example.page, "exec")


@pytest.fixture(scope="module")
def tokenizer():
    from examples.models.tiny import train_tokenizer

    return train_tokenizer(vocab_size=512, seed=0)  # the tiny model's tokenizer, with its chat template


@pytest.mark.parametrize("example", _ids("jsonl"), ids=str)
def test_prompt_data_example_loads_without_bad_rows(example, tmp_path, tokenizer):
    from actors.rollout.data import PromptDataset

    path = tmp_path / "rows.jsonl"
    path.write_text(example.text)
    rows = [line for line in example.text.splitlines() if line.strip()]
    dataset = PromptDataset(path, tokenizer, apply_chat_template=True, require_label=True)
    assert (len(dataset), dataset.bad_rows) == (len(rows), 0)


@pytest.mark.parametrize("example", _ids("command"), ids=str)
def test_command_example_parses(example):
    check_command(example.text)


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_existing_files_and_headings(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{target}: no such file"
        if anchor:
            headings = {_anchor(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
            assert anchor in headings, f"{target}: no heading #{anchor} in {dest.name}"


REPO_PATH = re.compile(r"^((?:examples|benchmarks|tests|actors|slime_async|policies|docs)/[\w./*-]*)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_paths_in_inline_code_exist(page):
    for span in INLINE.findall(FENCE.sub("", page.read_text())):
        for token in span.split():
            if match := REPO_PATH.match(token):
                path = match.group(1).rstrip(".")
                assert list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists(), f"`{span}`: no {path}"


def test_a_wrong_flag_in_a_train_example_is_caught():
    # the check can fail: a misspelt flag is a config error, not a pass
    from slime_async.config.flags import ConfigError

    with pytest.raises(ConfigError):
        check_command("slime-async train --hf-checkpoint /models/m --rollout-batch-sise 4")
    with pytest.raises(AssertionError, match="--no-such-flag"):
        check_command("slime-async router --engine-url http://127.0.0.1:1 --no-such-flag 1")
