"""JSON in and out of the front's handlers, shared by every API's routes."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


async def read_json(request: web.Request, error: type[Exception]) -> Any:
    """The request's JSON body (None when empty); malformed JSON raises ``error`` (the API's own
    bad-request type, which the middleware answers in that API's format)."""
    raw = await request.read()
    try:
        return orjson.loads(raw) if raw.strip() else None
    except orjson.JSONDecodeError as failure:
        raise error(f"malformed JSON body: {failure}") from None
