"""The asyncio driver: carries out a procedure's effects (``django_redlock.procedures``) on
the asyncio transport (``wire.asyncio``: one event loop's connections and subscriber), awaiting
what waits. It decides nothing: every step is the procedure's.

Cancellation: a ``CancelledError`` raised while an effect is awaited is thrown into the
procedure like any error, so its clean-ups (posts, written at once with no await) go out
before the task ends cancelled: a cancelled acquire owns nothing and leaves its line.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import weakref
from collections.abc import Awaitable, Callable, Generator
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from django_redlock.procedures.effects import (
    Effect,
    Grants,
    Listen,
    Post,
    Round,
    Sleep,
    Subscribe,
    Wait,
    unwind,
)
from django_redlock.wire.asyncio.connections import LoopConnections
from django_redlock.wire.rounds import Round as RoundState
from django_redlock.wire.stall import MAX_OUTSTANDING, stall_limits

if TYPE_CHECKING:
    from django_redlock.core.engine import Engine

__all__ = ["PerLoop", "drive", "finish_round", "keep_with_loop", "retrieve"]

logger = logging.getLogger("django_redlock")

_R = TypeVar("_R")


async def drive(
    procedure: Generator[Effect, Any, _R],
    connections: LoopConnections,
    node_timeout: float,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> _R:
    """Run ``procedure`` to its end on ``connections`` (each node's wait bounded by
    ``node_timeout`` seconds) and return what it returns. ``sleep``: how a :class:`Sleep`
    sleeps (default ``asyncio.sleep``).

    Raises:
        whatever the procedure raises; an error raised while carrying out an effect (a
        cancellation) is thrown into the procedure first, so its clean-ups go out.
    """
    send = procedure.send
    value: Any = None
    error: BaseException | None = None
    waiter = ""
    try:
        while True:
            try:
                effect = send(value) if error is None else procedure.throw(error)
            except StopIteration as done:
                result: _R = done.value
                return result
            error = None
            try:
                if type(effect) is Round:
                    value = await connections.run(
                        effect.commands,
                        node_timeout,
                        effect.yes,
                        effect.need,
                        give_up=effect.give_up,
                        identify=effect.identify,
                        queue_behind=effect.queue_behind,
                    )
                elif type(effect) is Post:
                    connections.post(effect.commands)
                    value = None
                elif type(effect) is Listen:
                    # Registered until the procedure ends (below), whatever way it ends.
                    value = waiter = connections.subscriber.waiter_id()
                elif type(effect) is Sleep:
                    await (asyncio.sleep if sleep is None else sleep)(effect.delay)
                    value = None
                elif type(effect) is Subscribe:
                    value = await connections.subscriber.subscribe(
                        effect.key, node_timeout, effect.waiter
                    )
                elif type(effect) is Wait:
                    value = await connections.subscriber.wait(
                        effect.waiter, effect.delay, effect.need, node_timeout
                    )
                elif type(effect) is Grants:
                    value = connections.subscriber.grants(effect.waiter)
                else:  # pragma: no cover - a procedure yields only effects
                    raise TypeError(f"not an effect: {effect!r}")
            except BaseException as raised:
                value = None
                error = raised
    except BaseException as escaping:
        # Raised in this frame between two effects (a signal handler's interrupt at the
        # loop's back edge), not thrown into the procedure above: its clean-ups go out now.
        unwind(procedure, escaping, connections.post)
        raise
    finally:
        # Not kept in this frame, which the error's traceback refers to: a cycle the
        # collector would have to find (a lease held by a task frame stays untracked).
        error = None
        if waiter:
            connections.subscriber.unregister(waiter)


def retrieve(task: asyncio.Future[Any]) -> None:
    """Done-callback of a task that outlived its cancelled caller (a release): read its
    outcome so asyncio does not report it as never retrieved (a LockLost is already logged
    and told to the observer by the release itself)."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("release finished after its caller was cancelled: %s", task.exception())


async def finish_round(
    connections: LoopConnections,
    effect: Round,
    node_timeout: float,
    then: Callable[[RoundState], None],
) -> None:
    """Carry out the round ``effect`` (a release: ``Round.queue_behind``) and ``then`` its
    judgement, whatever happens to the calling task: the commands are written before the
    first await when no node needs one first (connected, nothing to read:
    ``LoopConnections.send_now``), and a cancellation while their replies are awaited leaves
    the rest (the replies, the judgement, a LockLost reported) to a task of its own.
    Otherwise (a node to connect first) the whole of it runs in a task of its own, shielded.
    """
    sent = connections.send_now(
        effect.commands,
        node_timeout,
        effect.yes,
        effect.need,
        give_up=effect.give_up,
        identify=effect.identify,
        queue_behind=True,
    )
    if sent is None:
        rest = asyncio.ensure_future(_run_then(connections, effect, node_timeout, then))
        try:
            await asyncio.shield(rest)
        except asyncio.CancelledError:
            rest.add_done_callback(retrieve)
            raise
        return
    try:
        exchange = await connections.outcome(sent, keep_open=True)
    except asyncio.CancelledError:
        # The commands are out; the round stays open for this task of its own.
        rest = asyncio.ensure_future(_outcome_then(connections, sent, then))
        rest.add_done_callback(retrieve)
        raise
    then(exchange)


