"""The front's gate (actors/router/front_gate.py): at most ``limit`` requests at work at once, and a
request that waits (for an engine, for its client) gives its slot to the next one."""

import asyncio

import pytest

from actors.router.front_gate import FrontGate, waiting


class Requests:
    """Handlers that record how many of them are at work at once, and wait on demand."""

    def __init__(self) -> None:
        self.working = 0
        self.most = 0
        self.started: list[int] = []
        self.engine = asyncio.Event()  # set: every "engine request" answers

    async def handler(self, index: int, ask_engine: bool) -> int:
        self.started.append(index)
        self.working += 1
        self.most = max(self.most, self.working)
        await asyncio.sleep(0)  # work that spans loop rounds
        if ask_engine:
            self.working -= 1
            async with waiting():
                await self.engine.wait()
            self.working += 1
        await asyncio.sleep(0)
        self.working -= 1
        return index


async def test_no_more_than_the_limit_work_at_once_and_all_are_answered():
    gate, requests = FrontGate(2), Requests()
    results = await asyncio.gather(*(gate.run(lambda i=i: requests.handler(i, False)) for i in range(6)))
    assert results == list(range(6)) and requests.most == 2 and requests.started == list(range(6))


async def test_a_request_waiting_for_its_engine_frees_its_slot_for_the_next():
    gate, requests = FrontGate(1), Requests()
    tasks = [asyncio.create_task(gate.run(lambda i=i: requests.handler(i, True))) for i in range(3)]
    while len(requests.started) < 3:  # each waits for the engine without holding the one slot
        await asyncio.sleep(0)
    requests.engine.set()
    assert await asyncio.gather(*tasks) == [0, 1, 2] and requests.most == 1


async def test_a_cancelled_request_gives_its_slot_back():
    gate, requests = FrontGate(1), Requests()
    first = asyncio.create_task(gate.run(lambda: requests.handler(0, True)))
    while not requests.started:
        await asyncio.sleep(0)
    first.cancel()  # cancelled while it waits for the engine (a client that hung up)
    with pytest.raises(asyncio.CancelledError):
        await first
    requests.engine.set()
    assert await gate.run(lambda: requests.handler(1, False)) == 1


async def test_no_limit_and_no_request_wait_for_nothing():
    async with waiting():  # outside any request (the rollout's own engine calls): a no-op
        pass
    assert await FrontGate(0).run(lambda: asyncio.sleep(0, result="done")) == "done"
    with pytest.raises(ValueError, match="--router-front-concurrency"):
        FrontGate(-1)
