"""This process's memory as the kernel counts it: resident set now and its peak (Linux /proc).

The peak (VmHWM) can be reset (``/proc/self/clear_refs`` with 5), so a caller can measure
the peak of one phase or one training step rather than of the whole process life.
"""

from __future__ import annotations

from pathlib import Path

_STATUS = Path("/proc/self/status")


def _status_kib(key: str) -> int:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_bytes() -> int:
    """Resident memory now (0 where /proc is missing)."""
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes(reset: bool = False) -> int:
    """Peak resident memory since the start or the last reset; ``reset`` starts a new peak after reading."""
    peak = _status_kib("VmHWM") * 1024
    if reset:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:  # not permitted in some sandboxes: the peak then covers the process's life
            pass
    return peak
