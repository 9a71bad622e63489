"""``slime-async sandbox-server`` as a real subprocess on 127.0.0.1, driven over HTTP and through
``RemoteSandbox``: containment holds through the service, it keeps serving, and the client fails
over between servers."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import aiohttp
import pytest

from slime_async.net import free_port
from slime_async.sandbox import RemoteSandbox
from slime_async.sandbox.client import SandboxUnavailable
from tests.sandbox.conftest import (API_KEY, FORK_BOMB, SECRET, SERVER_UID_BASES, DescendantWatch, assert_nothing_left,
                                    requires_root, start_server)

pytestmark = requires_root


async def post(url: str, body, key: str | None = API_KEY) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session:
        kwargs = {"data": body} if isinstance(body, (str, bytes)) else {"json": body}
        async with session.post(f"{url}/run", headers=headers, **kwargs) as response:
            return response.status, await response.json()


async def contained(server, code: str, language: str = "python") -> dict:
    """One run through HTTP; afterwards no process of it is alive and the server answers a trivial run."""
    with DescendantWatch(server.process.pid) as watch:
        status, result = await post(server.url, {"language": language, "code": code})
    assert status == 200, result
    assert_nothing_left(watch, server.uid_base)
    assert server.process.poll() is None
    status, after = await post(server.url, {"code": "print(2 + 2)"})
    assert (status, after["stdout"], after["exit_code"]) == (200, "4\n", 0)
    return result


async def health(url: str) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/health") as response:
            assert response.status == 200
            return await response.json()


async def test_health_reports_network_isolation(server):
    answer = await health(server.url)
    assert answer["network_isolated"] is True and answer["max_concurrency"] == 4
    assert answer["limits"]["processes"] == 16


async def test_a_run_answers_the_documented_fields(server):
    status, result = await post(server.url, {"language": "bash", "code": "cat in.txt; read x; echo $x >&2; exit 2",
                                             "stdin": "from stdin\n", "files": {"in.txt": "from a file\n"},
                                             "timeout_s": 5})
    assert status == 200
    assert result == {"stdout": "from a file\n", "stderr": "from stdin\n", "exit_code": 2, "timed_out": False,
                      "killed_reason": None, "wall_s": result["wall_s"]}


async def test_a_missing_or_wrong_key_is_401(server):
    for key in (None, "wrong"):
        status, body = await post(server.url, {"code": "print(1)"}, key=key)
        assert status == 401 and "API key" in body["error"]


@pytest.mark.parametrize("body, field", [
    ("not json", "JSON"),
    ([1, 2], "JSON object"),
    ({"language": "python"}, "code"),
    ({"code": "1", "language": "cobol"}, "language"),
    ({"code": "1", "timeout_s": "soon"}, "timeout_s"),
    ({"code": "1", "timeout_s": 999}, "timeout_s"),
    ({"code": "1", "files": {"../x": "y"}}, "files"),
    ({"code": "1", "files": ["x"]}, "files"),
    ({"code": 5}, "code"),
    ({"code": "1", "stdn": ""}, "stdn"),
])
async def test_a_bad_request_is_400_naming_the_field(server, body, field):
    status, answer = await post(server.url, body)
    assert status == 400 and field in answer["error"]


@pytest.mark.parametrize("flags, message", [
    (["--max-concurrency", "0"], "max_concurrency"),
    (["--timeout-s", "200"], "timeout_s=200.0 exceeds max_timeout_s"),
    (["--processes", "-1"], "processes"),
    (["--hidden-paths", "/no/such/dir"], "hidden_paths"),
])
def test_a_bad_flag_fails_at_start_with_one_line(flags, message):
    done = subprocess.run([sys.executable, "-m", "actors.loop.cli", "sandbox-server", *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("slime-async sandbox-server: error: ") and message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


async def test_the_server_keeps_serving_after_a_run_it_could_not_set_up(server):
    status, answer = await post(server.url, {"code": "1", "files": {"a": "x", "a/b": "y"}})
    assert status == 400 and answer["error"].startswith("files: ")
    status, after = await post(server.url, {"code": "print('ok')"})
    assert (status, after["stdout"]) == (200, "ok\n")


async def test_fork_bomb_through_the_service(server):
    result = await contained(server, FORK_BOMB)
    assert result["killed_reason"] == "processes" and result["exit_code"] is None


async def test_100_mb_stdout_through_the_service(server):
    result = await contained(server, "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))")
    assert result["killed_reason"] == "output_limit" and len(result["stdout"]) == 64 << 10


async def test_infinite_loop_through_the_service(server):
    status, result = await post(server.url, {"code": "while True:\n    pass", "timeout_s": 1})
    assert status == 200 and result["timed_out"] and result["killed_reason"] == "timeout"


async def test_the_code_cannot_read_the_server_environment(server):
    assert SECRET in open(f"/proc/{server.process.pid}/environ").read()  # the secret is really there
    # Everything it could try: its environment, every /proc/*/environ it can see, the server's
    # pid by number (another PID namespace: not there), the parent's environ.
    code = f"""
