"""slime_async.limiter.Limiter: a semaphore whose limit follows the engines' capacity."""

import asyncio

import pytest

from slime_async.limiter import Limiter


async def test_holders_never_exceed_the_limit_and_waiters_get_in_as_slots_free():
    limiter = Limiter(2)
    await limiter.acquire()
    await limiter.acquire()
    third = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert not third.done() and limiter.held == 2
    limiter.release()
    await third
    assert limiter.held == 2


async def test_growing_the_limit_lets_waiters_in_at_once_and_shrinking_takes_no_slot_away():
    limiter = Limiter(1)
    await limiter.acquire()
    waiters = [asyncio.ensure_future(limiter.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    limiter.resize(3)
    await asyncio.gather(*waiters)
    assert limiter.held == 3
    limiter.resize(1)  # three holders stay; nobody new until fewer than one is held
    late = asyncio.ensure_future(limiter.acquire())
    limiter.release()
    limiter.release()
    await asyncio.sleep(0)
    assert not late.done()
    limiter.release()
    await late
    assert limiter.held == 1


async def test_a_waiter_cancelled_before_its_turn_leaves_no_slot_taken():
    limiter = Limiter(1)
    await limiter.acquire()
    waiter = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    limiter.release()
    assert limiter.held == 0


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match=">= 1"):
        Limiter(0)
