"""SGLang launch command, GPU assignment, engine config validation and external discovery.

None of this needs sglang installed: the command line is built from the config alone, and
discovery is exercised against real HTTP servers on loopback.
"""

from __future__ import annotations

import socket
import sys

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from actors.engine.config import EngineConfig
from actors.engine.external import ExternalEngineError, discover_external_engine, normalize_engine_url
from actors.engine.fleet import build_fleet, check_gpu_budget
from actors.engine.info import EngineInfo
from actors.engine.sglang import (
    RUNTIME_OWNED_SGLANG_FIELDS,
    assign_engine_gpus,
    build_sglang_argv,
    sglang_process_spec,
)
from slime_async.weights.process_group import nccl_env_defaults

# ---- argv


def test_argv_holds_the_runtime_owned_flags_then_the_passthrough_verbatim():
    argv = build_sglang_argv(
        "/models/qwen",
        host="127.0.0.1",
        port=30001,
        tp_size=2,
        base_gpu_id=4,
        passthrough={"mem_fraction_static": 0.7, "enable_metrics": True, "cuda_graph_bs": [1, 2, 4]},
        python="/usr/bin/python3",
    )
    assert argv == [
        "/usr/bin/python3", "-m", "sglang.launch_server",
        "--model-path", "/models/qwen",
        "--host", "127.0.0.1",
        "--port", "30001",
        "--tp-size", "2",
        "--base-gpu-id", "4",
        "--skip-tokenizer-init",
        "--mem-fraction-static", "0.7",
        "--enable-metrics",
        "--cuda-graph-bs", "1", "2", "4",
    ]


def test_host_defaults_to_loopback_and_python_to_this_interpreter():
    argv = build_sglang_argv("/m", port=30000)
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_false_and_none_passthrough_values_are_left_out():
    argv = build_sglang_argv("/m", port=30000, passthrough={"enable_metrics": False, "chat_template": None})
    assert "--enable-metrics" not in argv
    assert "--chat-template" not in argv


def test_dict_passthrough_value_is_forwarded_as_json():
    argv = build_sglang_argv("/m", port=30000, passthrough={"json_model_override_args": {"rope_theta": 1e6}})
    value = argv[argv.index("--json-model-override-args") + 1]
    assert orjson.loads(value) == {"rope_theta": 1e6}


@pytest.mark.parametrize("field", sorted(RUNTIME_OWNED_SGLANG_FIELDS))
def test_runtime_owned_field_in_passthrough_is_rejected_naming_the_flag_to_use(field):
    with pytest.raises(ValueError) as info:
        build_sglang_argv("/m", port=30000, passthrough={field: "x"})
    assert f"--sglang-{field.replace('_', '-')}" in str(info.value)
    assert RUNTIME_OWNED_SGLANG_FIELDS[field] in str(info.value)


def test_runtime_owned_fields_name_the_runtime_flag_for_each():
    assert set(RUNTIME_OWNED_SGLANG_FIELDS) == {
        "model_path", "host", "port", "tp_size", "base_gpu_id", "nccl_port", "dist_init_addr", "skip_tokenizer_init",
    }
    assert "--rollout-num-gpus-per-engine" in RUNTIME_OWNED_SGLANG_FIELDS["tp_size"]


def test_building_the_command_does_not_import_sglang():
    build_sglang_argv("/m", port=30000, passthrough={"mem_fraction_static": 0.5})
    assert "sglang" not in sys.modules


def test_bad_port_is_rejected_naming_the_flag():
    with pytest.raises(ValueError, match="--engine-base-port"):
        build_sglang_argv("/m", port=70000)


# ---- process spec


def test_process_spec_runs_the_argv_and_waits_for_health_generate():
    spec = sglang_process_spec(
        "sglang-0", "/m", port=30000, tp_size=2, base_gpu_id=2,
        passthrough={"log_level": "warning"}, env={"NCCL_DEBUG": "WARN"}, ready_timeout=900,
    )
    assert spec.name == "sglang-0"
    assert spec.argv == build_sglang_argv("/m", port=30000, tp_size=2, base_gpu_id=2, passthrough={"log_level": "warning"})
    assert spec.env == {"NCCL_DEBUG": "WARN"}
    assert spec.ready_timeout == 900


