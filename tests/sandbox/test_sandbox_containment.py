"""The in-process ``Sandbox`` contains hostile code: each payload is a real process, each run is
checked for the reason it reports and for processes it left behind."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from slime_async.sandbox import Sandbox, SandboxLimits, SandboxRunner
from slime_async.sandbox.pool import Isolation, closed_ancestors, interpreter_paths
from tests.sandbox.conftest import (FORK_BOMB, LIBRARY_UID_BASE, TEST_LIMITS, DescendantWatch, assert_nothing_left,
                                    requires_root)

pytestmark = requires_root

DOUBLE_FORKED_DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("daemon up", flush=True)
        time.sleep(600)
    os._exit(0)
time.sleep(0.3)
print("main done")
"""


async def contained_run(sandbox: Sandbox, code: str, min_processes_seen: int = 0, **kwargs):
    """Run ``code`` recording its processes (descendants of this one, sampled every few ms, and any
    process of the sandbox's uids); afterwards none may be alive and a trivial run still works."""
    with DescendantWatch(os.getpid()) as watch:
        result = await sandbox.run(code, **kwargs)
    assert_nothing_left(watch, LIBRARY_UID_BASE)
    assert len(watch.seen) >= min_processes_seen, watch.seen
    after = await sandbox.run("print('still fine')")
    assert (after.stdout, after.exit_code, after.killed_reason) == ("still fine\n", 0, None)
    return result


def test_both_runners_implement_the_protocol(sandbox):
    from slime_async.sandbox import RemoteSandbox

    assert isinstance(sandbox, SandboxRunner)
    assert isinstance(RemoteSandbox(["http://127.0.0.1:1"]), SandboxRunner)


async def test_a_plain_run_reports_stdout_stderr_and_exit_code(sandbox):
    result = await sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert (result.timed_out, result.killed_reason) == (False, None)
    assert result.wall_s > 0
    bash = await sandbox.run("echo $((6 * 7)); echo oops >&2; exit 4", language="bash")
    assert (bash.stdout, bash.stderr, bash.exit_code) == ("42\n", "oops\n", 4)


async def test_a_python_exception_is_an_ordinary_failure_with_its_traceback(sandbox):
    result = await sandbox.run("x = 1\nraise KeyError('missing')")
    assert result.exit_code == 1 and result.killed_reason is None
    assert "raise KeyError('missing')" in result.stderr and "KeyError: 'missing'" in result.stderr


async def test_fork_bomb_ends_at_the_process_limit_and_leaves_nothing(sandbox):
    # the jail, its init, the program and its forks: at least that many were seen, and are gone
    result = await contained_run(sandbox, FORK_BOMB, min_processes_seen=4)
    assert result.killed_reason == "processes"
    assert result.exit_code is None and not result.timed_out
    assert result.stdout.startswith("bomb")


async def test_bash_fork_bomb_is_contained(sandbox):
    result = await contained_run(sandbox, ":(){ :|:& };:\nsleep 30", language="bash")
    assert result.killed_reason == "processes"


async def test_a_fork_bomb_does_not_starve_a_concurrent_run(sandbox):
    # Each pool slot runs as its own uid, so the bomb's RLIMIT_NPROC count is its own.
    bomb, neighbour = await asyncio.gather(
        sandbox.run(FORK_BOMB),
        sandbox.run("for i in 1 2 3 4 5 6 7 8; do echo $(echo $i) > /dev/null; sleep 0.1; done; echo ok",
                    language="bash"))
    assert bomb.killed_reason == "processes"
    assert (neighbour.stdout, neighbour.exit_code) == ("ok\n", 0)


async def test_infinite_loop_is_killed_at_the_wall_timeout(sandbox):
    result = await contained_run(sandbox, "while True:\n    pass", timeout_s=1.0)
    assert result.timed_out and result.killed_reason == "timeout" and result.exit_code is None
    assert result.wall_s >= 1.0


async def test_cpu_seconds_limit_ends_a_busy_loop():
    # a long wall timeout: on busy cores one CPU-second can take many seconds of wall clock
    sandbox = Sandbox(SandboxLimits(cpu_s=1, timeout_s=90.0, uid_base=LIBRARY_UID_BASE), max_concurrency=1)
    result = await sandbox.run("while True:\n    pass")
    assert result.killed_reason == "cpu" and not result.timed_out
    assert result.exit_code == -24  # SIGXCPU


