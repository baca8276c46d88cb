"""One round's replies and vote count, and what a transport does with each reply (the
NOSCRIPT fallback): the rules both transports follow, written once.

A round sends one command to each node and counts the replies: a reply equal to the
round's ``yes_value`` is a yes vote, any other reply or a failure a no. The outcome is known
once ``need`` said yes, or once more than ``give_up`` said no (by default ``size - need``: a
quorum can no longer be reached), or once every node that was sent a command answered.
"""

from __future__ import annotations

from typing import Any

from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError
from django_redlock.wire.resp import ReplyError
from django_redlock.wire.scripts import Fallback

__all__ = ["RECORD", "RELOAD", "RESEND", "Round", "on_reply"]


class Round:
    """The replies of one round (one command per node) as they come, and its vote count.

    ``results[i]`` is node ``i``'s outcome: its reply, ``None`` (no command was sent to it),
    a :class:`~django_redlock.wire.errors.NodeError`, :data:`TIMED_OUT` (no reply by the
    deadline) or :data:`PENDING` (not waited for: the outcome was known). ``yes`` and ``no``
    count the votes. Once ``closed`` (the round is over), a late reply changes nothing.
    """

    __slots__ = ("closed", "give_up", "need", "no", "pending", "results", "yes", "yes_value")

    def __init__(self, size: int, yes_value: object, need: int, give_up: int | None = None) -> None:
        self.results: list[Any] = [PENDING] * size
        self.pending = 0  # commands sent whose outcome is not recorded yet
        self.closed = False
        self.yes_value = yes_value
        self.need = need
        self.give_up = size - need if give_up is None else give_up
        self.yes = 0
        self.no = 0

    def record(self, index: int, reply: object) -> None:
        """Node ``index``'s reply (or failure) to a command sent in this round; ignored once
        the round is closed. An error reply is passed as a :class:`NodeError` (the caller
        has looked at it already, for :func:`on_reply`)."""
        if self.closed:
            return
        self.results[index] = reply
        self.pending -= 1
        if reply == self.yes_value:
            self.yes += 1
        else:
            self.no += 1

    def refuse(self, index: int, error: NodeError) -> None:
        """Node ``index`` was sent nothing (it could not be reached, or owes too much): a no."""
        self.results[index] = error
        self.no += 1

    def known(self) -> bool:
        """Whether the outcome is known: a quorum said yes, too many said no, or every node
        that was sent a command answered."""
        return self.yes >= self.need or self.no > self.give_up or self.pending <= 0

    def counted_twice(self, twins: dict[int, tuple[int, str]]) -> bool:
        """Count the yes votes again, one per server, once they reach the quorum: True if the
        count fell and the outcome is no longer known, so the caller waits on. ``twins``:
        the nodes that reached an earlier node's server, each with that node's index
        (``Servers.twins`` of wire/servers.py).

        The first round on new connections can send to both twins, their hellos not yet
        answered: without this, two yes from one server would end the round at a "quorum"
        that is one vote short, and the acquire would fail although the other nodes were
        about to say yes.
        """
        if self.yes < self.need or not twins:
            return False
        yes_value = self.yes_value
        servers = {
            twins[index][0] if index in twins else index
            for index, reply in enumerate(self.results)
            if reply == yes_value
        }
        if len(servers) >= self.yes:
            return False
        self.yes = len(servers)
        return not self.known()

    def time_out(self) -> None:
        """The deadline passed with the outcome unknown: every reply still owed is
        :data:`TIMED_OUT` (late replies change nothing from now on)."""
        if not (self.yes >= self.need or self.no > self.give_up):
            results = self.results
            for index, reply in enumerate(results):
                if reply is PENDING:
                    results[index] = TIMED_OUT
        self.closed = True


# What a transport does with a reply to a command sent with a NOSCRIPT fallback (on_reply).
RECORD = 0  # count it for its round (or drop it, the round being over)
RESEND = 1  # send the fallback (EVAL) in its place, and load the scripts again
RELOAD = 2  # too late to run the fallback, not to load: load the scripts again only


def on_reply(reply: object, fallback: Fallback | None, closed: bool) -> int:
    """What to do with ``reply`` to a command sent with ``fallback``, its round ``closed``
    or not: :data:`RESEND` when the node had no copy of the script (after SCRIPT FLUSH, a
    restart, a failover) and the fallback may still run; :data:`RELOAD` when it had none but
    the round is over and the fallback is not ``when_over`` (an acquire's SET re-sent after
    its attempt was given up would land after the clean-up release and leave a key nobody
    releases); :data:`RECORD` otherwise."""
    if fallback is None or type(reply) is not ReplyError or not str(reply).startswith("NOSCRIPT"):
        return RECORD
    return RELOAD if closed and not fallback.when_over else RESEND
