"""One asyncio connection to one node (:class:`AsyncConnection`: a protocol with its FIFO of
reply slots, parsed in ``data_received``), the round a task waits for on it
(:class:`LoopRound`), and the connect itself. :mod:`.connections` keeps one per node per event
loop; :mod:`.subscriber` opens its pub/sub streams with :func:`open_stream`.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django_redlock.wire.acks import AckJoin
from django_redlock.wire.cluster import Redirect, parse_redirect
from django_redlock.wire.cluster_route import (
    ASKING_REPLY,
    Routed,
)
from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.primitives import PRELOAD
from django_redlock.wire.resp import (
    BAD_REPLY,
    PROTOCOL_ERRORS,
    ReplyError,
    make_reader,
)
from django_redlock.wire.rounds import RECORD, RESEND, Round, on_reply
from django_redlock.wire.scripts import Command, Fallback, Script
from django_redlock.wire.sentinel import amaster_of, forget
from django_redlock.wire.setup import (
    CLUSTER_MAP,
    Handshake,
    Hello,
    aresolve,
    is_replica_reply,
    tls_context,
)

__all__ = ["AsyncConnection", "LoopRound", "new_round", "open_stream", "record_reply", "unread"]


async def _connect(
    address: NodeAddress, protocol: asyncio.Protocol, timeout: float
) -> asyncio.BaseTransport:
    """Connect ``protocol`` to ``address`` (unix socket, TCP or TLS) within ``timeout`` s:
    every address the host resolves to (``loop.getaddrinfo``: the loop never blocks on DNS)
    is tried in turn until one connects. A Sentinel node's master is asked of its Sentinels
    first, with asyncio I/O, within the same ``timeout``.

    Raises:
        TimeoutError, OSError: the node cannot be reached or the TLS handshake failed.
        NodeError: the host does not resolve, no Sentinel told the master, or the TLS
            settings are unusable.
    """
    loop = asyncio.get_running_loop()
    context = tls_context(address) if address.tls else None  # built once, outside the deadline
    async with asyncio.timeout(timeout):
        if address.sentinel is not None:
            address = await amaster_of(address, timeout)
        if address.path is not None:
            transport, _ = await loop.create_unix_connection(lambda: protocol, address.path)
            return transport
        error: OSError | None = None
        for family, target in await aresolve(address):
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, target)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            transport, _ = await loop.create_connection(
                lambda: protocol,
                sock=sock,
                ssl=context,
                server_hostname=address.host if context else None,
            )
            return transport
        assert error is not None  # aresolve returns at least one address
        raise error


async def open_stream(
    address: NodeAddress, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream pair to ``address`` (see :func:`_connect`), as ``asyncio.open_connection``
    builds it."""
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport = await _connect(address, protocol, timeout)
    writer = asyncio.StreamWriter(
        transport,  # type: ignore[arg-type]
        protocol,
        reader,
        asyncio.get_running_loop(),
    )
    return reader, writer


