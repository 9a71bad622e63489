"""On-policy distillation's cross-section rules: the teacher flags each --opd-type needs, refuses,
and the tokenizer it must share with the student (checked at start, before anything is spawned).

The flags live in the sections that use them (slime's names): --use-opd, --opd-type and
--opd-kl-coef in the algorithm section, --opd-teacher-load in the trainer's (the ranks load it),
--opd-teacher-hf-checkpoint / --opd-teacher-url in the engine section (the run starts the one,
the rollout calls either).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from slime_async.config.tokenizer_match import require_same_tokenizer

if TYPE_CHECKING:
    from actors.loop.run_config import RunConfig


def check_opd(config: RunConfig) -> None:
    """Raise ValueError (one line, naming the flag) for a teacher that does not fit --opd-type, or
    an engine teacher at a rollout temperature it cannot score at (policies/opd.py)."""
    spec, engine, trainer = config.algorithm, config.engine, config.trainer
    engine_teacher = engine.opd_teacher_hf_checkpoint or engine.opd_teacher_url
    if not spec.use_opd:
        stray = [flag for flag, value in (("--opd-teacher-load", trainer.opd_teacher_load),
                                          ("--opd-teacher-hf-checkpoint", engine.opd_teacher_hf_checkpoint),
                                          ("--opd-teacher-url", engine.opd_teacher_url)) if value]
        if stray:
            raise ValueError(f"{stray[0]} needs --use-opd --opd-type {'megatron' if 'load' in stray[0] else 'sglang'}")
        return
    if spec.opd_type == "megatron":
        if not trainer.opd_teacher_load:
            raise ValueError("--opd-type megatron needs --opd-teacher-load (an HF directory or a Megatron checkpoint)")
        if engine_teacher:
            flag = "--opd-teacher-hf-checkpoint" if engine.opd_teacher_hf_checkpoint else "--opd-teacher-url"
            raise ValueError(f"{flag} is the engine teacher of --opd-type sglang, not megatron")
        if config.train.debug_rollout_only:
            raise ValueError("--opd-type megatron with --debug-rollout-only: the teacher runs in the trainer ranks")
        return
    # sglang: as in slime, --opd-teacher-load must not be set
    if trainer.opd_teacher_load:
        raise ValueError("--opd-teacher-load is the trainer-side teacher of --opd-type megatron; with --opd-type "
                         "sglang give --opd-teacher-hf-checkpoint or --opd-teacher-url")
    if not engine_teacher:
        raise ValueError("--opd-type sglang needs --opd-teacher-hf-checkpoint DIR (an engine this run starts) or "
                         "--opd-teacher-url URL (one already running)")
    if engine.opd_teacher_hf_checkpoint and config.train.colocate:
        raise ValueError("--opd-teacher-hf-checkpoint with --colocate: the teacher engine has no device of its own "
                         "to release (not supported); give --opd-teacher-url")
    # policies.opd imports torch: here, not at module level, so `train --help` stays light.
    from policies.opd import ENGINE_TEACHER_TEMPERATURE, teacher_temperature

    if teacher_temperature(config.rollout.logprob_temperature) != ENGINE_TEACHER_TEMPERATURE:
        raise ValueError(f"--opd-type sglang with --rollout-temperature {config.rollout.rollout_temperature}: OPD "
                         "compares student and teacher at the rollout temperature, and an engine teacher scores at "
                         "1 only (SGLang 0.5.17 ignores the request's temperature there); use --opd-type megatron, "
                         "or --rollout-temperature 1")


def served_model_dir(url: str, api_key: str | None = None, timeout: float = 10.0) -> Path | None:
    """The HF directory an engine at ``url`` serves (SGLang's ``/model_info`` names it) when it is
    readable here; None when it is not, or the engine does not answer (checked nowhere then)."""
    request = urllib.request.Request(url.rstrip("/") + "/model_info",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            path = Path(json.loads(answer.read())["model_path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return path if (path / "config.json").is_file() else None


def preflight_opd(config: RunConfig) -> None:
    """The teacher directory shares the student's tokenizer (an external teacher's when the model
    it serves is readable here)."""
    spec = config.algorithm
    if not spec.use_opd or not config.trainer.hf_checkpoint:
        return
    from slime_async.config.paths import require_hf_model_dir

    if spec.opd_type == "sglang" and config.engine.opd_teacher_url:
        served = served_model_dir(config.engine.opd_teacher_url, config.engine.engine_api_key)
        if served is not None:
            require_same_tokenizer(config.trainer.hf_checkpoint, str(served), "--opd-teacher-url")
        return
    if spec.opd_type == "sglang" and config.engine.opd_teacher_hf_checkpoint:
        teacher, flag = config.engine.opd_teacher_hf_checkpoint, "--opd-teacher-hf-checkpoint"
    elif spec.opd_type == "megatron":
        teacher, flag = config.trainer.opd_teacher_load, "--opd-teacher-load"
        if not (Path(teacher) / "config.json").is_file():
            # A Megatron checkpoint (dist_checkpointing writes metadata.json) has no tokenizer of its
            # own: it holds weights of the student's architecture.
            if not any((Path(teacher) / sub / "metadata.json").is_file() for sub in ("", "trainer")):
                raise ValueError(f"{flag} {teacher} is neither an HF directory (config.json) nor a Megatron "
                                 "checkpoint (metadata.json, or trainer/metadata.json in a --save step directory)")
            return
    else:
        return
    require_hf_model_dir(teacher, flag)
    require_same_tokenizer(config.trainer.hf_checkpoint, teacher, flag)
