"""``slime-async sandbox-server``: a ``Sandbox`` behind HTTP, so runs can happen on other machines.

    slime-async sandbox-server --host 127.0.0.1 --port 8123 [--api-key K] [--max-concurrency N]

``POST /run {language, code, stdin, files, timeout_s}`` answers
``{stdout, stderr, exit_code, timed_out, killed_reason, wall_s}``; ``GET /health`` answers the
isolation in use (``network_isolated``), the limits and how many runs are in flight. A bad
request is a 400 naming the field, a missing or wrong key a 401; whatever the code does, the
server keeps serving.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import sys
from dataclasses import fields

import orjson
from aiohttp import web

from slime_async.net import serve_until_signalled
from slime_async.runtime import run
from slime_async.sandbox.limits import SandboxLimits
from slime_async.sandbox.pool import Sandbox, SandboxError

log = logging.getLogger(__name__)

RUN_FIELDS = ("language", "code", "stdin", "files", "timeout_s")
LIMIT_HELP = {
    "timeout_s": "wall-clock seconds of a run that gives no timeout_s",
    "max_timeout_s": "the most timeout_s a call may ask for",
    "cpu_s": "RLIMIT_CPU seconds per process",
    "memory_bytes": "RLIMIT_AS per process",
    "run_memory_bytes": "memory of all of a run's processes together (a memory cgroup per run, where available)",
    "file_bytes": "RLIMIT_FSIZE: the largest file a run may write",
    "workdir_bytes": "size of the run's tmpfs working directory",
    "processes": "processes a run may have at once; reaching it ends the run",
    "open_files": "RLIMIT_NOFILE",
    "output_bytes": "bytes kept of stdout and of stderr; more ends the run",
    "max_code_bytes": "largest code accepted",
    "max_input_bytes": "largest stdin plus files accepted",
    "python": "interpreter for language=python ('' = this one)",
    "uid_base": "as root, pool slot i runs as uid/gid UID_BASE+i",
    "hidden_paths": "directories the code sees empty (task answers, the repository); the interpreter stays visible",
}


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def build_app(sandbox: Sandbox, api_key: str | None = None) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return _json({"status": "ok", **sandbox.describe()})

    async def run(request: web.Request) -> web.Response:
        if api_key is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _json({"error": "missing or wrong API key (send Authorization: Bearer KEY)"}, 401)
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as error:
            return _json({"error": f"the body must be a JSON object: {error}"}, 400)
        if not isinstance(body, dict):
            return _json({"error": "the body must be a JSON object"}, 400)
        unknown = sorted(set(body) - set(RUN_FIELDS))
        if unknown:
            return _json({"error": f"unknown field {unknown[0]!r}; fields are {', '.join(RUN_FIELDS)}"}, 400)
        if "code" not in body:
            return _json({"error": "missing field 'code'"}, 400)
        try:
            result = await sandbox.run(body["code"], language=body.get("language", "python"),
                                       stdin=body.get("stdin") or "", files=body.get("files"),
                                       timeout_s=body.get("timeout_s"))
        except ValueError as error:
            return _json({"error": str(error)}, 400)
        except SandboxError as error:
            log.error("sandbox failure: %s", error)
            return _json({"error": f"sandbox failure: {error}"}, 500)
        return _json(result.to_dict())

    app = web.Application(client_max_size=sandbox.limits.max_code_bytes + sandbox.limits.max_input_bytes + (1 << 20))
    app.router.add_get("/health", health)
    app.router.add_post("/run", run)
    return app


def parse_args(argv: list[str]) -> argparse.Namespace:
    defaults = SandboxLimits()
    parser = argparse.ArgumentParser(prog="slime-async sandbox-server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123, help="0 = a free port (printed at start)")
    parser.add_argument("--api-key", default=None, help="key clients must send (Authorization: Bearer KEY)")
    parser.add_argument("--max-concurrency", type=int, default=4, help="runs at once; more calls wait")
    parser.add_argument("--log-level", default="info")
    limits = parser.add_argument_group("limits (per run)")
    for field in fields(SandboxLimits):
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        if isinstance(default, tuple):
            limits.add_argument(flag, dest=field.name, nargs="+", default=default, metavar="DIR",
                                help=LIMIT_HELP[field.name])
            continue
        limits.add_argument(flag, dest=field.name, type=type(default), default=default,
                            help=f"{LIMIT_HELP[field.name]} (default {default!r})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    values = {field.name: getattr(args, field.name) for field in fields(SandboxLimits)}
    limits = SandboxLimits(**{**values, "hidden_paths": tuple(values["hidden_paths"])})
    try:
        sandbox = Sandbox(limits, max_concurrency=args.max_concurrency)
    except ValueError as error:
        print(f"slime-async sandbox-server: error: {error}", file=sys.stderr)
        return 2

    log.info("sandbox: max_concurrency=%d, isolation: %s, limits: %s", args.max_concurrency,
             sandbox.isolation.detail, limits)

    async def serve() -> None:
        runner = web.AppRunner(build_app(sandbox, args.api_key), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = runner.addresses[0][1]
        # Tests and scripts read this line to learn the URL (with --port 0).
        print(f"sandbox server listening on http://{args.host}:{port} "
              f"(network_isolated={str(sandbox.isolation.network_isolated).lower()})", flush=True)
        await serve_until_signalled(runner)

    async def main_coroutine() -> int:
        await serve()
        return 0

    return run(main_coroutine)
