"""Actors: objects with a mailbox, processed one message at a time.

A message is a method call: ``await ref.ask("route", session_id)`` runs ``actor.route(session_id)``
inside the actor's mailbox loop and returns its result (or raises its exception);
``ref.tell("record", metrics)`` enqueues the same call and returns at once. Because one message
runs at a time, actor state needs no locks.

Long work must not block the mailbox: a handler spawns it with ``self.spawn(coro)`` (the task is
owned by the actor and cancelled when it stops) or returns ``self.defer(coro)``, which answers the
``ask`` when the coroutine finishes while the mailbox goes on with the next message.

An actor ends normally (``stop()``) or by failure: an exception from a ``tell`` handler, from an
owned task, or a call to ``self.fail(exc)``. Whoever watches it (its supervisor) awaits
``ref.wait()``, which returns on a normal stop and raises the failure otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class ActorStopped(RuntimeError):
    """Raised by ``ask``/``tell`` to an actor that is not running."""


class ActorFailed(RuntimeError):
    """An actor ended with an error; ``__cause__`` is the original exception."""

    def __init__(self, actor: str, error: BaseException):
        super().__init__(f"actor {actor!r} failed: {type(error).__name__}: {error}")
        self.actor = actor
        self.error = error


@dataclass
class _Message:
    method: str
    args: tuple
    kwargs: dict
    reply: asyncio.Future | None = None


@dataclass
class Deferred:
    """Returned by a handler: the ``ask`` is answered when ``task`` finishes."""

    task: asyncio.Task = field(repr=False)


class Actor:
    """Base class. Subclasses define ``async def on_start/on_stop`` and handler methods."""

    name: str = "actor"

    def __init__(self, name: str | None = None):
        if name is not None:
            self.name = name
        self._mailbox: asyncio.Queue[_Message | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._exited: asyncio.Future | None = None
        self._running = False
        self._stopping = False
        self._handling = False
        self._failure: ActorFailed | None = None
        self.ref = ActorRef(self)

    # ----- hooks -------------------------------------------------------------------------
    async def on_start(self) -> None:
        """Runs before the first message; an exception here fails the start."""

    async def on_stop(self) -> None:
        """Runs once when the actor stops, after its owned tasks are cancelled."""

    # ----- owned work ----------------------------------------------------------------------
    def spawn(self, coro: Coroutine, *, name: str | None = None) -> asyncio.Task:
        """Start a task owned by this actor: cancelled on stop; its exception fails the actor."""
        task = asyncio.get_running_loop().create_task(coro, name=name or f"{self.name}:task")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def defer(self, coro: Coroutine) -> Deferred:
        """Answer the current ``ask`` with the result of ``coro`` without holding the mailbox."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:deferred")
        self._tasks.add(task)
        # Errors of a deferred reply belong to the asker, not to the actor.
        task.add_done_callback(self._tasks.discard)
        return Deferred(task)

    def exit(self) -> None:
        """End the actor normally (as ``stop()`` does, from inside)."""
        self._request_stop()

    def fail(self, error: BaseException) -> None:
        """End the actor with ``error`` (its watcher sees ``ActorFailed``)."""
        if self._failure is None:
            self._failure = ActorFailed(self.name, error)
        self._request_stop()

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self._stopping:
            return
        error = task.exception()
        if error is not None:
            # Logged by whoever watches this actor (its supervisor), with the actor's name.
            log.debug("actor %s: owned task %s failed: %r", self.name, task.get_name(), error)
            self.fail(error)

    # ----- lifecycle -------------------------------------------------------------------------
    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        self._exited.add_done_callback(_consume_exception)
        await self.on_start()
        self._running = True
        self._loop_task = loop.create_task(self._run(), name=f"{self.name}:mailbox")

    async def _run(self) -> None:
        current: _Message | None = None
        try:
            while not self._stopping:
                current = await self._mailbox.get()
                if current is None:
                    break
                await self._dispatch(current)
                current = None
        except asyncio.CancelledError:
            # stop() interrupts a running handler: its asker must not wait forever.
            if current is not None and current.reply is not None and not current.reply.done():
                current.reply.set_exception(ActorStopped(f"actor {self.name!r} stopped while handling {current.method!r}"))
        await self._shutdown()

    async def _dispatch(self, message: _Message) -> None:
        self._handling = True
        try:
            await self._handle(message)
        finally:
            self._handling = False

    async def _handle(self, message: _Message) -> None:
        try:
            handler = getattr(self, message.method)
            result = handler(*message.args, **message.kwargs)
            if isinstance(result, Awaitable):
                result = await result
        except Exception as error:  # noqa: BLE001 - handler errors go to the asker or fail us
            if message.reply is not None:
                if not message.reply.done():
                    message.reply.set_exception(error)
            else:
                log.error("actor %s: %s failed: %r", self.name, message.method, error)
                self.fail(error)
            return
        if message.reply is None or message.reply.done():
            return
        if isinstance(result, Deferred):
            _chain(result.task, message.reply)
        else:
            message.reply.set_result(result)

    def _request_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._running = False
        if self._loop_task is not None:
            # The sentinel lets the message being handled now finish first.
            self._mailbox.put_nowait(None)

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.on_stop()
        except Exception as error:  # noqa: BLE001
            log.error("actor %s: on_stop failed: %r", self.name, error)
            if self._failure is None:
                self._failure = ActorFailed(self.name, error)
        # Anything still queued will never run: tell the askers.
        while not self._mailbox.empty():
            pending = self._mailbox.get_nowait()
            if pending is not None and pending.reply is not None and not pending.reply.done():
                pending.reply.set_exception(ActorStopped(f"actor {self.name!r} stopped"))
        # Set last, so a watcher wakes up only after on_stop has cleaned up (children stopped).
        if self._exited is not None and not self._exited.done():
            if self._failure is not None:
                self._exited.set_exception(self._failure)
            else:
                self._exited.set_result(None)

    @property
    def running(self) -> bool:
        return self._running


