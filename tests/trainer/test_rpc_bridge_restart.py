"""A supervisor process can join a new RPC group after the previous one died (trainer restart).

Separate module from test_rpc_bridge.py: torch's RPC agent is process-wide, so these tests
must not overlap that module's long-lived group.
"""

from __future__ import annotations

import asyncio
import operator
import time

from worker_fixtures import free_port, start_rpc_peer

from slime_async.rpc import RpcBridge, RpcError


async def test_a_call_to_a_killed_peer_fails_instead_of_hanging_and_a_new_group_can_be_joined():
    for round_ in range(2):
        init_method = f"tcp://127.0.0.1:{free_port()}"
        peer = start_rpc_peer(init_method)
        bridge = RpcBridge(init_method, world_size=2, start_timeout=60)
        try:
            await bridge.start()
            assert await bridge.call("peer", operator.mul, 6, round_ + 1) == 6 * (round_ + 1)
            pending = bridge.call("peer", time.sleep, 60)
            peer.kill()
            async with asyncio.timeout(30):  # a guard against a hang, not a measurement
                try:
                    await pending
                except RpcError:
                    pass
                else:
                    raise AssertionError("a call to a killed peer returned normally")
        finally:
            await bridge.shutdown(graceful=False)
            if peer.poll() is None:
                peer.kill()
            peer.wait()
