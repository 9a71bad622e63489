"""--update-weight-transport delta: the receivers flag, and the check at start that every engine has a receiver."""

import pytest

from actors.loop.config import TrainConfig
from actors.weight_sync.actor import WeightSyncActor
from actors.weight_sync.errors import WeightSyncError
from slime_async.actor import Actor, spawn
from slime_async.net import free_port


def test_receivers_are_engine_url_receiver_url_pairs():
    config = TrainConfig(update_weight_transport="delta",
                        update_weight_delta_receivers="http://a:30000/=http://a:30100, http://b:30000=http://b:30100")
    config.validate()
    assert config.delta_receivers() == {"http://a:30000": "http://a:30100", "http://b:30000": "http://b:30100"}
    assert TrainConfig(update_weight_transport="delta").delta_receivers() == {}


@pytest.mark.parametrize("value, transport, message", [
    ("http://a:30000", "delta", r"'http://a:30000' is not ENGINE_URL=RECEIVER_URL"),
    ("=http://a:30100", "delta", r"'=http://a:30100' is not ENGINE_URL=RECEIVER_URL"),
    ("http://a:30000=http://a:30100", "disk", r"needs --update-weight-transport delta"),
])
def test_a_malformed_or_unused_receivers_flag_is_refused_naming_it(value, transport, message):
    config = TrainConfig(update_weight_transport=transport, update_weight_delta_receivers=value)
    with pytest.raises(ValueError, match=rf"--update-weight-delta-receivers.*{message}|{message}"):
        config.validate()


class _Router(Actor):
    def __init__(self, url: str):
        super().__init__("router")
        self.url = url

    async def engines(self) -> list[dict]:
        return [{"url": self.url, "health": "up", "paused": False}]


async def test_an_engine_without_a_receiver_fails_the_start_naming_it_and_the_way_out(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there: an SGLang engine would answer 404
    router = await spawn(_Router(url))
    sync = await spawn(WeightSyncActor(router, router, "delta", "abort", tmp_path))
    with pytest.raises(WeightSyncError, match=rf"engine {url} has no weight-delta receiver .*"
                                              r"--update-weight-delta-receivers ENGINE_URL=RECEIVER_URL"):
        await sync.ask("check_engines")
    await sync.stop()
    await router.stop()
