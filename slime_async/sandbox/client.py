"""``RemoteSandbox``: the ``SandboxRunner`` interface over one or more ``slime-async sandbox-server``s.

Calls go round-robin over the hosts. A host that refuses the connection, times out or answers
5xx is skipped for ``down_s`` seconds and the call moves on to the next host; a 400 (bad
request) or 401 (wrong key) is the caller's error and is raised at once, without failing over.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from slime_async.sandbox.limits import RunResult


class SandboxUnavailable(RuntimeError):
    """No listed sandbox server could run the call."""


class RemoteSandbox:
    def __init__(self, urls: list[str], api_key: str | None = None, down_s: float = 5.0,
                 http_timeout_s: float = 300.0, connect_timeout_s: float = 5.0):
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("RemoteSandbox needs at least one sandbox server URL")
        self.urls = [url.rstrip("/") for url in urls]
        self.api_key = api_key
        self.down_s = down_s
        self.http_timeout_s = http_timeout_s  # per request when the call gives no timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._next = 0
        self._down_until: dict[str, float] = {}
        # A session belongs to one event loop; a caller may use this from several (threads).
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    async def __aenter__(self) -> "RemoteSandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Close this loop's session (and forget those of loops that are gone)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()
        for other in [other for other in self._sessions if other.is_closed()]:
            del self._sessions[other]

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            session = self._sessions[loop] = aiohttp.ClientSession(headers=headers)
        return session

    def _order(self) -> list[str]:
        """Hosts from the next one round-robin, those marked down last (they are still tried)."""
        start = self._next
        self._next = (self._next + 1) % len(self.urls)
        ordered = self.urls[start:] + self.urls[:start]
        now = time.monotonic()
        return [u for u in ordered if self._down_until.get(u, 0) <= now] + \
               [u for u in ordered if self._down_until.get(u, 0) > now]

    async def run(self, code: str, language: str = "python", stdin: str = "",
                  files: dict[str, str] | None = None, timeout_s: float | None = None) -> RunResult:
        session = self._session()
        body = {"language": language, "code": code, "stdin": stdin, "files": files, "timeout_s": timeout_s}
        # The server's own kill is the real deadline; this only catches a server that hangs.
        total = self.http_timeout_s if timeout_s is None else timeout_s + 30.0
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=self.connect_timeout_s)
        errors = []
        for url in self._order():
            try:
                async with session.post(f"{url}/run", json=body, timeout=timeout) as response:
                    status = response.status
                    if status == 200:
                        self._down_until.pop(url, None)
                        return RunResult(**await response.json())
                    message = await _error_message(response)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
                status, message = None, f"{type(error).__name__}: {error}"
            if status == 400:
                raise ValueError(f"sandbox server {url}: {message}")
            if status == 401:
                raise PermissionError(f"sandbox server {url}: {message}")
            errors.append(f"{url}: {message}" if status is None else f"{url}: HTTP {status}: {message}")
            self._down_until[url] = time.monotonic() + self.down_s
        raise SandboxUnavailable("no sandbox server could run the call: " + "; ".join(errors))


async def _error_message(response: aiohttp.ClientResponse) -> str:
    try:
        return (await response.json())["error"]
    except (aiohttp.ContentTypeError, ValueError, KeyError, TypeError):
        return (await response.text())[:500]
