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
from collections.abc import Awaitable, Callable, Generator
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

if TYPE_CHECKING:
    pass

__all__ = ["drive", "finish_round", "retrieve"]

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
