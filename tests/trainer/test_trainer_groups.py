"""The trainer's torchrun groups as children of a supervisor, with stand-ins: each torchrun is a
small Python program that records when it is stopped, each rank a sleeping process, and the RPC
bridge a fake (no torch RPC, so these run in a second each). What is checked is the supervision:
start order and reverse stop, a group that dies while the ranks join, a rank killed mid-op, the
report of torchrun's root cause, and the fan-out of one op to a group's ranks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import actors.trainer.actor as trainer_actor
import actors.trainer.torchrun as torchrun
from actors.trainer.actor import TrainerActor
from actors.trainer.torchrun import TorchrunGroup, TrainerRankDied
from actors.megatron.config import TrainerConfig
from actors.megatron.protocol import RankInfo, TrainerOpError
from slime_async.actor import ActorFailed, spawn
from slime_async.cluster.nodes import LocalNode
from slime_async.process import ProcessChild, ProcessSpec
from slime_async.rpc import RpcError

PY = sys.executable

# A torchrun stand-in. On SIGTERM it appends its name to $FAKE_RECORD (and, with $FAKE_RELEASE,
# waits for that file before exiting). With $FAKE_EXIT_AFTER (names, comma-separated) it waits
# until those stand-ins are ready, prints $FAKE_SUMMARY and exits 1: a torchrun whose rank failed.
FAKE_TORCHRUN = r"""
import os, signal, sys, time
name, folder = os.environ["FAKE_NAME"], os.environ["FAKE_DIR"]

def stopped(*_):
    with open(os.environ["FAKE_RECORD"], "a") as record:
        record.write(name + "\n")
    release = os.environ.get("FAKE_RELEASE")
    while release and not os.path.exists(release):
        time.sleep(0.02)
    sys.exit(0)

signal.signal(signal.SIGTERM, stopped)
open(os.path.join(folder, name + ".ready"), "w").close()
if "FAKE_EXIT_AFTER" in os.environ:
    others = [n for n in os.environ["FAKE_EXIT_AFTER"].split(",") if n]
    while not all(os.path.exists(os.path.join(folder, n + ".ready")) for n in others):
        time.sleep(0.02)
    print(os.environ.get("FAKE_SUMMARY", "a rank failed"), flush=True)
    sys.exit(1)
while True:
    time.sleep(60)
