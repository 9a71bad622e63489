"""The actor contract: one message at a time, ask/tell, owned tasks, clear errors."""

import asyncio

import pytest

from slime_async.actor import Actor, ActorFailed, ActorStopped, spawn
from slime_async.runtime import run


class Counter(Actor):
    def __init__(self):
        super().__init__("counter")
        self.value = 0
        self.concurrent = 0
        self.max_concurrent = 0
        self.stopped = False

    async def add(self, amount: int) -> int:
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        await asyncio.sleep(0.001)  # yield: another message must still wait its turn
        self.value += amount
        self.concurrent -= 1
        return self.value

    def explode(self) -> None:
        raise ValueError("bad input 42")

    def slow_echo(self, value):
        async def later():
            await asyncio.sleep(0.05)
            return value

        return self.defer(later())

    def start_background(self, started: asyncio.Event) -> None:
        async def forever():
            started.set()
            await asyncio.sleep(3600)

        self.background = self.spawn(forever())

    def crash_in_background(self) -> None:
        async def crash():
            raise RuntimeError("owned task broke")

        self.spawn(crash())

    async def on_stop(self) -> None:
        self.stopped = True


def both_loops(test):
    """Run an async test body on uvloop and on the stock asyncio loop."""
    return pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])(test)


@both_loops
def test_messages_are_processed_one_at_a_time(use_uvloop):
    async def body():
        ref = await spawn(Counter())
        results = await asyncio.gather(*(ref.ask("add", 1) for _ in range(20)))
        assert sorted(results) == list(range(1, 21))
        assert ref.actor.max_concurrent == 1
        await ref.stop()
        return 0

    assert run(body, use_uvloop=use_uvloop) == 0


@both_loops
def test_ask_raises_the_handlers_exception_and_the_actor_survives(use_uvloop):
    async def body():
        ref = await spawn(Counter())
        with pytest.raises(ValueError, match="bad input 42"):
            await ref.ask("explode")
        assert await ref.ask("add", 2) == 2
        await ref.stop()
        return 0

    run(body, use_uvloop=use_uvloop)


@both_loops
def test_tell_failure_fails_the_actor(use_uvloop):
    async def body():
        ref = await spawn(Counter())
        ref.tell("explode")
        with pytest.raises(ActorFailed, match="bad input 42"):
            await ref.wait()
        assert ref.actor.stopped
        return 0

    run(body, use_uvloop=use_uvloop)


def test_ask_to_a_stopped_actor_raises_a_clear_error():
    async def body():
        ref = await spawn(Counter())
        await ref.stop()
        with pytest.raises(ActorStopped, match="actor 'counter' is not running .*'add'"):
            await ref.ask("add", 1)
        with pytest.raises(ActorStopped):
            ref.tell("add", 1)
        return 0

    run(body)


def test_ask_times_out_with_the_actor_and_method_named():
    class Sleepy(Actor):
        async def nap(self):
            await asyncio.sleep(10)

    async def body():
        ref = await spawn(Sleepy("sleepy"))
        with pytest.raises(TimeoutError, match="sleepy.nap .* 0.05 s"):
            await ref.ask("nap", timeout=0.05)
        await ref.stop()
        return 0

    run(body)


def test_deferred_reply_does_not_hold_the_mailbox():
    async def body():
        ref = await spawn(Counter())
        slow = asyncio.ensure_future(ref.ask("slow_echo", "late"))
        assert await ref.ask("add", 5) == 5  # answered while slow_echo is still sleeping
        assert not slow.done()
        assert await slow == "late"
        await ref.stop()
        return 0

    run(body)


def test_owned_tasks_are_cancelled_on_stop():
    async def body():
        ref = await spawn(Counter())
        started = asyncio.Event()
        await ref.ask("start_background", started)
        await started.wait()
        await ref.stop()
        assert ref.actor.background.cancelled()
        return 0

    run(body)


def test_a_failing_owned_task_fails_the_actor():
    async def body():
        ref = await spawn(Counter())
        await ref.ask("crash_in_background")
        with pytest.raises(ActorFailed, match="owned task broke"):
            await ref.wait()
        return 0

    run(body)


def test_unknown_handler_is_rejected_at_the_call_site():
    async def body():
        ref = await spawn(Counter())
        with pytest.raises(AttributeError, match="has no handler 'nope'"):
            await ref.ask("nope")
        await ref.stop()
        return 0

    run(body)
