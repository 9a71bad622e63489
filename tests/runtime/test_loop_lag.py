"""The loop-lag probe and its millisecond histogram: quantiles worked out by hand, snapshots that
subtract, and a blocked loop seen as lag."""

import asyncio
import time

from slime_async.loop_lag import GcPauses, LoopLagProbe, MsHistogram, buckets_of, quantile_ms


def test_quantiles_are_the_upper_edge_of_the_bucket_that_holds_them():
    histogram = MsHistogram()
    for seconds in [0.0004] * 98 + [0.0123, 0.2501]:  # 98 samples in [0, 1) ms, one at 12.3 ms, one at 250.1 ms
        histogram.add(seconds)
    buckets = buckets_of(histogram.snapshot())
    assert buckets == {0: 98, 12: 1, 250: 1}
    assert quantile_ms(buckets, 0.5) == 1.0 and quantile_ms(buckets, 0.99) == 13.0 and quantile_ms(buckets, 1.0) == 251.0
    assert round(histogram.max_ms, 1) == 250.1 and quantile_ms(buckets_of({"buckets": {}}), 0.99) is None


def test_two_snapshots_subtract_to_the_samples_between_them():
    histogram = MsHistogram()
    histogram.add(0.0005)
    before = histogram.snapshot()
    histogram.add(0.0005)
    histogram.add(0.030)
    assert buckets_of(histogram.snapshot(), before) == {0: 1, 30: 1}


async def test_a_loop_blocked_for_50_ms_shows_at_least_40_ms_of_lag():
    probe = LoopLagProbe(interval=0.01)
    probe.start()
    while probe.lag.count == 0:  # the probe is asleep in its next interval from here
        await asyncio.sleep(0.001)
    time.sleep(0.05)  # holds the loop: the probe cannot wake before this returns
    while probe.lag.count < 2:
        await asyncio.sleep(0.001)
    await probe.stop()
    assert probe.lag.max_ms >= 40.0


def test_gc_pauses_count_each_collection_by_generation_while_started():
    import gc

    pauses = GcPauses()
    pauses.start()
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        pauses.stop()
    gc.collect()  # not counted: stopped
    snapshot = pauses.snapshot()
    assert snapshot["collections_by_generation"] == {"0": 1, "2": 1} and snapshot["count"] == 2
    assert set(snapshot["cpu_seconds_by_generation"]) == {"0", "2"}
