"""``slime-async router``: the router and its HTTP front over engines that are already running.

    slime-async router --engine-url http://127.0.0.1:30000 [URL ...] --model-path DIR --port 8000

serves SGLang's ``/generate`` and the OpenAI API (``/v1/chat/completions``, ``/v1/responses``,
``/v1/completions``, ``/v1/models``) with session affinity over the engines, until SIGINT/SIGTERM. The engines are
never started or stopped here. Nothing is recorded unless ``--max-recorded-sessions`` is set
(a standalone router has no trainer to collect trajectories).
"""

from __future__ import annotations

import argparse
import logging
import sys

from actors.router.actor import RouterActor
from actors.router.config import RouterConfig
from actors.router.text_model import TextModel
from slime_async.actor import spawn
from slime_async.runtime import run, run_supervised
from slime_async.supervisor import ChildSpec, Supervisor


def parse_args(argv: list[str]) -> argparse.Namespace:
    defaults = RouterConfig()
    parser = argparse.ArgumentParser(prog="slime-async router", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-url", nargs="+", required=True, metavar="URL",
                        help="engines speaking SGLang's API (SGLang servers, `slime-async serve-engine`)")
    parser.add_argument("--model-path", required=True, help="HF model directory: tokenizer, chat template, config")
    parser.add_argument("--host", default=defaults.router_host)
    parser.add_argument("--port", type=int, default=8000, help="0 = a free port (printed at start)")
    parser.add_argument("--api-key", default=None, help="key clients must send (Authorization: Bearer KEY)")
    parser.add_argument("--engine-api-key", default=None, help="key the engines expect")
    parser.add_argument("--policy", default=defaults.router_policy,
                        choices=["sticky", "consistent_hash", "least_loaded", "round_robin"])
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tool-parser", default=defaults.router_tool_parser,
                        choices=["auto", "hermes", "llama3_json", "none"])
    parser.add_argument("--chunk-tokens", type=int, default=defaults.router_chunk_tokens,
                        help="tokens per engine request while honouring text stop strings or streaming")
    parser.add_argument("--front-concurrency", type=int, default=defaults.router_front_concurrency,
                        help="requests the front works on at once; waits for engines and clients do not count "
                             "(0 = no bound)")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds per engine request")
    parser.add_argument("--max-recorded-sessions", type=int, default=0)
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = RouterConfig(router_policy=args.policy, router_host=args.host, router_port=args.port,
                          router_api_key=args.api_key, router_served_model_name=args.served_model_name,
                          router_tool_parser=args.tool_parser, router_chunk_tokens=args.chunk_tokens,
                          router_front_concurrency=args.front_concurrency,
                          router_request_timeout=args.request_timeout,
                          router_max_recorded_sessions=args.max_recorded_sessions)
    try:
        config.validate()
        model = TextModel.load(args.model_path, served_name=args.served_model_name, tool_parser=args.tool_parser)
    except (ValueError, OSError) as error:
        print(f"slime-async router: error: {error}", file=sys.stderr)
        return 2

    async def start():
        ref = await spawn(RouterActor(config, args.engine_url, api_key=args.engine_api_key, model=model))
        # Tests and scripts read this line to learn the URL (with --port 0).
        print(f"router listening on {await ref.ask('front_url')}", flush=True)
        return ref

    root = Supervisor("slime-async-router", [ChildSpec("router", start)], max_restarts=0, max_seconds=1)
    return run(lambda: run_supervised(root))