class ActorRef:
    """The only handle other code holds on an actor."""

    def __init__(self, actor: Actor):
        self._actor = actor

    @property
    def name(self) -> str:
        return self._actor.name

    @property
    def alive(self) -> bool:
        return self._actor.running

    def handles(self, method: str) -> bool:
        """Whether the actor has a handler ``method`` (to tell an optional handler's absence
        from an AttributeError raised inside it)."""
        return callable(getattr(self._actor, method, None)) and not method.startswith("_")

    def _check(self, method: str) -> None:
        if not self._actor.running:
            raise ActorStopped(f"actor {self._actor.name!r} is not running (message {method!r})")
        if not self.handles(method):
            raise AttributeError(f"actor {self._actor.name!r} has no handler {method!r}")

    def tell(self, method: str, *args: Any, **kwargs: Any) -> None:
        self._check(method)
        self._actor._mailbox.put_nowait(_Message(method, args, kwargs))

    async def ask(self, method: str, *args: Any, timeout: float | None = 60.0, **kwargs: Any) -> Any:
        """Call ``method`` inside the actor and return its result (``timeout`` in seconds)."""
        self._check(method)
        reply = asyncio.get_running_loop().create_future()
        self._actor._mailbox.put_nowait(_Message(method, args, kwargs, reply))
        try:
            async with asyncio.timeout(timeout):
                return await reply
        except TimeoutError:
            raise TimeoutError(
                f"ask {self._actor.name}.{method} got no answer within {timeout} s"
            ) from None

    async def stop(self) -> None:
        """Stop the actor now and wait until it has stopped (its failure is not raised here).

        A handler that is running is cancelled; queued messages are answered with ActorStopped.
        """
        actor = self._actor
        actor._request_stop()
        loop_task = actor._loop_task
        if actor._handling and loop_task is not asyncio.current_task():
            loop_task.cancel()
        if actor._exited is not None:
            await asyncio.wait([actor._exited])

    async def wait(self) -> None:
        """Wait for the actor to end; raises ``ActorFailed`` if it ended by failure."""
        if self._actor._exited is None:
            raise ActorStopped(f"actor {self._actor.name!r} was never started")
        await asyncio.shield(self._actor._exited)

    @property
    def actor(self) -> Actor:
        """The actor object itself, for tests and for the process that owns it."""
        return self._actor


async def spawn(actor: Actor) -> ActorRef:
    """Start ``actor`` (runs ``on_start``) and return its reference."""
    await actor._start()
    return actor.ref


def _chain(source: asyncio.Task, target: asyncio.Future) -> None:
    def copy(task: asyncio.Task) -> None:
        if target.done():
            return
        if task.cancelled():
            target.set_exception(ActorStopped("the actor stopped before answering"))
        elif task.exception() is not None:
            target.set_exception(task.exception())
        else:
            target.set_result(task.result())

    source.add_done_callback(copy)


def _consume_exception(future: asyncio.Future) -> None:
    # The exit future is awaited only by a watcher, if any; don't warn when nobody looks.
    if not future.cancelled():
        future.exception()