"""

SLEEPS = "import time; time.sleep(600)"


def root_cause_summary(rank: int) -> str:
    """The failure summary torchrun prints when a rank fails (torch.distributed.elastic)."""
    return (f"Root Cause (first observed failure):\n[0]:\n  time      : 2025-01-01_00:00:00\n  host      : box\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : -9 (pid: 1234)")


def info(rank: int, pid: int, ranks: int) -> RankInfo:
    return RankInfo(rank=rank, world_size=ranks, pid=pid, dp_rank=rank, dp_size=ranks, tp_rank=0, tp_size=1,
                    pp_rank=0, pp_size=1)


class FakeBridge:
    """RpcBridge's surface: ``info`` answers with the stand-in ranks, other calls stay pending
    until the test settles them (``pending``); ``joins=False``: the ranks never join."""

    def __init__(self, infos: dict[str, RankInfo], joins: bool = True):
        self.infos, self.joins = infos, joins
        self.pending: list[tuple[str, str, asyncio.Future]] = []
        self.calls_made = asyncio.Event()

    async def start(self) -> None:
        if not self.joins:
            await asyncio.Event().wait()

    def call(self, to, fn, op, *args, timeout=0.0, **kwargs) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if op == "info":
            future.set_result(self.infos[to])
        else:
            self.pending.append((to, op, future))
            self.calls_made.set()
        return future

    def fail_pending(self, error: BaseException) -> int:
        waiting = [future for _, _, future in self.pending if not future.done()]
        for future in waiting:
            future.set_exception(error)
        return len(waiting)

    async def shutdown(self, graceful: bool = False) -> None:
        pass


@dataclasses.dataclass
class StandIns:
    folder: Path
    record: Path
    behaviour: dict[str, dict[str, str]]  # torchrun name -> extra environment
    pids: dict[str, int] = dataclasses.field(default_factory=dict)

    def stopped(self) -> list[str]:
        """The stand-ins that got SIGTERM, in the order they got it."""
        return self.record.read_text().split() if self.record.exists() else []


@pytest.fixture
def stand_ins(tmp_path, monkeypatch) -> StandIns:
    """Every torchrun TrainerActor starts is the stand-in (its real spec's name and config file)."""
    found = StandIns(tmp_path / "stand-ins", tmp_path / "stopped.txt", {})
    found.folder.mkdir()
    real_spec = TrainerActor._spec

    def spec(self, *args, **kwargs) -> ProcessSpec:
        real = real_spec(self, *args, **kwargs)
        config = real.argv[real.argv.index("--config-json") + 1]
        env = {"FAKE_NAME": real.name, "FAKE_DIR": str(found.folder), "FAKE_RECORD": str(found.record),
               **found.behaviour.get(real.name, {})}
        return dataclasses.replace(real, argv=[PY, "-c", FAKE_TORCHRUN, "--config-json", config], env=env,
                                   stop_timeout=30.0)

    monkeypatch.setattr(TrainerActor, "_spec", spec)
    # The stand-ins never write a summary: the groups wait for one briefly.
    monkeypatch.setattr(torchrun, "DEATH_REPORT_GRACE", 0.3)
    return found


@pytest.fixture
def ranks():
    """Sleeping processes standing in for ranks: ``ranks(n)`` starts n of them."""
    started: list[subprocess.Popen] = []

    def start(count: int) -> list[subprocess.Popen]:
        new = [subprocess.Popen([PY, "-c", SLEEPS]) for _ in range(count)]
        started.extend(new)
        return new

    yield start
    for process in started:
        process.kill()
        process.wait()


def use_bridge(monkeypatch, bridge: FakeBridge) -> None:
    monkeypatch.setattr(trainer_actor, "RpcBridge", lambda *args, **kwargs: bridge)


def config(**overrides) -> TrainerConfig:
    return TrainerConfig(hf_checkpoint="base", micro_batch_size=1, **overrides)


async def test_a_group_that_dies_while_the_ranks_join_fails_the_start_and_stops_those_before_it_in_reverse(
        tmp_path, stand_ins, monkeypatch):
    # Three groups, started in this order: node 0's torchrun, node 1's, the critic's.
    # The critic's dies once the two others are up; the ranks never join.
    stand_ins.behaviour["trainer-critic-torchrun"] = {"FAKE_EXIT_AFTER": "trainer-torchrun,trainer-torchrun-node1",
                                                      "FAKE_SUMMARY": "the critic's torchrun gives up"}
    use_bridge(monkeypatch, FakeBridge({}, joins=False))
    second = LocalNode()
    second.rank = 1
    trainer = TrainerActor(config(actor_num_nodes=2), tmp_path / "logs", critic=config(), nodes=[LocalNode(), second])
    async with asyncio.timeout(60):  # a hang guard: the start fails as soon as the critic's torchrun exits
        with pytest.raises(TrainerRankDied) as raised:
            await spawn(trainer)
    death = raised.value
    assert death.group == "critic" and death.rank is None
    assert "the critic (torchrun) died: torchrun exited with code 1" in str(death)
    assert "trainer-critic-torchrun.log" in str(death) and "the critic's torchrun gives up" in str(death)
    assert stand_ins.stopped() == ["trainer-torchrun-node1", "trainer-torchrun"]


async def test_a_rank_killed_mid_op_fails_the_pending_op_at_once_and_the_trainer_once_the_other_groups_stopped(
        tmp_path, stand_ins, ranks, monkeypatch):
    policy_ranks, critic_ranks = ranks(2), ranks(1)
    use_bridge(monkeypatch, FakeBridge({
        "trainer0": info(0, policy_ranks[0].pid, 2), "trainer1": info(1, policy_ranks[1].pid, 2),
        "critic0": info(0, critic_ranks[0].pid, 1)}))
    # The critic's torchrun stops only when told to: the pending op must fail before it has stopped.
    release = tmp_path / "release"
    stand_ins.behaviour["trainer-critic-torchrun"] = {"FAKE_RELEASE": str(release)}
    trainer = await spawn(TrainerActor(config(actor_num_procs=2), tmp_path / "logs", critic=config()))
    try:
        async with asyncio.timeout(60):
            pending = asyncio.get_running_loop().create_task(trainer.ask("save", str(tmp_path / "ckpt"), timeout=None))
            await trainer.actor.bridge.calls_made.wait()
            os.kill(policy_ranks[1].pid, signal.SIGKILL)
            with pytest.raises(TrainerRankDied) as raised:
                await pending
            death = raised.value
            assert (death.group, death.rank, death.pid) == ("trainer", 1, policy_ranks[1].pid)
            assert "trainer rank 1" in str(death) and "trainer-torchrun.log" in str(death)
            release.touch()
            with pytest.raises(ActorFailed) as failed:
                await trainer.wait()
    finally:
        release.touch()
        await trainer.stop()
    assert failed.value.error is death
    # The dead group first (its own stop), then the others in reverse start order.
    assert stand_ins.stopped() == ["trainer-torchrun", "trainer-critic-torchrun"]


async def test_the_report_names_the_rank_torchruns_summary_names_first(tmp_path, ranks):
    # Both ranks are dead by the time torchrun exits; its summary says which failed first.
    dead = ranks(2)
    for process in dead:
        process.kill()
        process.wait()
    spec = ProcessSpec("trainer-torchrun", [PY, "-c", f"print({root_cause_summary(1)!r}); raise SystemExit(1)"])
    reports = []
    group = await spawn(TorchrunGroup(ProcessChild(spec, tmp_path), "trainer",
                                       lambda: [info(0, dead[0].pid, 2), info(1, dead[1].pid, 2)], reports.append))
    async with asyncio.timeout(30):
        with pytest.raises(ActorFailed) as failed:
            await group.wait()
    death = failed.value.error
    assert reports == [death] and isinstance(death, TrainerRankDied)
    assert (death.rank, death.pid) == (1, dead[1].pid)
    assert "torchrun exited with code 1" in str(death)


# ----- the fan-out: one op to every rank of a group --------------------------------------------------


async def _sent(bridge: FakeBridge, count: int) -> None:
    """Until ``count`` calls are pending (the fan-out's tasks run on the next loop turns)."""
    while len(bridge.pending) < count:
        await asyncio.sleep(0)


async def test_an_op_that_fails_on_one_rank_cancels_its_calls_to_the_others(tmp_path, monkeypatch):
    trainer = TrainerActor(config(actor_num_procs=3), tmp_path)
    trainer.bridge = bridge = FakeBridge({})
    op = asyncio.get_running_loop().create_task(trainer._all("save", "ckpt"))
    await _sent(bridge, 3)
    (_, _, first), (_, _, second), (_, _, third) = bridge.pending
    second.set_exception(TrainerOpError("trainer rank 1: save failed"))
    with pytest.raises(TrainerOpError, match="rank 1"):
        await op
    assert first.cancelled() and third.cancelled()
    assert [to for to, _, _ in bridge.pending] == ["trainer0", "trainer1", "trainer2"]


async def test_a_transport_error_becomes_the_report_of_the_rank_that_died(tmp_path):
    trainer = TrainerActor(config(actor_num_procs=2), tmp_path)
    trainer.bridge = bridge = FakeBridge({})
    op = asyncio.get_running_loop().create_task(trainer._all("save", "ckpt"))
    await _sent(bridge, 2)
    (_, _, first), (_, _, second) = bridge.pending
    second.set_exception(RpcError("RPC call on trainer1: eof"))  # the transport noticed first
    while not first.cancelled():
        await asyncio.sleep(0)
    death = TrainerRankDied(1, 4321, tmp_path / "trainer-torchrun.log", "(tail)")
    trainer._report_death(death)  # the group's watch, a moment later
    with pytest.raises(TrainerRankDied) as raised:
        await op
    assert raised.value is death and isinstance(raised.value.__context__, RpcError)
