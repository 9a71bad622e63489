"""The supervisor's console keeps the run's own lines: an agent hook's openai client (real, against
a real HTTP server on 127.0.0.1) does not log every request there."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from actors.loop import console_noise
from actors.loop.console_noise import quiet_python_warnings


class _Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"object": "list", "data": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def models_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def restored_logger_levels() -> Iterator[None]:
    """quiet_python_warnings sets process-wide logger levels: other tests keep theirs."""
    names = console_noise._QUIET_LOGGERS + console_noise._CLIENT_LOGGERS
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_the_openai_client_requests_are_not_logged_at_info(models_server, restored_logger_levels, caplog):
    caplog.set_level(logging.INFO)
    quiet_python_warnings()
    client = openai.OpenAI(base_url=models_server, api_key="unused", max_retries=0)
    assert list(client.models.list()) == []
    client.close()
    assert not [r for r in caplog.records if "HTTP Request" in r.getMessage()], caplog.text
    logging.getLogger("httpx2").warning("a client's warning still shows")
    assert "a client's warning still shows" in caplog.text
