"""The event-loop lag of a process that does nothing: the floor the machine itself sets.

Run it beside a load (benchmarks/front_load.py): whatever lag an idle loop sees comes from
waiting for a core (other processes), not from anything on the loop, so a busy loop's lag can
be no lower.

    python benchmarks/idle_lag.py --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime_async.loop_lag import LoopLagProbe, buckets_of, quantile_ms  # noqa: E402


async def measure(seconds: float) -> dict[str, float | None]:
    probe = LoopLagProbe(0.01)  # as the router's
    probe.start()
    await asyncio.sleep(seconds)
    await probe.stop()
    lag = buckets_of(probe.lag.snapshot())
    return {"samples": float(probe.lag.count), "lag_p50_ms": quantile_ms(lag, 0.5), "lag_p99_ms": quantile_ms(lag, 0.99),
            "lag_max_ms": round(probe.lag.max_ms, 1), "load_average_1m": round(os.getloadavg()[0], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    for key, value in asyncio.run(measure(args.seconds)).items():
        print(f"  {key:16s} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
