"""A sandbox for model-written code: ``Sandbox`` in this process, ``RemoteSandbox`` over HTTP
(``slime-async sandbox-server``); both are ``SandboxRunner``s."""

from slime_async.sandbox.client import RemoteSandbox
from slime_async.sandbox.limits import KILLED_REASONS, LANGUAGES, RunResult, SandboxLimits, SandboxRunner
from slime_async.sandbox.pool import Sandbox, SandboxError

__all__ = ["KILLED_REASONS", "LANGUAGES", "RemoteSandbox", "RunResult", "Sandbox", "SandboxError",
           "SandboxLimits", "SandboxRunner"]
