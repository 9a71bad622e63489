"""The engine teacher of on-policy distillation (--opd-type sglang): it scores each final sample.

A sample is final when its generation returned (after any partial-rollout resumes: the teacher
sees the tokens that will be trained, never a stale prefix). The rollout then sends prompt +
response to the teacher engine as SGLang's scoring request — ``max_new_tokens`` 0,
``return_logprob``, ``logprob_start_len`` at the last prompt token, so the teacher's prefix cache
serves the prompt that a group's samples share — while other samples still generate, so the
teacher's cost overlaps generation. The answer's ``input_token_logprobs`` tail becomes
``Sample.teacher_logprobs`` (one per response token; the loss mask decides which count).

A sample the teacher cannot score (its engine failed past the client's retries, or it holds an id
outside the teacher's vocabulary, which is never sent) keeps ``teacher_logprobs`` None: it trains
without the OPD term and counts as unscored.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from policies.opd import ENGINE_TEACHER_TEMPERATURE, teacher_response_logprobs
from slime_async.engine_client import EngineClient, EngineError
from slime_async.sample import Sample
from slime_async.token_ids import out_of_vocabulary

log = logging.getLogger(__name__)

# SGLang scores given tokens at temperature 1 whatever this says (policies/opd.py); it is said
# anyway so that a server which did scale by it answers the same. Runs whose student is at
# another temperature are refused at start (actors/loop/opd_config.py).
SCORING_PARAMS = {"temperature": ENGINE_TEACHER_TEMPERATURE, "max_new_tokens": 0}


@dataclass
class TeacherStats:
    """Since the last ``take()``: the teacher's scoring time and what it scored."""

    seconds: float = 0.0
    samples: int = 0
    model_tokens: int = 0  # loss-mask tokens of the samples sent
    scored_tokens: int = 0  # of those, the ones that came back scored
    errors: int = 0


class TeacherScorer:
    """Scores samples on one teacher engine (owned or external) through its SGLang API."""

    def __init__(self, url: str, *, vocab_size: int | None = None, api_key: str | None = None,
                 timeout: float | None = None):
        self.url = url
        # The teacher's vocabulary: a student's id outside it is never sent (it would kill an SGLang
        # teacher: slime_async/token_ids.py); such a sample is counted as an error, unscored.
        self.vocab_size = vocab_size
        self.client = EngineClient(url, api_key=api_key, timeout=timeout)
        self.stats = TeacherStats()
        self.total_errors = 0

    async def score(self, sample: Sample) -> None:
        """Set ``sample.teacher_logprobs`` from the teacher's logprobs of its response tokens."""
        model_tokens = sum(sample.loss_mask)
        self.stats.model_tokens += model_tokens
        self.stats.samples += 1
        if sample.response_length == 0:
            sample.teacher_logprobs = []
            return
        prompt_length = len(sample.tokens) - sample.response_length
        started = time.monotonic()
        try:
            problem = out_of_vocabulary(sample.tokens, self.vocab_size, "tokens")
            if problem:
                raise ValueError(f"not sent: {problem} (the teacher's)")
            answer = await self.client.generate(sample.tokens, dict(SCORING_PARAMS), return_logprob=True,
                                                logprob_start_len=max(prompt_length - 1, 0))
            entries = answer["meta_info"]["input_token_logprobs"]
            sample.teacher_logprobs = teacher_response_logprobs(entries, sample.response_length)
        except (EngineError, KeyError, TypeError, ValueError) as error:
            self.stats.errors += 1
            self.total_errors += 1
            log.warning("opd teacher %s could not score sample %s/%s: %s", self.url, sample.group_index,
                        sample.index, error)
            sample.teacher_logprobs = None
        else:
            self.stats.scored_tokens += model_tokens
        finally:
            self.stats.seconds += time.monotonic() - started

    def take(self) -> dict[str, float]:
        """``rollout/opd_*`` metrics since the last call. The per-sample time and the scored fraction
        are left out of a window in which the teacher scored nothing (fully-async can train a step
        on groups scored before the previous one): a ratio of nothing is not 0."""
        stats, self.stats = self.stats, TeacherStats()
        out = {"rollout/opd_teacher_time": stats.seconds, "rollout/opd_teacher_errors": float(self.total_errors)}
        if stats.samples:
            out["rollout/opd_teacher_time_per_sample"] = stats.seconds / stats.samples
        if stats.model_tokens:
            out["rollout/opd_scored_fraction"] = stats.scored_tokens / stats.model_tokens
        return out

    async def close(self) -> None:
        await self.client.close()
