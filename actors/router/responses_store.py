"""The conversations of the responses the front produced, for ``previous_response_id``, bounded.

A stored response keeps only its own request's input items and its output items, plus a
reference to the response it continued: the conversation a follow-up continues is the chain
walked back to its start, so a long multi-turn agent costs memory linear in its length. At most
``max_responses`` ids are kept (the least recently used are forgotten beyond that); a response
still continued by a kept one stays reachable through it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

EVICTED_IDS_KEPT = 4096  # to tell "forgotten" from "never stored" in errors


@dataclass
class StoredResponse:
    id: str
    session_id: str
    recorded: bool  # made in a client-named (recorded) session
    parent: StoredResponse | None
    input_items: list[dict[str, Any]]  # normalized (responses_protocol.input_items)
    output_items: list[dict[str, Any]]  # normalized the same way

    def conversation(self) -> list[dict[str, Any]]:
        """Every item from the first request of the chain through this response's output."""
        chain: list[StoredResponse] = []
        node: StoredResponse | None = self
        while node is not None:
            chain.append(node)
            node = node.parent
        return [item for node in reversed(chain) for item in node.input_items + node.output_items]


class ResponseStore:
    def __init__(self, max_responses: int):
        self.max_responses = max_responses
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, response: StoredResponse) -> None:
        if self.max_responses <= 0:
            return
        self._responses[response.id] = response
        while len(self._responses) > self.max_responses:
            evicted, _ = self._responses.popitem(last=False)
            self.evictions += 1
            self._evicted[evicted] = None
            if len(self._evicted) > EVICTED_IDS_KEPT:
                self._evicted.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        response = self._responses.get(response_id)
        if response is not None:
            self._responses.move_to_end(response_id)
        return response

    def was_evicted(self, response_id: str) -> bool:
        return response_id in self._evicted
