"""When a node that owes replies is skipped, queued behind, or given a new connection: the
stall rule of both transports, written once.

A count alone cannot tell a stalled node from a busy one (see :func:`refusal`), so a node is
judged by the age of its oldest unanswered request. Past ``stall_reset`` seconds its
connection is replaced (a black hole: open, never answering); past ``max_outstanding`` owed
replies, the oldest older than ``stall_age``, it gets no new command. A command sent with
``queue_behind`` (a release, a clean-up) is queued behind what the node owes instead, up to
:data:`ROOM` times ``max_outstanding`` replies.
"""

from __future__ import annotations

__all__ = ["MAX_OUTSTANDING", "ROOM", "StallRule", "refusal", "stall_limits"]

MAX_OUTSTANDING = 32
"""Replies a node may owe before :func:`refusal` looks at how late they are."""

# Clean-ups and queued releases go behind up to this many times ``max_outstanding`` owed
# replies: twice the most that ``refusal`` lets a node owe, so a command sent under that bound
# always finds room for its clean-up behind it.
ROOM = 8


def stall_limits(node_timeout: float) -> dict[str, float]:
    """The transports' stall settings for a manager whose nodes have ``node_timeout``
    seconds per command, as keyword arguments of ``ConnectionSet`` and ``LoopConnections``:
    a reply owed longer than the node timeout is late (``stall_age``), and a node that owes
    one for ``max(1 s, 20 node timeouts)`` gets a fresh connection (``stall_reset``; the old
    one is closed, so the count stays bounded and a half-open socket cannot block it forever).
    """
    return {"stall_reset": max(1.0, 20 * node_timeout), "stall_age": node_timeout}


def refusal(owed: int, age: float, cap: int, stall_age: float) -> str | None:
    """Why a node that owes ``owed`` replies, the oldest asked ``age`` seconds ago, gets no
    new command now; None when it may have one.

    A count alone cannot tell a stalled node from a busy one: a node that answers in order
    but a little behind (a server descheduled for a few milliseconds on a loaded machine)
    owes many replies while each of them is young. So past ``cap`` owed replies a node is
    stalled only when its oldest owed reply is older than ``stall_age`` (a node timeout: by
    then the reply is late by the lock's own measure). At ``4 * cap`` it is skipped whatever
    the age, a bound on what a client queues for one node.
    """
    if owed < cap:
        return None
    if owed < 4 * cap and age <= stall_age:
        return None
    return f"stalled: {owed} replies outstanding, the oldest for {age * 1000:.0f} ms"


class StallRule:
    """One transport's stall settings and the judgements made with them.

    Args:
        max_outstanding: replies a node may owe before it is judged by the age of the
            oldest (see :func:`refusal`).
        stall_reset: seconds a node may owe a reply before its connection is replaced.
        stall_age: seconds past which an owed reply is late (default: ``stall_reset / 20``,
            the manager's node timeout).
    """

    __slots__ = ("max_outstanding", "room_for", "stall_age", "stall_reset")

    def __init__(
        self, max_outstanding: int, stall_reset: float, stall_age: float | None = None
    ) -> None:
        self.max_outstanding = max_outstanding
        self.stall_reset = stall_reset
        self.stall_age = stall_reset / 20 if stall_age is None else stall_age
        # Owed replies past which even a command sent with ``queue_behind`` is not queued.
        self.room_for = ROOM * max_outstanding

    def judged(self, owed: int, age: float, queue_behind: bool = False) -> bool:
        """Whether a node owing ``owed`` replies, the oldest ``age`` seconds old, is about to
        be judged by them: replaced (see :meth:`reset`) or, unless the command may queue
        behind (:meth:`room`), skipped. A transport reads what that node already sent
        before it judges it (this client may have been away while the replies came)."""
        if age > self.stall_reset:
            return True
        if queue_behind and self.room(owed, age):
            return False
        return owed >= self.max_outstanding and self.refusal(owed, age) is not None

    def reset(self, age: float) -> bool:
        """Whether a connection whose oldest owed reply is ``age`` seconds old is replaced."""
        return age > self.stall_reset

    def refusal(self, owed: int, age: float) -> str | None:
        """Why a node owing ``owed`` replies (the oldest ``age`` seconds old) is skipped
        now, or None (see :func:`refusal`)."""
        return refusal(owed, age, self.max_outstanding, self.stall_age)

    def room(self, owed: int, age: float) -> bool:
        """Whether a command sent with ``queue_behind`` (a release, a clean-up) is queued on
        a connection owing ``owed`` replies, the oldest ``age`` seconds old, instead of
        judging the node: below :data:`ROOM` times ``max_outstanding`` and not past the
        stall reset."""
        return owed < self.room_for and age <= self.stall_reset