@pytest_asyncio.fixture
async def health_server():
    """A server whose /health_generate answers with `state["status"]`, recording the paths asked."""
    state = {"status": 503, "paths": []}

    async def handle(request: web.Request) -> web.Response:
        state["paths"].append(request.path)
        return web.Response(status=state["status"] if request.path == "/health_generate" else 404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state["port"] = site._server.sockets[0].getsockname()[1]
    yield state
    await runner.cleanup()


@pytest.mark.asyncio
async def test_readiness_probe_is_true_only_when_health_generate_answers_200(health_server):
    spec = sglang_process_spec("sglang-0", "/m", port=health_server["port"])
    assert await spec.ready() is False
    health_server["status"] = 200
    assert await spec.ready() is True
    assert health_server["paths"] == ["/health_generate", "/health_generate"]


@pytest.mark.asyncio
async def test_probe_of_an_engine_bound_to_all_interfaces_goes_through_loopback(health_server):
    health_server["status"] = 200
    spec = sglang_process_spec("sglang-0", "/m", host="0.0.0.0", port=health_server["port"])
    assert spec.argv[spec.argv.index("--host") + 1] == "0.0.0.0"
    assert await spec.ready() is True


# ---- GPU assignment


def test_gpus_are_split_into_consecutive_engines():
    assert assign_engine_gpus(8, 2) == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert assign_engine_gpus(4, 4, first_gpu=4) == [(4, 4)]
    assert assign_engine_gpus(3, 1, first_gpu=1) == [(1, 1), (2, 1), (3, 1)]


@pytest.mark.asyncio
async def test_sglang_engines_start_after_the_trainer_gpus_with_nccl_cumem_off(tmp_path, monkeypatch):
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    monkeypatch.setattr("actors.engine.fleet.importlib.util.find_spec", lambda name: object())
    config = EngineConfig(engine_type="sglang", rollout_num_gpus=2, rollout_num_gpus_per_engine=1, engine_base_port=31000)
    fleet = await build_fleet(config, "/m", tmp_path, gpu_available=True, first_gpu=2, gpu_count=4)
    assert fleet.urls == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    assert [s.argv[s.argv.index("--base-gpu-id") + 1] for s in fleet.specs] == ["2", "3"]
    assert all(s.env["NCCL_CUMEM_ENABLE"] == "0" for s in fleet.specs)


@pytest.mark.asyncio
async def test_with_the_delta_transport_each_owned_sglang_engine_gets_a_receiver_beside_it(tmp_path, monkeypatch):
    monkeypatch.setattr("actors.engine.fleet.importlib.util.find_spec", lambda name: object())
    config = EngineConfig(engine_type="sglang", rollout_num_gpus=2, rollout_num_gpus_per_engine=1, engine_base_port=31000)
    fleet = await build_fleet(config, "/m", tmp_path / "logs", gpu_available=True, gpu_count=2, delta_receivers=True)
    assert fleet.urls == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    assert [c.name for c in fleet.children] == ["engine-0", "delta-receiver-0", "engine-1", "delta-receiver-1"]
    assert set(fleet.delta_receivers) == set(fleet.urls)
    # The receivers run on their engine's host, load into it, and are not engines the router sees.
    assert all(url.startswith("http://127.0.0.1:") and url not in fleet.urls for url in fleet.delta_receivers.values())
    without = await build_fleet(config, "/m", tmp_path / "logs", gpu_available=True, gpu_count=2)
    assert [c.name for c in without.children] == ["engine-0", "engine-1"] and without.delta_receivers == {}


def test_trainer_plus_rollout_gpus_beyond_the_host_fail_naming_the_counts():
    check_gpu_budget(1, 1, 2)
    with pytest.raises(ValueError, match=r"trainer takes GPUs 0..0 and --rollout-num-gpus 2 more, but this host has 2"):
        check_gpu_budget(1, 2, 2)
    with pytest.raises(ValueError, match=r"--rollout-num-gpus 2 but this host has 1 GPU"):
        check_gpu_budget(0, 2, 1)


def test_a_user_set_nccl_cumem_wins(monkeypatch):
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")
    assert nccl_env_defaults() == {}


def test_gpus_not_a_multiple_of_the_engine_size_name_both_flags():
    with pytest.raises(ValueError) as info:
        assign_engine_gpus(6, 4)
    assert "--rollout-num-gpus (6)" in str(info.value)
    assert "--rollout-num-gpus-per-engine (4)" in str(info.value)


@pytest.mark.parametrize(
    "gpus, per_engine, flag",
    [(0, 1, "--rollout-num-gpus "), (4, 0, "--rollout-num-gpus-per-engine")],
)
def test_non_positive_gpu_counts_name_their_flag(gpus, per_engine, flag):
    with pytest.raises(ValueError, match=flag):
        assign_engine_gpus(gpus, per_engine)


# ---- engine config


def test_default_engine_config_is_valid():
    EngineConfig().validate()


@pytest.mark.parametrize(
    "changes, flag",
    [
        ({"engine_type": "external"}, "--rollout-external-engine-addrs"),
        ({"engine_type": "cpu", "rollout_external_engine_addrs": ["h:1"]}, "--rollout-external-engine-addrs"),
        ({"rollout_num_gpus": 3, "rollout_num_gpus_per_engine": 2}, "--rollout-num-gpus-per-engine"),
        ({"rollout_num_engines": 0}, "--rollout-num-engines"),
        ({"engine_base_port": 70000}, "--engine-base-port"),
        ({"engine_request_timeout": 0}, "--engine-request-timeout"),
        ({"engine_start_timeout": -1}, "--engine-start-timeout"),
        ({"cpu_engine_max_running_requests": 0}, "--cpu-engine-max-running-requests"),
        ({"cpu_engine_threads": -1}, "--cpu-engine-threads"),
        ({"sglang": {"port": 1}}, "--sglang-port"),
        ({"engine_type": "cpu", "sglang": {"mem_fraction_static": 0.5}}, "--sglang-mem-fraction-static"),
    ],
)
def test_contradictory_engine_config_names_the_flag(changes, flag):
    with pytest.raises(ValueError, match=flag):
        EngineConfig(**changes).validate()


@pytest.mark.parametrize(
    "config, gpu, sglang, expected",
    [
        (EngineConfig(), True, True, "sglang"),
        (EngineConfig(), True, False, "cpu"),
        (EngineConfig(), False, True, "cpu"),
        (EngineConfig(rollout_external_engine_addrs=["h:1"]), True, True, "external"),
        (EngineConfig(engine_type="cpu"), True, True, "cpu"),
    ],
)
def test_auto_engine_type_depends_on_gpu_sglang_and_addresses(config, gpu, sglang, expected):
    assert config.resolved_engine_type(gpu_available=gpu, sglang_available=sglang) == expected


# ---- external engines


def test_host_port_addresses_get_an_http_scheme():
    assert normalize_engine_url("10.0.0.2:30000") == "http://10.0.0.2:30000"
    assert normalize_engine_url("https://engine.example/") == "https://engine.example"


def _free_refusing_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
    return sock


@pytest.mark.asyncio
async def test_external_engine_that_is_down_is_reported_with_its_address():
    with _free_refusing_port() as sock:
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        async with aiohttp.ClientSession() as session:
            with pytest.raises(ExternalEngineError) as info:
                await discover_external_engine(address, session)
    message = str(info.value)
    assert f"http://{address}" in message
    assert "not reachable" in message
    assert "--rollout-external-engine-addrs" in message


def _app(routes: dict[str, tuple[int, object]], seen: list) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization")))
        status, body = routes.get(request.path, (404, {"detail": "Not Found"}))
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest_asyncio.fixture
async def serve():
    runners = []

    async def start(routes: dict[str, tuple[int, object]], seen: list | None = None) -> str:
        runner = web.AppRunner(_app(routes, seen if seen is not None else []))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


MODEL_INFO = {"model_path": "Qwen/Qwen3-4B", "is_generation": True, "weight_version": "3"}
SERVER_INFO = {"model_path": "Qwen/Qwen3-4B", "tp_size": 2, "version": "0.5.6"}


@pytest.mark.parametrize(
    "routes",
    [
        {"/model_info": (200, MODEL_INFO), "/server_info": (200, SERVER_INFO)},  # SGLang >= 0.5.17 names
        {"/get_model_info": (200, MODEL_INFO), "/get_server_info": (200, SERVER_INFO)},  # older SGLang
    ],
    ids=["new-endpoint-names", "old-endpoint-names"],
)
@pytest.mark.asyncio
async def test_external_sglang_server_is_discovered_as_not_owned(serve, routes):
    seen: list = []
    url = await serve(routes, seen)
    async with aiohttp.ClientSession() as session:
        info = await discover_external_engine(url, session, api_key="k")
    assert info == EngineInfo(url=url, model_path="Qwen/Qwen3-4B", tp_size=2, weight_version="3", owned=False)
    assert set(routes) <= {path for path, _ in seen}
    assert all(auth == "Bearer k" for _, auth in seen)


@pytest.mark.asyncio
async def test_server_without_sglang_endpoints_is_reported_as_not_sglang_compatible(serve):
    url = await serve({"/": (200, {"hello": "world"})})
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ExternalEngineError) as info:
            await discover_external_engine(url, session)
    assert url in str(info.value)
    assert "not an SGLang-compatible server" in str(info.value)
    assert "/get_model_info" in str(info.value)


@pytest.mark.asyncio
async def test_model_info_without_model_path_is_not_sglang_compatible(serve):
    url = await serve({"/model_info": (200, {"name": "x"}), "/server_info": (200, {})})
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ExternalEngineError, match="no model_path"):
            await discover_external_engine(url, session)


@pytest.mark.asyncio
async def test_rejected_api_key_points_at_the_key_flag(serve):
    url = await serve({"/model_info": (401, {"detail": "Unauthorized"})})
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ExternalEngineError, match="--engine-api-key"):
            await discover_external_engine(url, session, api_key="wrong")
