"""The verifiers adapter's settings, prompt rows and start-time checks (no engine: the two-step runs
through the front are tests/examples/test_verifiers_envs.py)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra is not installed")

from actors.rollout import verifiers_env  # noqa: E402
from actors.rollout.config import RolloutConfig  # noqa: E402

ENV = "examples.verifiers.reverse_digits.env"
HOOKS = {"custom_generate_function_path": "actors.rollout.verifiers_env:generate",
         "custom_rm_path": "actors.rollout.verifiers_env:reward", "group_rm": True}


def write(tmp_path, text: str, name: str = "env.yaml") -> str:
    path = tmp_path / name  # settings are read once per file
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, message", [
    ("env_args: {}\n", "env_id must name the environment module"),
    (f"env_id: {ENV}\nenv_arg: {{}}\n", "unknown verifiers setting(s) env_arg"),
    (f"env_id: {ENV}\nenv_args: [1]\n", "env_args must be a mapping"),
    (f"env_id: {ENV}\nmax_tokens: 0\n", "max_tokens must be a positive integer"),
])
def test_a_bad_setting_is_named(tmp_path, text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        verifiers_env.settings(write(tmp_path, text))


def test_the_runs_sampling_parameters_become_verifiers_sampling_args():
    params = {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64}
    assert verifiers_env.sampling_args(params, 48) == {
        "temperature": 0.8, "top_p": 0.9, "max_tokens": 48, "extra_body": {"top_k": 20}}
    # Without the setting each request may take the sample's whole budget; top_k -1 is not sent.
    assert verifiers_env.sampling_args({**params, "top_k": -1}, None) == {
        "temperature": 0.8, "top_p": 0.9, "max_tokens": 64, "extra_body": {}}


def test_prepare_writes_the_envs_rows_with_its_rollout_input(tmp_path, capsys):
    config = write(tmp_path, f"env_id: {ENV}\nenv_args: {{num_train: 3, num_eval: 2}}\n")
    assert verifiers_env.main(["--config", config, "--out", str(tmp_path / "data")]) == 0
    train = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    heldout = [json.loads(line) for line in (tmp_path / "data" / "heldout.jsonl").read_text().splitlines()]
    assert (len(train), len(heldout)) == (3, 2)
    row = train[0]
    text = row["prompt"][0]["content"].removeprefix("reverse ").removesuffix(":")
    assert row["prompt"] == [{"role": "user", "content": f"reverse {text}:"}] and row["label"] == text[::-1]
    assert row["metadata"]["verifiers"]["input"] == {"question": f"reverse {text}:", "answer": text[::-1],
                                                     "example_id": 0, "prompt": row["prompt"]}
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in heldout}


def test_a_bad_env_fails_at_start_naming_it(tmp_path):
    config = RolloutConfig(custom_config_path=write(tmp_path, "env_id: examples.verifiers.nope\n"), **HOOKS)
    with pytest.raises(ValueError, match="verifiers env_id 'examples.verifiers.nope' does not import"):
        config.preflight()
    RolloutConfig(custom_config_path=write(tmp_path, f"env_id: {ENV}\n", "good.yaml"), **HOOKS).preflight()  # a good one passes