async def test_a_10_gb_allocation_fails_fast_as_memory(sandbox):
    result = await contained_run(sandbox, "x = bytearray(10 * 1024 ** 3)\nprint('allocated')")
    assert result.killed_reason == "memory" and result.exit_code == 1
    assert "MemoryError" in result.stderr and "allocated" not in result.stdout


MEMORY_FROM_MANY_PROCESSES = """
import os, time
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        data = b"x" * (150 << 20)  # written, so really resident (each one is within RLIMIT_AS)
        time.sleep(1)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""


async def test_the_memory_of_all_processes_of_a_run_together_is_bounded():
    sandbox = Sandbox(dataclasses.replace(TEST_LIMITS, run_memory_bytes=256 << 20), max_concurrency=1)
    if not sandbox.describe()["memory_cgroup"]:
        pytest.skip("no memory cgroup per run on this machine")
    result = await contained_run(sandbox, MEMORY_FROM_MANY_PROCESSES)
    assert result.killed_reason == "memory"
    assert not list(sandbox._cgroups.parent.glob(f"slime-sandbox-{os.getpid()}-*"))  # removed after the run


async def test_100_mb_of_stdout_is_truncated_and_the_run_ended(sandbox):
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\nprint('end')"
    result = await contained_run(sandbox, code)
    assert result.killed_reason == "output_limit" and result.exit_code is None
    assert result.stdout == "x" * TEST_LIMITS.output_bytes


async def test_endless_stderr_is_truncated_too(sandbox):
    result = await sandbox.run("yes error >&2", language="bash")
    assert result.killed_reason == "output_limit"
    assert len(result.stderr) == TEST_LIMITS.output_bytes and result.stderr.startswith("error\nerror\n")


@pytest.fixture
def world_writable_dir():
    """A directory outside /tmp that anybody may write to (the uid alone would not stop a write)."""
    path = Path(tempfile.mkdtemp(prefix=".sandbox-escape-", dir=Path(__file__).parent))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


async def test_writing_outside_the_working_directory_fails(sandbox, tmp_path, world_writable_dir):
    # A directory under /tmp is not even visible (the run's /tmp is its own tmpfs) — a checkout
    # under /tmp puts world_writable_dir there too.
    under_tmp = Path("/tmp") in world_writable_dir.resolve().parents
    for target, error in ((tmp_path / "escaped.txt", "FileNotFoundError"),
                          (world_writable_dir / "escaped.txt", "FileNotFoundError" if under_tmp else "Read-only file system")):
        result = await contained_run(sandbox, f"open({str(target)!r}, 'w').write('x')")
        assert result.exit_code == 1 and error in result.stderr
        assert not target.exists()
    # Its /tmp is its own tmpfs: what it writes there never reaches this machine's /tmp.
    marker = f"/tmp/sandbox-marker-{uuid.uuid4().hex}"
    result = await sandbox.run(f"open({marker!r}, 'w').write('x')\nprint(open({marker!r}).read())")
    assert result.stdout == "x\n" and not Path(marker).exists()


async def test_hidden_paths_are_empty_but_the_interpreter_inside_them_still_runs(tmp_path):
    repository = Path(__file__).resolve().parents[2]  # holds this venv; /tmp holds tmp_path anyway
    answers = repository / "tests" / "sandbox" / "conftest.py"
    sandbox = Sandbox(dataclasses.replace(TEST_LIMITS, hidden_paths=(str(repository),)), max_concurrency=1)
    code = (f"import os, numpy\nprint(sorted(os.listdir({str(repository)!r})))\n"
            f"print(os.path.exists({str(answers)!r}), numpy.arange(4).sum())")
    result = await sandbox.run(code)
    venv = Path(sys.prefix).resolve()
    visible = [venv.relative_to(repository).parts[0]] if repository in venv.parents else []
    assert (result.stdout, result.exit_code) == (f"{visible}\nFalse 6\n", 0), result.stderr
    with pytest.raises(ValueError, match="hidden_paths"):
        Sandbox(dataclasses.replace(TEST_LIMITS, hidden_paths=("relative/dir",)))


async def test_the_working_directory_is_fresh_for_every_run(sandbox):
    first = await sandbox.run("open('left.txt', 'w').write('x')\nimport os\nprint(os.getcwd())")
    assert (first.stdout, first.exit_code) == ("/tmp\n", 0)
    second = await sandbox.run("import os\nprint(sorted(os.listdir('.')))")
    # An interpreter installed under /tmp (a checkout there) is bound back into the run's /tmp.
    interpreter = sorted({p.relative_to("/tmp").parts[0] for p in interpreter_paths(sys.executable)
                          if Path("/tmp") in p.parents})
    assert second.stdout == f"{sorted(['_main.py', *interpreter])}\n"


async def test_a_big_file_is_stopped_by_the_file_size_limit(sandbox):
    result = await sandbox.run("open('big', 'wb').write(b'x' * (8 << 20))")
    assert result.killed_reason == "file_size" and "File too large" in result.stderr


async def test_the_code_cannot_read_this_process_environment(sandbox, monkeypatch):
    monkeypatch.setenv("SANDBOX_TEST_SECRET", "hunter2-library")
    code = """
