"""slime_async/child_env.py: the children the runtime starts import this project's packages."""

import os
import subprocess
import sys

from slime_async.child_env import PACKAGES_ROOT, child_env, child_pythonpath


def test_the_packages_root_goes_first_and_the_inherited_pythonpath_is_kept():
    assert child_pythonpath({"PYTHONPATH": "/opt/extra"}) == os.pathsep.join([str(PACKAGES_ROOT), "/opt/extra"])
    assert child_pythonpath({}) == str(PACKAGES_ROOT)


def test_a_child_started_elsewhere_imports_the_projects_packages(tmp_path):
    env = child_env(SLIME_ASYNC_CHILD_ENV_TEST="1")
    env["PYTHONPATH"] = child_pythonpath({})  # not this test run's own PYTHONPATH: only what the helper adds
    code = "import actors, policies, slime_async, os; print(os.path.dirname(actors.__path__[0]), os.environ['SLIME_ASYNC_CHILD_ENV_TEST'])"
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(PACKAGES_ROOT), "1"]