import glob, os
print(dict(os.environ))
for path in glob.glob('/proc/*/environ') + ['/proc/{server.process.pid}/environ']:
    try:
        print(path, open(path, errors='replace').read())
    except OSError as error:
        print(path, error)
print(open(f'/proc/{{os.getppid()}}/environ', errors='replace').read())
"""
    result = await contained(server, code)
    assert SECRET not in result["stdout"] and SECRET not in result["stderr"]


async def test_the_code_cannot_connect_to_a_port_the_test_listens_on(server):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=3)"
        result = await contained(server, code)
        assert result["exit_code"] == 1 and "Network is unreachable" in result["stderr"]
        with pytest.raises(TimeoutError):
            listener.accept()
        # not even the server's own port (the sandbox has no route to the host at all)
        port = int(server.url.rsplit(":", 1)[1])
        result = await contained(server, f"import socket\nsocket.create_connection(('127.0.0.1', {port}))")
        assert "Network is unreachable" in result["stderr"]


async def test_remote_sandbox_fails_over_from_a_dead_server():
    second = start_server(SERVER_UID_BASES[1])
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        async with RemoteSandbox([dead, second.url], api_key=API_KEY) as remote:
            results = [await remote.run(f"print({i} * 2)") for i in range(4)]
            assert [r.stdout for r in results] == ["0\n", "2\n", "4\n", "6\n"]
            with pytest.raises(ValueError, match="language"):
                await remote.run("x", language="fortran")
        async with RemoteSandbox([second.url], api_key="wrong") as remote:
            with pytest.raises(PermissionError):
                await remote.run("print(1)")
    finally:
        second.stop()
    async with RemoteSandbox([dead, second.url], api_key=API_KEY) as remote:
        with pytest.raises(SandboxUnavailable, match="no sandbox server"):
            await remote.run("print(1)")


async def test_remote_sandbox_spreads_calls_and_survives_losing_a_server(server):
    second = start_server(SERVER_UID_BASES[1])
    try:
        async with RemoteSandbox([server.url, second.url], api_key=API_KEY) as remote:
            for i in range(4):
                assert (await remote.run(f"print({i})")).stdout == f"{i}\n"
            served = {url: (await health(url))["runs"] for url in (server.url, second.url)}
            second.stop()
            for i in range(4):
                assert (await remote.run(f"print({i})")).stdout == f"{i}\n"
        assert all(count >= 2 for count in served.values()), served  # round-robin: both got calls
    finally:
        second.stop()


async def test_one_remote_sandbox_serves_two_event_loops(server):
    remote = RemoteSandbox([server.url], api_key=API_KEY)

    async def in_its_own_loop() -> str:
        try:
            return (await remote.run("print('other loop')")).stdout
        finally:
            await remote.close()

    other = asyncio.to_thread(lambda: asyncio.run(in_its_own_loop()))
    here = remote.run("print('this loop')")
    assert [r if isinstance(r, str) else r.stdout for r in await asyncio.gather(other, here)] == \
        ["other loop\n", "this loop\n"]
    await remote.close()
