"""The sync driver: carries out a procedure's effects (``django_redlock.procedures``) on the
sync transport (``wire.sync.connections``: a thread's connections and the shared subscriber),
blocking the calling thread. It decides nothing: every step is the procedure's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

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
from django_redlock.wire.sync.connections import ConnectionSet

__all__ = ["drive"]

_R = TypeVar("_R")


def drive(
    procedure: Generator[Effect, Any, _R],
    connections: ConnectionSet,
    node_timeout: float,
    sleep: Callable[[float], None] | None = None,
) -> _R:
    """Run ``procedure`` to its end on ``connections`` (each node's wait bounded by
    ``node_timeout`` seconds) and return what it returns. ``sleep``: how a :class:`Sleep`
    sleeps (default ``time.sleep``).

    Raises:
        whatever the procedure raises; an error raised while carrying out an effect (an
        interrupt) is thrown into the procedure first, so its clean-ups go out.
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
                    value = connections.run(
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
                    (time.sleep if sleep is None else sleep)(effect.delay)
                    value = None
                elif type(effect) is Subscribe:
                    value = connections.subscriber.subscribe(
                        effect.key,
                        node_timeout,
                        effect.waiter,
                    )
                elif type(effect) is Wait:
                    value = connections.subscriber.wait(
                        effect.waiter,
                        effect.delay,
                        effect.need,
                        node_timeout,
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
            # Its channel may now be unsubscribed by another thread, once nobody listens on
            # it (the subscriber counts the listeners of each channel).
            connections.subscriber.unregister(waiter)