async def _run_then(
    connections: LoopConnections,
    effect: Round,
    node_timeout: float,
    then: Callable[[RoundState], None],
) -> None:
    """:func:`finish_round` when a node needs connecting (or reading) before the send."""
    exchange = await connections.run(
        effect.commands,
        node_timeout,
        effect.yes,
        effect.need,
        give_up=effect.give_up,
        identify=effect.identify,
        queue_behind=True,
    )
    then(exchange)


async def _outcome_then(
    connections: LoopConnections, sent: RoundState, then: Callable[[RoundState], None]
) -> None:
    """The rest of a release round whose caller was cancelled after the send."""
    then(await connections.outcome(sent))


# Seconds: how far off the timer that keeps a task (keep_with_loop) is set where a loop
# takes no infinite time (uvloop's timers are whole milliseconds): a year.
_A_YEAR = 365 * 24 * 3600.0


def keep_with_loop(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
    """Have ``loop`` keep ``task`` while the loop is open and the task is not done (a loop
    holds its tasks only weakly), through a timer that never fires: closing the loop drops
    its timers, so a loop closed on the task, kept or not, keeps nothing of it. Not a module
    global (which a loop closed with the task pending would leave holding it for ever), nor
    the loop's ``__dict__`` (which a closed loop still referenced would hold)."""
    try:
        keeper = loop.call_at(math.inf, task.cancel)
    except (OverflowError, ValueError):  # a loop whose timers must be finite
        keeper = loop.call_later(_A_YEAR, task.cancel)
    task.add_done_callback(lambda _: keeper.cancel())


class PerLoop:
    """One engine's asyncio connections, one :class:`LoopConnections` per event loop that
    used them (an asyncio manager's), each closed when its loop ends."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopConnections] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        # The loop (weakly) and connections get found last: most calls come from the same
        # loop as the one before, and need no lock and no lookup. One attribute, read at
        # once, so a thread running another loop sees a pair or the other, never a mix.
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], LoopConnections] | None = None

    def __len__(self) -> int:
        """How many loops have connections open here."""
        return len(self._loops)

    def get(self, keep: object) -> LoopConnections:
        """The running loop's connections, opened on first use; ``keep`` (the manager) is
        kept alive by them until the loop ends.

        Raises:
            RuntimeError: no running event loop.
        """
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1]
        with self._lock:
            connections = self._loops.get(loop)
            if connections is None:
                # The entries of loops closed with their guard pending (a loop closed on
                # pending tasks, never cancelled): an entry's connections refer to its loop,
                # so it would never leave this weakly keyed map, and with it the futures of
                # the tasks left waiting, those tasks and the leases they hold. Their
                # transports cannot be closed through a closed loop: they close as they are
                # freed.
                for closed in [other for other in self._loops if other.is_closed()]:
                    del self._loops[closed]
                engine = self._engine
                connections = LoopConnections(
                    engine.addresses,
                    engine.hello,
                    max_outstanding=MAX_OUTSTANDING,
                    **stall_limits(engine.node_timeout),
                )
                self._loops[loop] = connections
                # Closes the connections when the loop's tasks are cancelled at its end
                # (asyncio.run does that): protocols have no reader task that would.
                guard = loop.create_task(connections.close_at_loop_end())
                connections.guard = guard
                # The guard belongs to the loop, and the entry keeps the guard: forgotten
                # with it, or every ended loop (one per asyncio.run, or per async_to_sync
                # call) would stay in memory with its connections. Its callback keeps
                # ``keep`` (a manager whose leases hold it weakly) while the loop runs.
                guard.add_done_callback(partial(self._forget, connections, keep))
                # Kept by the loop while it is open: otherwise a manager nobody else keeps
                # would be freed with its guard, pending, while the loop still runs.
                keep_with_loop(loop, guard)
            self._last = (weakref.ref(loop), connections)
        return connections

    def _forget(
        self, connections: LoopConnections, keep: object, guard: asyncio.Task[None]
    ) -> None:
        """Drop the entry of the loop whose ``guard`` ended (its connections are closed)."""
        with self._lock:
            loop = guard.get_loop()
            if self._loops.get(loop) is connections:
                del self._loops[loop]
            last = self._last
            if last is not None and last[1] is connections:
                self._last = None
