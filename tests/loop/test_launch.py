"""How `slime-async train` derives its actors' configs and decides to restart a failed run."""

from actors.engine.config import EngineConfig
from actors.loop.launch import _router_config, _trainer_config, should_restart
from actors.loop.train_loop import RunProgress
from actors.router.config import RouterConfig
from policies.loss_spec import LossSpec
from actors.loop.run_config import RunConfig
from slime_async.config.sections import CheckpointConfig
from slime_async.runtime import EXIT_FAILURE


def config_with(**checkpoint):
    return RunConfig(checkpoint=CheckpointConfig(**checkpoint))


def test_a_failed_run_that_trained_restarts_while_restarts_are_left():
    config = config_with(save="/ckpt", max_run_restarts=2)
    trained = RunProgress(steps_trained=3)
    assert should_restart(config, EXIT_FAILURE, trained, restarts=0)
    assert should_restart(config, EXIT_FAILURE, trained, restarts=1)
    assert not should_restart(config, EXIT_FAILURE, trained, restarts=2)


def test_no_restart_after_success_a_signal_a_failure_before_training_or_without_save():
    trained = RunProgress(steps_trained=3)
    assert not should_restart(config_with(save="/ckpt"), 0, trained, restarts=0)
    assert not should_restart(config_with(save="/ckpt"), 128 + 15, trained, restarts=0)  # SIGTERM
    assert not should_restart(config_with(save="/ckpt"), EXIT_FAILURE, RunProgress(), restarts=0)
    assert not should_restart(config_with(), EXIT_FAILURE, trained, restarts=0)



def test_the_routers_engine_calls_time_out_after_the_engine_request_timeout_unless_set():
    config = RunConfig(engine=EngineConfig(engine_request_timeout=42.0))
    assert _router_config(config).router_request_timeout == 42.0
    config.router = RouterConfig(router_request_timeout=7.0)
    assert _router_config(config).router_request_timeout == 7.0


def test_the_trainer_keeps_a_reference_model_when_a_kl_term_needs_it():
    assert not _trainer_config(RunConfig()).use_reference
    assert _trainer_config(RunConfig(algorithm=LossSpec(use_kl_loss=True, kl_loss_coef=0.01))).use_reference
    assert _trainer_config(RunConfig(algorithm=LossSpec(kl_coef=0.01))).use_reference
