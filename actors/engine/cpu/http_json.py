"""JSON in and out of the CPU engine's routes, shaped as SGLang's http_server shapes them.

Bad input is answered with HTTP 400 and ``{"error": {"message": ...}}``; the weight routes answer
``{"success": false, "message": ...}`` instead, as SGLang's do.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from actors.engine.cpu.protocol import BadRequest


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def error_response(message: str, status: int = 400) -> web.Response:
    return json_response({"error": {"message": message}}, status=status)


async def read_json(request: web.Request, allow_empty: bool = False) -> Any:
    raw = await request.read()
    if not raw.strip():
        if allow_empty:
            return None
        raise BadRequest("request body is empty; expected JSON")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from exc


def require(body: Any, key: str, kind: type) -> Any:
    if not isinstance(body, dict) or key not in body:
        raise BadRequest(f"missing required field {key!r}")
    value = body[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {key!r} must be {kind.__name__}, got {value!r}")
    return value
