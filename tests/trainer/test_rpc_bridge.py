"""`slime_async.rpc.RpcBridge`: torch RPC awaited from asyncio, against a real peer process."""

from __future__ import annotations

import asyncio
import operator
import time

import pytest
import pytest_asyncio
from worker_fixtures import count_ticks_during, free_port, start_rpc_peer

from slime_async.rpc import RpcBridge, RpcError

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def bridge():
    init_method = f"tcp://127.0.0.1:{free_port()}"
    peer = start_rpc_peer(init_method)
    bridge = RpcBridge(init_method, world_size=2, start_timeout=60)
    try:
        await bridge.start()
        yield bridge
        await bridge.shutdown(graceful=False)
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.wait()


async def test_call_returns_the_remote_result(bridge):
    assert await bridge.call("peer", operator.add, 2, 3) == 5


async def test_a_remote_exception_fails_the_call_naming_the_worker_and_error(bridge):
    with pytest.raises(RpcError, match=r"(?s)on peer.*invalid literal"):
        await bridge.call("peer", int, "not a number")


async def test_the_event_loop_keeps_running_while_a_call_is_pending(bridge):
    _, ticks, finished_first = await count_ticks_during(bridge.call("peer", time.sleep, 0.5))
    assert finished_first, f"only {ticks} ticks before the call returned"


async def test_fail_pending_fails_outstanding_calls_at_once(bridge):
    pending = bridge.call("peer", time.sleep, 3)
    assert bridge.fail_pending(RuntimeError("peer declared dead")) == 1
    with pytest.raises(RuntimeError, match="peer declared dead"):
        await pending
    await asyncio.sleep(3.5)  # let the peer's sleep finish so its late reply is dropped quietly


async def test_calls_before_start_are_refused():
    unstarted = RpcBridge("tcp://127.0.0.1:1", world_size=2)
    with pytest.raises(RpcError, match="before the bridge started"):
        unstarted.call("peer", operator.add, 1, 2)
