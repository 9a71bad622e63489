"""Supervision with real OS processes: restarts, strategies, intensity, readiness, signals."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from slime_async.actor import ActorFailed, spawn
from slime_async.process import ProcessChild, ProcessSpec, ReadinessTimeout, http_ready
from slime_async.runtime import run
from slime_async.supervisor import ChildSpec, Restart, Strategy, Supervisor, SupervisorGaveUp
from tests.runtime.processes import alive

PY = sys.executable
HERE = Path(__file__).parent
REPO = HERE.parent.parent


def process_child(name, code, log_dir, starts=None, restart=Restart.PERMANENT, **spec_kwargs):
    async def start():
        if starts is not None:
            starts.append(name)
        return await spawn(ProcessChild(ProcessSpec(name, [PY, "-c", code], stop_timeout=1.0, **spec_kwargs), log_dir))

    return ChildSpec(name, start, restart)


SLEEPS = "import time; time.sleep(600)"
CRASHES_SOON = "import time, sys; time.sleep(0.2); sys.exit(3)"
EXITS_CLEANLY = "import time; time.sleep(0.2)"


async def wait_until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def test_a_crashing_permanent_child_is_restarted(tmp_path):
    starts = []

    async def body():
        sup = Supervisor("sup", [process_child("crashy", CRASHES_SOON, tmp_path, starts)], max_restarts=10, max_seconds=60)
        ref = await spawn(sup)
        await wait_until(lambda: len(starts) >= 3)
        await ref.stop()
        return 0

    run(body)
    assert starts.count("crashy") >= 3


def test_a_transient_child_that_exits_0_is_not_restarted(tmp_path):
    starts = []

    async def body():
        sup = Supervisor("sup", [process_child("once", EXITS_CLEANLY, tmp_path, starts, Restart.TRANSIENT)])
        ref = await spawn(sup)
        await wait_until(lambda: "once" not in sup._live)
        await asyncio.sleep(0.5)
        assert ref.alive
        await ref.stop()
        return 0

    run(body)
    assert starts == ["once"]


def test_a_transient_child_that_crashes_is_restarted(tmp_path):
    starts = []

    async def body():
        sup = Supervisor("sup", [process_child("flaky", CRASHES_SOON, tmp_path, starts, Restart.TRANSIENT)], max_restarts=10)
        ref = await spawn(sup)
        await wait_until(lambda: len(starts) >= 2)
        await ref.stop()
        return 0

    run(body)


def test_exceeding_the_intensity_stops_everything_and_names_the_child(tmp_path):
    async def body():
        sup = Supervisor("sup", [
            process_child("steady", SLEEPS, tmp_path),
            process_child("crashy", CRASHES_SOON, tmp_path),
        ], max_restarts=2, max_seconds=60)
        ref = await spawn(sup)
        steady_pid = sup.child("steady").actor.pid
        with pytest.raises(ActorFailed) as failure:
            await ref.wait()
        error = failure.value.error
        assert isinstance(error, SupervisorGaveUp)
        assert error.child == "crashy" and "exited with code 3" in str(error)
        assert not psutil.pid_exists(steady_pid) or psutil.Process(steady_pid).status() == psutil.STATUS_ZOMBIE
        return 0

    run(body)


def test_rest_for_one_restarts_the_children_started_after_the_failed_one(tmp_path):
    starts = []
    marker = tmp_path / "crash-once"
    marker.write_text("")
    crash_once = f"import os, sys, time; p={str(marker)!r}\nif os.path.exists(p): os.remove(p); time.sleep(0.3); sys.exit(1)\ntime.sleep(600)"

    async def body():
        sup = Supervisor("sup", [
            process_child("first", SLEEPS, tmp_path, starts),
            process_child("middle", crash_once, tmp_path, starts),
            process_child("last", SLEEPS, tmp_path, starts),
        ], strategy=Strategy.REST_FOR_ONE)
        ref = await spawn(sup)
        await wait_until(lambda: len(starts) == 5)
        await asyncio.sleep(0.3)
        await ref.stop()
        return 0

    run(body)
    assert starts == ["first", "middle", "last", "middle", "last"]


def test_one_for_one_restarts_only_the_failed_child(tmp_path):
    starts = []
    marker = tmp_path / "crash-once"
    marker.write_text("")
    crash_once = f"import os, sys, time; p={str(marker)!r}\nif os.path.exists(p): os.remove(p); time.sleep(0.3); sys.exit(1)\ntime.sleep(600)"

    async def body():
        sup = Supervisor("sup", [
            process_child("first", SLEEPS, tmp_path, starts),
            process_child("middle", crash_once, tmp_path, starts),
            process_child("last", SLEEPS, tmp_path, starts),
        ])
        ref = await spawn(sup)
        await wait_until(lambda: len(starts) == 4)
        await asyncio.sleep(0.3)
        await ref.stop()
        return 0

    run(body)
    assert starts == ["first", "middle", "last", "middle"]


def test_readiness_timeout_fails_the_start_with_the_childs_log_tail(tmp_path):
    never_ready = "print('loading weights from /nowhere', flush=True); import time; time.sleep(600)"

    async def body():
        spec = ProcessSpec("engine", [PY, "-c", never_ready], ready=http_ready("http://127.0.0.1:9/health"),
                           ready_timeout=1.0, stop_timeout=1.0)
        child = ProcessChild(spec, tmp_path)
        with pytest.raises(ReadinessTimeout, match=r"(?s)not ready within 1 s.*loading weights from /nowhere"):
            await spawn(child)
        assert child.process.returncode is not None  # and it was not left running
        return 0

    run(body)


def test_a_child_that_dies_before_ready_is_reported_with_its_log(tmp_path):
    dies = "import sys; print('CUDA out of memory', flush=True); sys.exit(2)"

    async def body():
        spec = ProcessSpec("engine", [PY, "-c", dies], ready=http_ready("http://127.0.0.1:9/health"), ready_timeout=30)
        with pytest.raises(Exception, match=r"(?s)exited with code 2.*CUDA out of memory"):
            await spawn(ProcessChild(spec, tmp_path))
        return 0

    run(body)


def test_the_run_exits_nonzero_naming_the_child_when_intensity_is_exceeded(tmp_path):
    result = subprocess.run([PY, str(HERE / "tree_program.py"), "crash", str(tmp_path)], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert "child 'crasher' needed more than 2 restarts" in result.stderr
    assert "something broke" in result.stderr  # the log tail is shown


def _descendants(pid):
    return {p.pid for p in psutil.Process(pid).children(recursive=True)}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_main_process_leaves_no_descendant(tmp_path, sig):
    main = subprocess.Popen([PY, str(HERE / "tree_program.py"), "tree", str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert main.stdout.readline().strip() == "READY"
        deadline = time.monotonic() + 20
        # stubborn + grandparent + its grandchild
        while len(_descendants(main.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        descendants = _descendants(main.pid)
        assert len(descendants) >= 3
        main.send_signal(sig)
        assert main.wait(timeout=30) == 128 + sig.value
        deadline = time.monotonic() + 5
        while alive(descendants) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(descendants)
    finally:
        main.kill()


def test_an_early_child_starts_while_the_child_before_it_is_still_coming_up(tmp_path):
    """The first child is ready only once the second has started: without start_early this
    start could not finish (the first would time out waiting)."""
    marker = tmp_path / "trainer-started"

    async def trainer_started() -> bool:
        return marker.exists()

    async def body():
        sup = Supervisor("sup", [
            process_child("engine", SLEEPS, tmp_path, ready=trainer_started, ready_timeout=60),
            ChildSpec("trainer", process_child("trainer", f"open({str(marker)!r}, 'w'); {SLEEPS}", tmp_path).start,
                      start_early=True),
        ])
        ref = await spawn(sup)
        assert list(sup.children()) == ["engine", "trainer"]  # registered, and so stopped, in order
        pids = [child.actor.process.pid for child in sup.children().values()]
        await ref.stop()
        return pids

    assert not alive(set(run(body)))


@pytest.mark.parametrize("trainer_ready", [False, True], ids=["still-starting", "up"])
def test_an_early_child_is_undone_when_a_child_before_it_fails_to_start(tmp_path, trainer_ready):
    pid_file = tmp_path / "trainer.pid"
    # The engine fails once the trainer's process exists: the trainer is then starting or up.
    engine = f"import os, sys, time\nwhile not os.path.exists({str(pid_file)!r}): time.sleep(0.05)\nsys.exit(2)"
    trainer = f"import os; open({str(pid_file)!r}, 'w').write(str(os.getpid())); {SLEEPS}"

    async def never() -> bool:
        return False

    async def body():
        sup = Supervisor("sup", [
            process_child("engine", engine, tmp_path, ready=never, ready_timeout=60),
            ChildSpec("trainer", process_child("trainer", trainer, tmp_path, ready=None if trainer_ready else never,
                                               ready_timeout=60).start, start_early=True),
        ])
        with pytest.raises(Exception, match="exited with code 2"):
            await spawn(sup)
        return 0

    run(body)
    assert not alive({int(pid_file.read_text())})
