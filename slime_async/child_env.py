"""The environment of the Python processes the runtime starts (trainer ranks, CPU engines,
checkpoint converters): each imports this project's packages (``actors``, ``policies``,
``slime_async``), pip-installed or not, so the directory that holds them goes first on its
``PYTHONPATH``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# The directory holding slime_async/, actors/ and policies/: the repository root, or
# site-packages when installed.
PACKAGES_ROOT = Path(__file__).resolve().parents[1]


def child_pythonpath(base: Mapping[str, str] | None = None) -> str:
    """``PYTHONPATH`` for a child: the packages' root, then ``base``'s (default: this process's)."""
    inherited = (os.environ if base is None else base).get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(PACKAGES_ROOT), inherited) if p)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the child's ``PYTHONPATH`` and ``extra`` on top."""
    return {**os.environ, "PYTHONPATH": child_pythonpath(), **extra}
