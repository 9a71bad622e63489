"""Which processes serve an engine URL on this host (the tensor transport's same-GPU check)."""

import os

import psutil

from actors.weight_sync.tensor import local_engine_pids


def test_the_engine_behind_a_url_is_the_process_listening_on_its_port(engine_url):
    pids = local_engine_pids(engine_url)
    assert pids and os.getpid() not in pids and all(psutil.pid_exists(pid) for pid in pids)
