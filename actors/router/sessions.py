"""The session table: session id -> engine holding its prefix cache, bounded LRU."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping


class SessionTable(Mapping[str, str]):
    """A read-only mapping for the routing policy plus ``bind``/``forget`` for the router.

    ``bound`` counts sessions per engine; routing uses it to spread new sessions. The table
    forgets the least recently used session beyond ``capacity`` so a long run that never
    calls ``forget`` (sessions of finished trajectories) stays bounded.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"session table capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._engine_of: OrderedDict[str, str] = OrderedDict()
        self.bound: Counter[str] = Counter()

    def __getitem__(self, session_id: str) -> str:
        return self._engine_of[session_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._engine_of)

    def __len__(self) -> int:
        return len(self._engine_of)

    def bind(self, session_id: str, engine: str) -> None:
        previous = self._engine_of.get(session_id)
        if previous is not None:
            self._engine_of.move_to_end(session_id)
            if previous == engine:
                return
            self.bound[previous] -= 1
        self._engine_of[session_id] = engine
        self.bound[engine] += 1
        if len(self._engine_of) > self.capacity:
            _, evicted_engine = self._engine_of.popitem(last=False)
            self.bound[evicted_engine] -= 1

    def forget(self, session_id: str) -> None:
        engine = self._engine_of.pop(session_id, None)
        if engine is not None:
            self.bound[engine] -= 1
