"""Run checkpoints: reconciling the rollout's and the buffer's snapshots, finding the latest."""

from actors.loop.run_checkpoint import latest_checkpoint, without_buffered


def pending(group_index, name):
    return {"group_index": group_index, "prompt": {"prompt": name}}


def buffer_with_groups(*group_indexes):
    return {"groups": [[{"group_index": g, "index": i} for i in range(2)] for g in group_indexes]}


def test_a_group_in_both_snapshots_is_kept_only_as_buffered():
    prompts = [pending(3, "a"), pending(4, "b"), pending(None, "retry")]
    assert without_buffered(prompts, buffer_with_groups(1, 4)) == [pending(3, "a"), pending(None, "retry")]


def test_prompts_waiting_for_a_retry_are_always_kept():
    prompts = [pending(None, "x"), pending(None, "y")]
    assert without_buffered(prompts, buffer_with_groups()) == prompts


def test_latest_checkpoint_is_the_step_directory_latest_names(tmp_path):
    assert latest_checkpoint(tmp_path) is None and latest_checkpoint(None) is None
    (tmp_path / "step_000004").mkdir()
    (tmp_path / "latest").write_text("step_000004")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000004"