def settle(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` (a round trip's outcome) unless it is already decided."""
    if not future.done():
        future.set_result(None)


class LoopRound(Round):
    """A :class:`~django_redlock.wire.rounds.Round` as this transport waits for it: with the
    future its waiting task sleeps on (resolved by the reply that makes the outcome known;
    ``None`` while nobody waits) and its deadline (seconds, the event loop's clock).

    Made by :func:`new_round` (or with both set right after): no ``__init__`` of its own,
    one call fewer per round."""

    __slots__ = ("deadline", "decided")
    decided: asyncio.Future[None] | None
    deadline: float


def new_round(
    size: int, yes_value: object, need: int, give_up: int | None, deadline: float
) -> LoopRound:
    """A :class:`LoopRound` (arguments as :class:`~django_redlock.wire.rounds.Round`'s)
    that nobody waits for yet, due at ``deadline`` (the loop's clock)."""
    answer = LoopRound(size, yes_value, need, give_up)
    answer.decided = None
    answer.deadline = deadline
    return answer


# What each reply a connection owes goes to, in order: (the round, the node's index in it,
# the command's NOSCRIPT fallback, when it was asked: time.monotonic()). A set-up command's
# slot has no round, and the set-up step of its reply (see Handshake.learn) in the index's
# place.
# Tuples, as the sync transport's slots: no closure made per command, no call per reply.
Slot = tuple[LoopRound | None, int, Fallback | None, float]


def record_reply(answer: LoopRound, index: int, reply: object) -> None:
    """:meth:`Round.record <django_redlock.wire.rounds.Round.record>`, then wake the task
    waiting for ``answer`` if its outcome is now known (the usual reply does this inline in
    :meth:`AsyncConnection.data_received`)."""
    answer.record(index, reply)
    decided = answer.decided
    if decided is not None and not decided.done() and answer.known():
        decided.set_result(None)


# Turns of the event loop given to sockets that hold unread bytes before their nodes are
# judged (see LoopConnections._take_in): a turn reads every ready socket, so two suffice;
# the bound only stops a node that never stops sending from holding a round up.
TAKE_IN_TURNS = 4


def unread(conns: Iterable[AsyncConnection]) -> bool:
    """Whether bytes sit unread in any of ``conns``' sockets now (a look, no wait)."""
    poller = select.poll()
    watched = False
    for conn in conns:
        fd = conn.fileno()
        if fd >= 0:
            poller.register(fd, select.POLLIN)
            watched = True
    return watched and bool(poller.poll(0))


class AsyncConnection(Handshake, asyncio.Protocol):
    """One connection to one node: an asyncio protocol with the replies it still owes, in
    order (a slot each: see ``Slot``). Replies are parsed in ``data_received`` and counted
    into their round right there: no reader task, no future or callback per reply, so a round
    trip costs one wake-up of the waiting task. The set-up (login, scripts, hello) is
    :class:`~django_redlock.wire.setup.Handshake`'s.
    """

    def __init__(
        self,
        address: NodeAddress,
        hello: Hello | None,
        preload: Sequence[Script] = PRELOAD,
        classify: bool = False,
        expect_cluster: bool = False,
    ) -> None:
        super().__init__(address, hello, preload, classify, expect_cluster)
        # A shard of a cluster node: what follows a MOVED or ASK answer (LoopConnections).
        self.redirect: Callable[[AsyncConnection, Redirect, Slot], None] | None = None
        # Told once the connection learns its server's mode (plain or a cluster member).
        self.on_classified: Callable[[AsyncConnection], None] | None = None
        self.transport: asyncio.Transport | None = None
        self.pending: deque[Slot] = deque()
        self.parser = make_reader()
        self.broken: str | None = None
        # The task that connects and logs in (set by LoopConnections.connection), and
        # whether it got as far as queueing the login and is not broken since: commands
        # may follow the login from then on (one test for both on the hot path).
        self.opening: asyncio.Task[None] | None = None
        self.ready = False
        # Commands given while the connection opens (command, slot, identify): written, in
        # order, right after the set-up; failed with it if it fails. So a round never awaits
        # a connect: its command goes out as soon as the node can take it, within the
        # opening's timeout, whether or not the caller is still there (issue 39).
        self.queued: list[tuple[bytes, Slot, bool]] = []

    async def open(self, timeout: float) -> None:
        """Connect within ``timeout`` seconds, then queue the set-up commands.
        Never raises for a node that cannot be reached: the connection is marked broken
        instead (and so is it when this task is cancelled, so no one waits on it)."""
        try:
            setup = self.setup_commands()
            await _connect(self.address, self, timeout)
        except (TimeoutError, OSError, ValueError, NodeError) as exc:
            self.fail(str(exc) or "connect timed out")
            return
        except BaseException:
            self.fail("connect cancelled")
            raise
        if self.broken is not None:  # closed (aclose) while it was connecting
            self.fail(self.broken)
            return
        self._set_up(setup)
        self.ready = self.broken is None
        queued, self.queued = self.queued, []
        for command, slot, identify in queued:
            join: Any = slot[0]
            if type(join) is AckJoin:  # a grant for a node with REPLICA_ACKS
                self._send_join(command, join, slot[2], identify)
            else:
                self.send(command, slot, identify)

    def _set_up(self, commands: Iterable[tuple[bytes, int]]) -> None:
        """Send set-up ``commands``, each with the set-up step of its reply (see
        Handshake.learn)."""
        now = time.monotonic()
        for command, step in commands:
            self.send(command, (None, step, None, now))

    def _learn(self, step: int, reply: Any) -> None:
        """A set-up reply: learnt, and what it releases written (see Handshake.learn)."""
        try:
            out = self.learn(step, reply)
        except NodeError as exc:  # AUTH or SELECT refused: the connection is useless
            self.fail(str(exc))
            return
        if step == CLUSTER_MAP and self.on_classified is not None:
            self.on_classified(self)
            if self.switched:
                return  # not the mode expected: what it held went elsewhere
        if out and self.transport is not None and self.broken is None:
            self.transport.write(out)

    def reload(self) -> None:
        """Load the scripts again (the node answered NOSCRIPT)."""
        self._set_up(self.reload_commands())

    def fileno(self) -> int:
        """The socket's file descriptor, or -1 when there is none (not connected, closed)."""
        if self.transport is None or self.broken is not None:
            return -1
        sock = self.transport.get_extra_info("socket")
        return -1 if sock is None else int(sock.fileno())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        parser.feed(data)
        pending = self.pending
        while True:
            try:
                reply = parser.gets()
            except PROTOCOL_ERRORS:
                self.fail(BAD_REPLY)
                return
            if reply is False:
                return
            if not pending:
                continue  # nothing owed (the connection failed meanwhile): dropped
            slot = pending.popleft()
            answer = slot[0]
            if answer is None or reply.__class__ is ReplyError:
                self._unusual(reply, slot)
            elif not answer.closed:  # a late reply is dropped here: no call on the hot path
                # Round.record and Round.known inlined (two calls fewer per reply).
                answer.results[slot[1]] = reply
                answer.pending -= 1
                if reply == answer.yes_value:
                    answer.yes += 1
                else:
                    answer.no += 1
                decided = answer.decided
                if (
                    decided is not None
                    and (
                        answer.yes >= answer.need
                        or answer.no > answer.give_up
                        or answer.pending <= 0
                    )
                    and not decided.done()
                ):
                    decided.set_result(None)

    def _unusual(self, reply: Any, slot: Slot) -> None:
        """A set-up reply, or an error reply: learnt, or the EVAL fallback re-sent and the
        scripts loaded again (NOSCRIPT: see :func:`~django_redlock.wire.rounds.on_reply`),
        or the error recorded as the node's answer."""
        answer, index, fallback, _ = slot
        if answer is None:
            self._learn(index, reply)
            return
        if self.redirect is not None and isinstance(fallback, Routed):
            redirect = parse_redirect(str(reply))
            if redirect is not None:
                self.redirect(self, redirect, slot)
                return
        action = on_reply(reply, fallback, answer.closed)
        if action == RECORD:
            record_reply(answer, index, NodeError(str(reply)))
            if is_replica_reply(reply):
                # A replica answers: the next connection reads the identity afresh, and a
                # Sentinel node asks where its master is now (as the sync transport does).
                self.met_replica = True
                self.fail("the node is a replica: connection dropped")
            return
        assert fallback is not None  # on_reply resends only a fallback
        if action == RESEND:
            self.send(fallback.build(), (answer, index, None, time.monotonic()), fallback.identify)
        self.reload()

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(str(exc) if exc else "connection closed by the server")

    def send(self, command: bytes, slot: Slot, identify: bool = False) -> None:
        """Write ``command``; its reply (or a :class:`NodeError`) goes where ``slot`` says.
        With ``identify``, the connection's identity completes it (see Handshake.outgoing).
        :meth:`LoopConnections._expect` is this for a round's command (inlined there)."""
        if self.broken is not None:
            answer = slot[0]
            if answer is not None:
                record_reply(answer, slot[1], NodeError(self.broken))
            return
        transport = self.transport
        if transport is None or (not self.ready and slot[0] is not None):
            # Still opening: written once it is open (a set-up command, which names no
            # round, is written by the opening itself, before it is ready).
            self.queued.append((command, slot, identify))
            return
        self.pending.append(slot)
        if slot[0] is None and self.classifying and slot[1] != ASKING_REPLY:
            # A set-up command (the question itself among them) is never held behind the
            # answer to whether the node is a cluster; an ASKING is (it goes with the very
            # command that follows it, held too).
            transport.write(command)
            return
        command = self.outgoing(command, identify)
        if not command:
            return  # held until the hello is answered
        transport.write(command)

    def send_acked(
        self,
        command: Command,
        answer: LoopRound,
        index: int,
        now: float,
        identify: bool,
        timeout_ms: int,
    ) -> None:
        """Send grant or renewal ``command`` for node ``index`` of ``answer``, followed by
        its WAIT (this node has REPLICA_ACKS): two replies, one answer (wire/acks.py)."""
        assert self.acks is not None
        fallback = command[1]
        assert fallback is not None  # a grant's or a renewal's (acked_round)
        join = AckJoin(answer, index, self.acks, timeout_ms, fallback.acked_yes, record_reply)
        if self.broken is not None:
            record_reply(answer, index, NodeError(self.broken))
            return
        if self.transport is None or not self.ready:
            # Still opening: written once it is open (a failure records into the join).
            slot: Any = (join, index, fallback, now)
            self.queued.append((command[0], slot, identify))
            return
        self._send_join(command[0], join, fallback, identify)

    def _send_join(
        self, command: bytes, join: AckJoin, fallback: Fallback | None, identify: bool
    ) -> None:
        assert self.transport is not None
        now = time.monotonic()
        slots: list[Any] = [(join.script, 0, fallback, now), (join, join.index, None, now)]
        self.pending.extend(slots)
        self.transport.write(self.acked(command, identify, join.timeout_ms))

    def age(self, now: float) -> float:
        """Seconds since the oldest reply still owed was asked (0 when none is owed)."""
        pending = self.pending
        return now - pending[0][3] if pending else 0.0

    def fail(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
            # Lost, or met a replica: a Sentinel node's next connection asks its Sentinels.
            forget(self.address, stale=self.met_replica)
        self.ready = False
        queued, self.queued = self.queued, []
        for _, (answer, index, _, _), _ in queued:
            if answer is not None:
                record_reply(answer, index, NodeError(reason))
        pending = self.pending
        while pending:
            answer, index, _, _ = pending.popleft()
            # A set-up reply that never comes has nothing to teach (Handshake.learn).
            if answer is not None:
                record_reply(answer, index, NodeError(reason))
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        self.fail("connection closed by the client")