import glob, os
print(sorted(os.environ))
for path in glob.glob('/proc/*/environ'):
    try:
        if 'hunter2' in open(path, errors='replace').read():
            print('LEAK', path)
    except OSError:
        pass
print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
"""
    result = await contained_run(sandbox, code)
    assert "hunter2" not in result.stdout and "LEAK" not in result.stdout
    assert result.stdout.startswith("['HOME', 'LANG', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', "
                                    "'OPENBLAS_NUM_THREADS', 'PATH', 'TMPDIR']")
    assert "pids [1, 2]" in result.stdout  # its own PID namespace: only its init and itself


async def test_the_code_cannot_connect_to_a_port_this_test_listens_on(sandbox):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')"
        result = await contained_run(sandbox, code)
        assert result.exit_code == 1 and "connected" not in result.stdout
        assert "Network is unreachable" in result.stderr
        with pytest.raises(TimeoutError):
            listener.accept()


async def test_a_double_forked_daemon_dies_with_its_run(sandbox):
    result = await contained_run(sandbox, DOUBLE_FORKED_DAEMON, min_processes_seen=4)
    assert result.stdout == "daemon up\nmain done\n" and result.exit_code == 0


async def test_files_and_stdin_reach_the_program(sandbox):
    code = "import sys\nprint(open('data/in.txt').read().upper(), sys.stdin.read()[::-1])"
    result = await sandbox.run(code, stdin="olleh", files={"data/in.txt": "numbers"})
    assert (result.stdout, result.exit_code) == ("NUMBERS hello\n", 0)
    bash = await sandbox.run("read line; echo \"$line $(cat f.txt)\"", language="bash", stdin="a b\n",
                             files={"f.txt": "c"})
    assert bash.stdout == "a b c\n"


async def test_stdin_the_program_never_reads_does_not_hang_the_run(sandbox):
    result = await sandbox.run("print('ignored stdin')", stdin="z" * (4 << 20))
    assert (result.stdout, result.exit_code) == ("ignored stdin\n", 0)


async def test_the_call_timeout_overrides_the_default_and_is_bounded(sandbox):
    result = await sandbox.run("import time\ntime.sleep(20)", timeout_s=0.5)
    assert result.timed_out and result.wall_s < TEST_LIMITS.timeout_s
    with pytest.raises(ValueError, match="timeout_s=31 exceeds"):
        await sandbox.run("pass", timeout_s=31)


@pytest.mark.parametrize("kwargs, field", [
    ({"language": "ruby"}, "language"),
    ({"files": {"../up.txt": "x"}}, "files"),
    ({"files": {"/etc/x": "x"}}, "files"),
    ({"files": {"_main.py": "x"}}, "files"),
    ({"files": {"dir/": "x"}}, "files"),
    ({"files": {"a": "x", "a/b": "y"}}, "files"),  # only found when the files are written
    ({"timeout_s": -1}, "timeout_s"),
    ({"stdin": 5}, "stdin"),
])
async def test_bad_arguments_raise_a_value_error_naming_the_field(sandbox, kwargs, field):
    with pytest.raises(ValueError, match=field):
        await sandbox.run("pass", **kwargs)


async def test_no_more_than_max_concurrency_runs_at_once():
    sandbox = Sandbox(TEST_LIMITS, max_concurrency=2)
    code = "import time\nprint(time.time())\ntime.sleep(0.6)\nprint(time.time())"
    results = await asyncio.gather(*(sandbox.run(code) for _ in range(4)))
    spans = [tuple(map(float, r.stdout.split())) for r in results]
    most_at_once = max(sum(start <= t < end for start, end in spans) for t, _ in spans)
    assert most_at_once <= 2
    assert sandbox.running == 0


async def test_one_sandbox_serves_two_event_loops_within_one_bound():
    sandbox = Sandbox(TEST_LIMITS, max_concurrency=1)
    code = "import time\nprint(time.time())\ntime.sleep(0.5)\nprint(time.time())"
    # The reward thread has its own loop; both loops wait on the same slot.
    other_loop = asyncio.to_thread(lambda: asyncio.run(sandbox.run(code)))
    results = await asyncio.gather(other_loop, sandbox.run(code), sandbox.run(code))
    spans = sorted(tuple(map(float, r.stdout.split())) for r in results)
    assert all(earlier[1] <= later[0] for earlier, later in zip(spans, spans[1:]))  # one at a time
    assert sandbox.running == 0 and sandbox.runs == 3


async def test_a_call_cancelled_while_waiting_for_a_slot_gives_nothing_away():
    sandbox = Sandbox(TEST_LIMITS, max_concurrency=1)
    busy = asyncio.create_task(sandbox.run("import time\ntime.sleep(0.5)"))
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(sandbox.run("print('never')"))
    await asyncio.sleep(0.05)
    waiting.cancel()
    await busy
    assert (await sandbox.run("print('next')")).stdout == "next\n"
    assert waiting.cancelled() and sandbox.running == 0


async def test_runs_do_not_block_the_event_loop(sandbox):
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await sandbox.run("import time\ntime.sleep(1.0)")
    ticker.cancel()
    assert ticks >= 10


async def test_a_cancelled_call_kills_its_run(sandbox):
    with DescendantWatch(os.getpid()) as watch:
        task = asyncio.create_task(sandbox.run("import time\nprint('up', flush=True)\ntime.sleep(60)"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert_nothing_left(watch, LIBRARY_UID_BASE)
    assert sandbox.running == 0


NO_NAMESPACES = Isolation(namespaces=False, as_root=True, detail="forced off for this test")


async def test_without_namespaces_runs_use_a_host_directory_removed_afterwards():
    if closed_ancestors(sys.executable) and not Path("/usr/bin/python3").exists():
        pytest.skip("no interpreter every user can run")
    # /usr/bin/python3: this venv's interpreter may sit under /root, closed to the sandbox's uids
    limits = dataclasses.replace(TEST_LIMITS, python="/usr/bin/python3") if closed_ancestors(sys.executable) \
        else TEST_LIMITS
    sandbox = Sandbox(limits, max_concurrency=1, isolation=NO_NAMESPACES)
    assert sandbox.describe()["network_isolated"] is False
    with DescendantWatch(os.getpid()) as watch:
        result = await sandbox.run("pwd; cat in/x; id -u; sleep 60 & echo started", language="bash",
                                   files={"in/x": "hello\n"})
    workdir, text, uid, started = result.stdout.split()
    assert (text, uid, started, result.exit_code) == ("hello", str(LIBRARY_UID_BASE), "started", 0)
    assert workdir.startswith(tempfile.gettempdir()) and not Path(workdir).exists()
    assert_nothing_left(watch, LIBRARY_UID_BASE)  # the background sleep was in its process group
    result = await sandbox.run("import os\nprint(os.getuid(), sorted(os.environ))")
    assert result.stdout.startswith(f"{LIBRARY_UID_BASE} ['HOME', 'LANG'")
    result = await sandbox.run("while True:\n    pass", timeout_s=1.0)
    assert result.killed_reason == "timeout"


def test_without_namespaces_an_interpreter_the_sandbox_uid_cannot_reach_fails_at_start():
    if not closed_ancestors(sys.executable):
        pytest.skip("this interpreter is reachable by every user")
    with pytest.raises(ValueError, match="--python"):
        Sandbox(TEST_LIMITS, isolation=NO_NAMESPACES)


def test_a_sandbox_started_by_python_through_a_symlinked_venv_directory_runs():
    # A clone whose .venv is a symlink to another checkout's venv (as in a fresh clone under /tmp):
    # the sandbox starts the venv's python by its real directory; the link under the host's /tmp
    # does not exist in the run's own /tmp (exit 127, "could not start", before).
    script = ("import asyncio\n"
              "from slime_async.sandbox import Sandbox\n"
              "from tests.sandbox.conftest import TEST_LIMITS\n"
              "sandbox = Sandbox(TEST_LIMITS, max_concurrency=1)\n"
              "result = asyncio.run(sandbox.run('import numpy; print(numpy.arange(3).sum())'))\n"
              "print(repr((result.stdout, result.exit_code, result.stderr)))\n")
    repository = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(dir="/tmp") as clone:
        link = Path(clone) / ".venv"
        link.symlink_to(Path(sys.prefix).resolve(), target_is_directory=True)
        done = subprocess.run([str(link / "bin" / "python"), "-c", script], cwd=repository, capture_output=True,
                              text=True, timeout=60)
    assert done.stdout.strip() == repr(("3\n", 0, "")), done.stdout + done.stderr
