"""Engines that refuse a weight update: how often each is retried, and when to give up on it.

An engine refuses when it answers ``success: false`` (or an error status): a checkpoint whose
tensor names or shapes its loader asserts on (it serves another model), a version it rejects.
Unlike a dead engine, which comes back with a restart, a refusing one refuses the same weights
again, so one version is tried ``ATTEMPTS`` times per engine (the sync's own try, then retries
after ``backoff``), and then the engine stays out until the next version is tried on it.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTEMPTS = 3  # tries of one version on one engine, the sync's included
FIRST_BACKOFF_S = 1.0  # before the second try; doubled before each further one


def backoff(refusals: int) -> float:
    """Seconds to wait after the ``refusals``-th refusal before the next try (1 s, 2 s, 4 s, ...)."""
    return FIRST_BACKOFF_S * 2 ** (refusals - 1)


@dataclass
class _Refusal:
    version: int
    count: int
    message: str
    at: float  # monotonic seconds of the last refusal


class Refusals:
    """Per engine, its refusals of the latest version tried on it; ``total`` counts every refusal."""

    def __init__(self) -> None:
        self._by_url: dict[str, _Refusal] = {}
        self.total = 0

    def record(self, url: str, version: int, message: str, now: float) -> int:
        """One more refusal of ``version`` by ``url``; returns how many it has refused of it."""
        seen = self._by_url.get(url)
        count = seen.count + 1 if seen is not None and seen.version == version else 1
        self._by_url[url] = _Refusal(version, count, message, now)
        self.total += 1
        return count

    def accepted(self, url: str) -> None:
        self._by_url.pop(url, None)

    def refused(self, url: str, version: int) -> bool:
        seen = self._by_url.get(url)
        return seen is not None and seen.version == version

    def exhausted(self, url: str, version: int) -> bool:
        """Tried ``ATTEMPTS`` times at ``version``: not again before the next version."""
        seen = self._by_url.get(url)
        return seen is not None and seen.version == version and seen.count >= ATTEMPTS

    def due(self, url: str, version: int, now: float) -> bool:
        """Whether ``url`` may be tried at ``version`` now: never refused it, or its backoff is over
        and it has tries left."""
        seen = self._by_url.get(url)
        if seen is None or seen.version != version:
            return True
        return seen.count < ATTEMPTS and now >= seen.at + backoff(seen.count)

    def wait(self, url: str, version: int, now: float) -> float:
        """Seconds until ``url`` is due at ``version`` (0 when due or never refused it)."""
        seen = self._by_url.get(url)
        if seen is None or seen.version != version:
            return 0.0
        return max(0.0, seen.at + backoff(seen.count) - now)

    def holding_out(self, version: int) -> int:
        """Engines that refused ``version`` as often as they are tried: out until the next one."""
        return sum(self.exhausted(url, version) for url in self._by_url)

    def describe(self, urls: list[str], version: int) -> str:
        """``URL refused it N time(s): MESSAGE`` for each of ``urls`` that refused ``version``."""
        return "; ".join(f"{url} refused it {seen.count} time(s): {seen.message}" for url in urls
                         if (seen := self._by_url.get(url)) is not None and seen.version == version)
