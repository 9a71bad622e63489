"""`--router-*` flags: how the router picks engines, checks their health and retries, and its HTTP front."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slime_async.config.flags import field_help as _help

RouterPolicyName = Literal["sticky", "consistent_hash", "least_loaded", "round_robin"]
ToolParserName = Literal["auto", "hermes", "llama3_json", "none"]


@dataclass
class RouterConfig:
    router_policy: RouterPolicyName = field(default="sticky", metadata=_help(
        "engine choice per request: sticky keeps a session on its engine (prefix-cache reuse) "
        "and moves it when that engine is overloaded; consistent_hash, least_loaded, round_robin"))
    router_imbalance_threshold: float = field(default=4.0, metadata=_help(
        "sticky: move a session when its engine's load (requests in flight) exceeds the "
        "least-loaded engine's by more than this"))
    router_health_interval: float = field(default=5.0, metadata=_help(
        "seconds between /health_generate checks of every engine"))
    router_health_timeout: float = field(default=10.0, metadata=_help(
        "seconds one /health_generate check may take before it counts as failed"))
    router_health_failures: int = field(default=3, metadata=_help(
        "consecutive failed health checks after which an engine is marked down"))
    router_load_interval: float = field(default=1.0, metadata=_help(
        "seconds between /v1/loads polls (load the engine has from other clients); 0 = only "
        "count the router's own in-flight requests"))
    router_request_retries: int = field(default=2, metadata=_help(
        "times a request is re-sent to another engine after a connection error"))
    router_request_timeout: float | None = field(default=None, metadata=_help(
        "seconds one /generate call to an engine may take (none = --engine-request-timeout)"))
    router_stream_generate: bool | None = field(default=None, metadata=_help(
        "stream each /generate from the engines (SGLang's stream: true) and take each output token's weight "
        "version from the chunk that reported it: exact per-token versions for requests that keep running across "
        "a weight update; none = when --weight-update-mode keeps them running (in_place, retract), since a stream "
        "costs the router 45-60 us of CPU per token on short answers, and SGLang's default chunks repeat every "
        "token so far (benchmarks/stream_overhead.py)"))
    router_no_engine_timeout: float = field(default=120.0, metadata=_help(
        "seconds a request waits for a healthy engine when all are down before it fails "
        "(waiting during a weight-sync pause is not limited)"))
    router_max_sessions: int = field(default=100_000, metadata=_help(
        "sessions remembered for affinity; the least recently used are forgotten beyond this"))
    router_abort_interval: float = field(default=0.5, metadata=_help(
        "pause(abort): seconds between repeated abort_all calls while requests still run"))
    # --- the HTTP front (SGLang /generate, OpenAI /v1/*): served in every run
    router_host: str = field(default="127.0.0.1", metadata=_help(
        "address the router's HTTP front binds (SGLang /generate and the OpenAI API)"))
    router_port: int = field(default=0, metadata=_help("port of the router's HTTP front; 0 = a free port"))
    router_api_key: str | None = field(default=None, metadata=_help(
        "key HTTP clients must send (Authorization: Bearer KEY); none = no check"))
    router_served_model_name: str | None = field(default=None, metadata=_help(
        "model name in /v1/models and answers (default: the model directory's name)"))
    router_tool_parser: ToolParserName = field(default="auto", metadata=_help(
        "how tool calls are parsed from completions: hermes (Qwen2.5/Qwen3 <tool_call>), llama3_json, none; "
        "auto picks by the chat template and model type"))
    router_chunk_tokens: int = field(default=16, metadata=_help(
        "with text stop strings or a streaming client, generate in requests of this many tokens: a stop string "
        "costs at most this many extra tokens, and stream chunks are this long"))
    router_front_concurrency: int = field(default=16, metadata=_help(
        "requests the HTTP front works on at once (parsing, chat rendering, tokenizing, decoding, building "
        "chunks); a request waiting for an engine or for its client to read does not count, so the engines' "
        "batches are not limited. Bounds the event loop's lag under many concurrent sessions (the loop runs at "
        "most this many requests' steps per round); 0 = no bound"))
    router_max_recorded_sessions: int = field(default=4096, metadata=_help(
        "sessions whose turns the front records for trajectory capture; the least recently used are "
        "forgotten beyond this (0 = record nothing)"))
    router_max_recorded_turns: int = field(default=1024, metadata=_help(
        "turns recorded per session; a longer trajectory fails when collected"))
    router_max_stored_responses: int = field(default=4096, metadata=_help(
        "responses (/v1/responses) whose conversation the front keeps for previous_response_id; the least "
        "recently used are forgotten beyond this (0 = keep none)"))

    def validate(self) -> None:
        checks = [
            (self.router_imbalance_threshold >= 0, "--router-imbalance-threshold must be >= 0"),
            (self.router_health_interval > 0, "--router-health-interval must be > 0"),
            (self.router_health_timeout > 0, "--router-health-timeout must be > 0"),
            (self.router_health_failures >= 1, "--router-health-failures must be >= 1"),
            (self.router_load_interval >= 0, "--router-load-interval must be >= 0"),
            (self.router_request_retries >= 0, "--router-request-retries must be >= 0"),
            (self.router_request_timeout is None or self.router_request_timeout > 0,
             "--router-request-timeout must be > 0 or none"),
            (self.router_no_engine_timeout > 0, "--router-no-engine-timeout must be > 0"),
            (self.router_max_sessions >= 1, "--router-max-sessions must be >= 1"),
            (self.router_abort_interval > 0, "--router-abort-interval must be > 0"),
            (0 <= self.router_port <= 65535, "--router-port must be in [0, 65535]"),
            (self.router_chunk_tokens >= 1, "--router-chunk-tokens must be >= 1"),
            (self.router_front_concurrency >= 0, "--router-front-concurrency must be >= 0"),
            (self.router_max_recorded_sessions >= 0, "--router-max-recorded-sessions must be >= 0"),
            (self.router_max_recorded_turns >= 1, "--router-max-recorded-turns must be >= 1"),
            (self.router_max_stored_responses >= 0, "--router-max-stored-responses must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message} (got {self._value_for(message)})")
        if self.router_tool_parser not in ("auto", "hermes", "llama3_json", "none"):
            raise ValueError(f"--router-tool-parser must be auto, hermes, llama3_json or none, "
                             f"got {self.router_tool_parser!r}")
        if self.router_policy not in ("sticky", "consistent_hash", "least_loaded", "round_robin"):
            raise ValueError(
                f"--router-policy must be sticky, consistent_hash, least_loaded or round_robin, "
                f"got {self.router_policy!r}"
            )

    def _value_for(self, message: str) -> object:
        flag = message.split()[0].lstrip("-").replace("-", "_")
        return getattr(self, flag)
