"""A small supervised program the runtime tests start as a real process.

usage: tree_program.py MODE LOG_DIR
  tree     a nested tree (a child ignoring SIGTERM, a child with a grandchild); runs until signalled
  crash    one permanent child that keeps crashing: the supervisor gives up
  startup  a tree whose second child never gets ready: start-up lasts until signalled
  lost     main waits on an actor that is stopped because a sibling process died: the console's
           last line must name the dead process, not the lost actor
"""

import asyncio
import sys

from slime_async.actor import Actor, spawn
from slime_async.process import ProcessChild, ProcessSpec
from slime_async.runtime import run, run_supervised
from slime_async.supervisor import ChildSpec, Supervisor

PY = sys.executable
IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
HAS_GRANDCHILD = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
CRASHES = "import sys; print('something broke', flush=True); sys.exit(7)"
DIES_LATER = "import sys, time; time.sleep(1); print('disk full', flush=True); sys.exit(3)"


class Waiter(Actor):
    def wait_forever(self):
        return self.defer(asyncio.Event().wait())


async def never_ready() -> bool:
    return False


def process(name: str, code: str, log_dir: str) -> ChildSpec:
    spec = ProcessSpec(name, [PY, "-c", code], stop_timeout=1.0)
    return ChildSpec(name, lambda: spawn(ProcessChild(spec, log_dir)))


async def main(mode: str, log_dir: str) -> int:
    if mode == "tree":
        root = Supervisor("root", [
            process("stubborn", IGNORES_SIGTERM, log_dir),
            ChildSpec("inner", lambda: spawn(Supervisor("inner", [process("grandparent", HAS_GRANDCHILD, log_dir)]))),
        ])

        async def announce(_root: Supervisor) -> None:
            print("READY", flush=True)
            await asyncio.Event().wait()

        return await run_supervised(root, announce)
    if mode == "startup":
        stuck = ProcessSpec("stuck", [PY, "-c", "import time; time.sleep(600)"], ready=never_ready, ready_timeout=600)
        root = Supervisor("root", [
            ChildSpec("inner", lambda: spawn(Supervisor("inner", [process("grandparent", HAS_GRANDCHILD, log_dir)]))),
            ChildSpec("stuck", lambda: spawn(ProcessChild(stuck, log_dir))),
        ])
        return await run_supervised(root)
    if mode == "lost":
        root = Supervisor("root", [process("worker", DIES_LATER, log_dir), ChildSpec("waiter", lambda: spawn(Waiter()))],
                          max_restarts=0, max_seconds=1)
        return await run_supervised(root, lambda r: r.child("waiter").ask("wait_forever", timeout=None))
    root = Supervisor("root", [process("crasher", CRASHES, log_dir)], max_restarts=2, max_seconds=30)
    return await run_supervised(root)


if __name__ == "__main__":
    sys.exit(run(lambda: main(sys.argv[1], sys.argv[2])))
