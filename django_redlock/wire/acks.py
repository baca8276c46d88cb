"""Replica acknowledgement (the node setting ``REPLICA_ACKS``): a grant or a renewal on such a
node counts only once ``WAIT`` confirms that the node's replicas have it.

Why (issue 39): replication is asynchronous, so a lock a master granted may never reach the
replica promoted in its place; without acknowledgement that replica must sit out a quarantine
(``scripts/node_rule.lua``). With it, every grant that counted is on the replicas, and a
promoted one votes at once (the argument is in ``node_rule.lua``'s header).

On the wire, one round trip: the acquire's (or renewal's) EVALSHA gets two more arguments,
``REPLICA_ACKS`` and the replica count ``need`` this client waits for
(``scripts/replica_acks.lua`` refuses the grant when ``need`` is not max(REPLICA_ACKS, the
node's claim, the replicas online), and says the right count), and ``WAIT <need> <ms>``
follows it in the same write. The script's reply and WAIT's are read into one answer for the
node (:class:`AckJoin`): the script's, when WAIT counted ``need`` replicas; else an error,
which is a no and sends the attempt's clean-up release to the node. ``<ms>`` is four fifths
of the node timeout: WAIT answers before the round's deadline, and a stalled replica costs
one node timeout, never a hang (redisson #4798). Nothing of this runs for a node without
the setting: both transports take this path only for a round of acquires or renewals on a
manager with such a node.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError
from django_redlock.wire.rounds import Round

__all__ = ["AckJoin", "AckState", "acked_round", "replicas_online", "wait_ms"]

_NEVER = object()  # the yes_value of the script's own slot: never a vote
_NEED = re.compile(r"^REPLICA_ACKS need (\d+)")


def _bulk(number: int) -> bytes:
    digits = b"%d" % number
    return b"$%d\r\n%s\r\n" % (len(digits), digits)


def wait_ms(timeout: float) -> int:
    """How long WAIT may block, in ms, for a round of ``timeout`` seconds: four fifths of it
    (its reply then comes before the round's deadline), at least 1 (``WAIT n 0`` would block
    for ever)."""
    return max(1, int(timeout * 800))


def replicas_online(info: object) -> int:
    """The replicas online in an ``INFO replication`` reply (a ``state=online`` line each)."""
    return info.count(b"state=online") if isinstance(info, bytes) else 0


def acked_round(commands: Sequence[Any]) -> bool:
    """Whether ``commands`` (one round's: the same command on every node) are grants or renewals
    that a node with REPLICA_ACKS must have acknowledged (their fallback says so)."""
    for command in commands:
        if command is not None:
            fallback = command[1]
            return fallback is not None and bool(fallback.acked_yes)
    return False


class _ScriptReply(Round):
    """Where the script's own reply goes: a round of one that never votes (and that nobody
    waits for: the asyncio transport's inline path looks for ``decided``)."""

    __slots__ = ()
    decided = None


class AckState:
    """What one connection to a node with REPLICA_ACKS sends after each acquire or renewal.

    Attributes:
        acks: the node's REPLICA_ACKS (replicas, >= 1).
        need: the replica count WAIT asks for: ``acks`` at first, the replicas online when the
            connection read INFO replication, then what the node's script says
            (``REPLICA_ACKS need <n>``: re-read at every grant, redisson #6518).
    """

    __slots__ = ("acks", "need")

    def __init__(self, acks: int) -> None:
        self.acks = acks
        self.need = acks

    def saw_online(self, online: int) -> None:
        """The connection's INFO replication listed ``online`` replicas online."""
        self.need = max(self.acks, online)

    def tail(self, timeout_ms: int) -> tuple[bytes, bytes]:
        """The two arguments that end the script's command, and the WAIT that follows it."""
        need = self.need
        wait = b"*3\r\n$4\r\nWAIT\r\n" + _bulk(need) + _bulk(timeout_ms)
        return _bulk(self.acks) + _bulk(need), wait

    def command(self, command: bytes, identity: bytes, timeout_ms: int) -> bytes:
        """``command`` (an EVALSHA whose header counts ``identity``'s arguments if any), then
        ``identity``, this client's REPLICA_ACKS and count, then the WAIT."""
        end = command.index(b"\r\n")
        arguments, wait = self.tail(timeout_ms)
        header = b"*%d" % (int(command[1:end]) + 2)
        return header + command[end:] + identity + arguments + wait


class AckJoin(Round):
    """The slot of WAIT's reply, which completes node ``index``'s answer in ``round``.

    Both transports count a reply into its round inline (``results[i] = reply``, then the
    counters): this object takes those writes, so the usual path stays as it is. The script's
    reply goes to :attr:`script` (a round of one that never votes); WAIT's reply, or the
    failure that ends the connection, makes the node's answer (:meth:`finish`), recorded into
    ``round`` by ``wake`` (the transport's recorder: it also wakes an asyncio waiter).
    A Round by type, so that it fills any slot; none of Round's own state is used but the
    counters the inline path writes.
    """

    __slots__ = ("granted", "index", "round", "script", "state", "timeout_ms", "wake")
    yes_value = _NEVER  # never a vote of its own
    decided = None  # the asyncio transport's inline path looks for it

    def __init__(
        self,
        round_: Round,
        index: int,
        state: AckState,
        timeout_ms: int,
        granted: tuple[object, ...],
        wake: Callable[[Any, int, object], None],
    ) -> None:
        self.round = round_
        self.granted = granted  # the script's replies that grant or renew (acked_yes)
        self.index = index
        self.script = _ScriptReply(1, _NEVER, 1)
        self.script.pending = 1
        self.state = state
        self.timeout_ms = timeout_ms
        self.wake = wake
        self.yes = self.no = self.pending = 0

    @property
    def closed(self) -> bool:
        return self.round.closed

    @closed.setter
    def closed(self, _value: bool) -> None:
        pass  # only its round closes

    @property
    def results(self) -> AckJoin:  # type: ignore[override]
        return self  # ``results[index] = reply`` lands in __setitem__

    def __setitem__(self, _index: int, reply: object) -> None:
        self.finish(reply)

    def record(self, _index: int, reply: object) -> None:
        """An error reply to WAIT, or the connection's failure: the node's answer too."""
        self.finish(reply)

    def finish(self, wait_reply: object) -> None:
        """Record node ``index``'s answer: the script's reply when it is no grant (a refusal,
        an error: as it is) or when WAIT counted the replicas needed; else why not."""
        reply = self.script.results[0]
        if isinstance(reply, NodeError):
            found = _NEED.match(str(reply))
            if found:
                self.state.need = int(found[1])  # the next try waits for that many
        elif reply is PENDING or reply is TIMED_OUT:
            # NOSCRIPT: the EVAL went again (wire/rounds.py) behind this WAIT, so WAIT
            # confirmed nothing of it; the scripts are being loaded again.
            reply = NodeError(
                "REPLICA_ACKS: the node had lost the script (NOSCRIPT); not counted this round"
            )
        elif reply in self.granted:
            if isinstance(wait_reply, NodeError):
                reply = NodeError(
                    f"REPLICA_ACKS is set for this node, but WAIT failed ({wait_reply}): a "
                    "grant there counts only once its replicas acknowledge it; remove "
                    "REPLICA_ACKS for a node whose provider refuses WAIT"
                )
            elif type(wait_reply) is not int or wait_reply < self.state.need:
                reply = NodeError(
                    f"REPLICA_ACKS: {wait_reply} of {self.state.need} replicas acknowledged "
                    f"within {self.timeout_ms} ms: not counted"
                )
        self.wake(self.round, self.index, reply)
