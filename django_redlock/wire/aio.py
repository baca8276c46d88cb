"""The asyncio transport: per event loop, one connection per node, shared by every task.

A command is written to every node at once (one round trip whatever N); each connection has a
FIFO of reply slots (the round and node each owed reply counts for), taken in order as replies
are parsed in ``data_received``, so replies can never be handed to the wrong command, and
commands of many tasks pipeline on one socket. The outcome is known at a quorum of yes votes,
or once a quorum is no longer possible; a node that owes too many replies is skipped without
sending. A round needs no await before its send once every node is connected (``send_now``),
and one timer per loop watches the deadlines of all the rounds waited for. Waiting tasks are
woken by the release through per-loop pub/sub streams (:class:`LoopSubscriber`).

:class:`LoopConnections` is a :class:`~django_redlock.wire.transport.AsyncTransport`, and
:class:`LoopSubscriber` an :class:`~django_redlock.wire.transport.AsyncWakeSubscriber`: the
same methods as the sync transport's, written in :mod:`~django_redlock.wire.transport`.

Why not ``redis.asyncio``: five ``evalsha`` calls under ``asyncio.gather`` cost 1.2 ms a pair
or more on this project's benchmark machine, three times this transport or more, and its
clients retry by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from django_redlock.wire.acks import AckJoin, acked_round, wait_ms
from django_redlock.wire.cluster import Redirect, parse_redirect
from django_redlock.wire.cluster_route import (
    ASKING,
    ASKING_REPLY,
    MAX_HOPS,
    ClusterRoute,
    Endpoint,
    Routed,
    channel_on,
    known,
    remember,
    shards_reply_map,
)
from django_redlock.wire.errors import PENDING, NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.primitives import PRELOAD
from django_redlock.wire.resp import (
    BAD_REPLY,
    PROTOCOL_ERRORS,
    ReplyError,
    encode_command,
    make_reader,
)
from django_redlock.wire.rounds import RECORD, RESEND, Round, on_reply
from django_redlock.wire.scripts import Command, Commands, Fallback, Script, fire_and_forget
from django_redlock.wire.sentinel import Watch, amaster_of, forget, watch
from django_redlock.wire.servers import keep_apart
from django_redlock.wire.setup import (
    CLUSTER_MAP,
    UNIDENTIFIED,
    Handshake,
    Hello,
    aresolve,
    is_replica_reply,
    login_commands,
    shard_hello,
    tls_context,
    warm_tls,
)
from django_redlock.wire.stall import StallRule
from django_redlock.wire.waking import (
    hear_message,
    new_listener_id,
    new_waiter_id,
    note_grant,
    wake_channel,
)

__all__ = ["LoopConnections", "LoopSubscriber"]


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


async def _open_stream(
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


def _settle(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` (a round trip's outcome) unless it is already decided."""
    if not future.done():
        future.set_result(None)


class _LoopRound(Round):
    """A :class:`~django_redlock.wire.rounds.Round` as this transport waits for it: with the
    future its waiting task sleeps on (resolved by the reply that makes the outcome known;
    ``None`` while nobody waits) and its deadline (seconds, the event loop's clock).

    Made by :func:`_new_round` (or with both set right after): no ``__init__`` of its own,
    one call fewer per round."""

    __slots__ = ("deadline", "decided")
    decided: asyncio.Future[None] | None
    deadline: float


def _new_round(
    size: int, yes_value: object, need: int, give_up: int | None, deadline: float
) -> _LoopRound:
    """A :class:`_LoopRound` (arguments as :class:`~django_redlock.wire.rounds.Round`'s)
    that nobody waits for yet, due at ``deadline`` (the loop's clock)."""
    answer = _LoopRound(size, yes_value, need, give_up)
    answer.decided = None
    answer.deadline = deadline
    return answer


# What each reply a connection owes goes to, in order: (the round, the node's index in it,
# the command's NOSCRIPT fallback, when it was asked: time.monotonic()). A set-up command's
# slot has no round, and the set-up step of its reply (see Handshake.learn) in the index's
# place.
# Tuples, as the sync transport's slots: no closure made per command, no call per reply.
_Slot = tuple[_LoopRound | None, int, Fallback | None, float]


def _record(answer: _LoopRound, index: int, reply: object) -> None:
    """:meth:`Round.record <django_redlock.wire.rounds.Round.record>`, then wake the task
    waiting for ``answer`` if its outcome is now known (the usual reply does this inline in
    :meth:`_AsyncConnection.data_received`)."""
    answer.record(index, reply)
    decided = answer.decided
    if decided is not None and not decided.done() and answer.known():
        decided.set_result(None)


# Turns of the event loop given to sockets that hold unread bytes before their nodes are
# judged (see LoopConnections._take_in): a turn reads every ready socket, so two suffice;
# the bound only stops a node that never stops sending from holding a round up.
_TAKE_IN_TURNS = 4


def _unread(conns: Iterable[_AsyncConnection]) -> bool:
    """Whether bytes sit unread in any of ``conns``' sockets now (a look, no wait)."""
    poller = select.poll()
    watched = False
    for conn in conns:
        fd = conn.fileno()
        if fd >= 0:
            poller.register(fd, select.POLLIN)
            watched = True
    return watched and bool(poller.poll(0))


class _AsyncConnection(Handshake, asyncio.Protocol):
    """One connection to one node: an asyncio protocol with the replies it still owes, in
    order (a slot each: see ``_Slot``). Replies are parsed in ``data_received`` and counted
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
    ) -> None:
        super().__init__(address, hello, preload, classify)
        # A shard of a cluster node: what follows a MOVED or ASK answer (LoopConnections).
        self.redirect: Callable[[_AsyncConnection, Redirect, _Slot], None] | None = None
        # A node not classified yet: told once the connection learns what its node is.
        self.on_classified: Callable[[_AsyncConnection], None] | None = None
        self.transport: asyncio.Transport | None = None
        self.pending: deque[_Slot] = deque()
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
        self.queued: list[tuple[bytes, _Slot, bool]] = []

    async def open(self, timeout: float) -> None:
        """Connect within ``timeout`` seconds, then queue the set-up commands.
        Never raises for a node that cannot be reached: the connection is marked broken
        instead (and so is it when this task is cancelled, so no one waits on it)."""
        try:
            setup = self.setup_commands()
            await _connect(self.address, self, timeout)
        except (TimeoutError, OSError, ValueError, NodeError) as exc:
            self._fail(str(exc) or "connect timed out")
            return
        except BaseException:
            self._fail("connect cancelled")
            raise
        if self.broken is not None:  # closed (aclose) while it was connecting
            self._fail(self.broken)
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
            self._fail(str(exc))
            return
        if step == CLUSTER_MAP and self.on_classified is not None:
            self.on_classified(self)
            if self.cluster_shards is not None:
                return  # a cluster member: what it held went to the shards
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
                self._fail(BAD_REPLY)
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

    def _unusual(self, reply: Any, slot: _Slot) -> None:
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
            _record(answer, index, NodeError(str(reply)))
            if is_replica_reply(reply):
                # A replica answers: the next connection reads the identity afresh, and a
                # Sentinel node asks where its master is now (as the sync transport does).
                self.met_replica = True
                self._fail("the node is a replica: connection dropped")
            return
        assert fallback is not None  # on_reply resends only a fallback
        if action == RESEND:
            self.send(fallback.build(), (answer, index, None, time.monotonic()), fallback.identify)
        self.reload()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(str(exc) if exc else "connection closed by the server")

    def send(self, command: bytes, slot: _Slot, identify: bool = False) -> None:
        """Write ``command``; its reply (or a :class:`NodeError`) goes where ``slot`` says.
        With ``identify``, the connection's identity completes it (see Handshake.outgoing).
        :meth:`LoopConnections._expect` is this for a round's command (inlined there)."""
        if self.broken is not None:
            answer = slot[0]
            if answer is not None:
                _record(answer, slot[1], NodeError(self.broken))
            return
        transport = self.transport
        if transport is None or (not self.ready and slot[0] is not None):
            # Still opening: written once it is open (a set-up command, which names no
            # round, is written by the opening itself, before it is ready).
            self.queued.append((command, slot, identify))
            return
        self.pending.append(slot)
        if slot[0] is None and self.classifying:
            # A set-up command (the question itself among them) is never held behind the
            # answer to whether the node is a cluster.
            transport.write(command)
            return
        command = self.outgoing(command, identify)
        if not command:
            return  # held until the hello is answered
        transport.write(command)

    def send_acked(
        self,
        command: Command,
        answer: _LoopRound,
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
        join = AckJoin(answer, index, self.acks, timeout_ms, fallback.acked_yes, _record)
        if self.broken is not None:
            _record(answer, index, NodeError(self.broken))
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

    def _fail(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
            # Lost, or met a replica: a Sentinel node's next connection asks its Sentinels.
            forget(self.address, stale=self.met_replica)
        self.ready = False
        queued, self.queued = self.queued, []
        for _, (answer, index, _, _), _ in queued:
            if answer is not None:
                _record(answer, index, NodeError(reason))
        pending = self.pending
        while pending:
            answer, index, _, _ = pending.popleft()
            # A set-up reply that never comes has nothing to teach (Handshake.learn).
            if answer is not None:
                _record(answer, index, NodeError(reason))
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        self._fail("connection closed by the client")


class LoopSubscriber:
    """Pub/sub streams (one per node) of one event loop, shared by all its waiting tasks.

    The asyncio twin of :class:`~django_redlock.wire.subscriber.Subscriber`: one listener id
    per loop, one channel per lock key and waiter ids as :mod:`~django_redlock.wire.waking`
    names them, and a release publishes only to the head of the line
    (``scripts/wake_next.lua``). A reader task per node sets the event of the waiter that a
    message names; each waiter is registered (its event made) when its id is given, before
    its first try, so a release that comes before the task awaits is kept, not lost.
    """

    KEEP = 16  # channels kept subscribed between waits, as in the sync Subscriber

    def __init__(self, addresses: Sequence[NodeAddress]) -> None:
        self.addresses = tuple(addresses)
        self.listener = new_listener_id()
        self.writers: list[asyncio.StreamWriter | None] = [None] * len(self.addresses)
        self.tasks: list[asyncio.Task[None] | None] = [None] * len(self.addresses)
        # Per node, the futures of SUBSCRIBE confirmations still owed, in order.
        self.confirming: list[deque[asyncio.Future[bool]]] = [deque() for _ in self.addresses]
        self.channels: dict[str, None] = {}  # subscribed (or being subscribed), oldest first
        self.lock: asyncio.Lock | None = None  # one task at a time opens and subscribes
        self.waiting: dict[bytes, asyncio.Event] = {}
        # Registered waiter: node index -> the round each hand-off grant heard names
        # (scripts/hand_grant.lua), until taken by grants(); and the waiters woken by a
        # plain wake-up since their last wait.
        self.granted: dict[bytes, dict[int, int]] = {}
        self.woken: set[bytes] = set()
        # Which channel each waiting task listens on, and how many listen on each: a channel
        # somebody listens on is never unsubscribed to make room (its wake-ups would be lost,
        # and that task left to its poll), so past KEEP only unheard channels go.
        self.listening: dict[bytes, str] = {}
        self.listeners: dict[str, int] = {}

    def waiter_id(self) -> str:
        """A new id for one blocking acquire, ``<listener>.<nonce>``, registered: from now on
        a release naming it is kept until :meth:`wait` or :meth:`unregister`. Every id given
        must be unregistered when its acquire ends."""
        waiter = new_waiter_id(self.listener)
        self.waiting[waiter.encode()] = asyncio.Event()
        return waiter

    def unregister(self, waiter: str) -> None:
        """Stop keeping ``waiter``'s wake-ups; its channel may be unsubscribed from now on."""
        ident = waiter.encode()
        self.waiting.pop(ident, None)
        self.granted.pop(ident, None)
        self.woken.discard(ident)
        channel = self.listening.pop(ident, None)
        if channel is not None:
            left = self.listeners.get(channel, 1) - 1
            if left > 0:
                self.listeners[channel] = left
            else:
                self.listeners.pop(channel, None)

    async def _open(self, index: int, timeout: float) -> None:
        try:
            reader, writer = await _open_stream(self.addresses[index], timeout)
        except (TimeoutError, OSError, ValueError, NodeError):
            return  # this node stays silent: the poll fallback covers it
        try:
            logins = login_commands(self.addresses[index])
        except NodeError:
            writer.close()
            return
        for command in logins:
            writer.write(command)
        self.writers[index] = writer
        self.tasks[index] = asyncio.get_running_loop().create_task(
            self._read(index, reader, len(logins))
        )

    async def _read(self, index: int, stream: asyncio.StreamReader, logins: int) -> None:
        parser = make_reader()
        try:
            while True:
                data = await stream.read(65536)
                if not data:
                    break
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    if logins:
                        logins -= 1
                        if isinstance(reply, ReplyError):
                            return  # a refused AUTH: this node stays silent
                        continue
                    if not isinstance(reply, list) or len(reply) != 3:
                        continue
                    if reply[0] == b"message" and isinstance(reply[2], bytes):
                        # The waiter id (a wake-up), or the id and a round (a grant).
                        ident, round_ = hear_message(reply[2])
                        event = self.waiting.get(ident)
                        if event is not None:
                            if round_ is not None:
                                note_grant(self.granted, ident, index, round_)
                            else:
                                self.woken.add(ident)
                            event.set()
                    elif reply[0] == b"subscribe" and self.confirming[index]:
                        future = self.confirming[index].popleft()
                        if not future.done():
                            future.set_result(True)
        except (OSError, asyncio.CancelledError):
            pass
        except PROTOCOL_ERRORS:
            pass  # not RESP: this node is lost (the poll fallback covers it)
        finally:
            self._lost(index)

    def _lost(self, index: int) -> None:
        writer = self.writers[index]
        self.writers[index] = None
        self.tasks[index] = None
        if writer is not None:
            writer.close()
        while self.confirming[index]:
            future = self.confirming[index].popleft()
            if not future.done():
                future.set_result(False)
        # The next wait must subscribe again on a new connection.
        self.channels.clear()

    async def subscribe(self, key: str, timeout: float, waiter: str = "") -> bool:
        """Subscribe to this loop's channel for ``key`` on every node, waiting up to
        ``timeout`` seconds for the confirmations, and count ``waiter`` (registered) as
        listening on it until :meth:`unregister`. Returns False, doing nothing more, when it
        was already subscribed on every node (a release since then was heard), True otherwise.

        One task at a time opens connections and subscribes: two tasks opening the same node
        at once would leave one connection orphaned, and closed when collected, with the
        subscription on it.
        """
        channel = wake_channel(key, self.listener)
        ident = waiter.encode()
        if waiter and ident in self.waiting and ident not in self.listening:
            # Counted before any await: a subscribe of another task that makes room while
            # this one waits for the lock below must not take this channel.
            self.listening[ident] = channel
            self.listeners[channel] = self.listeners.get(channel, 0) + 1
        if channel in self.channels and all(self.writers):
            self.channels[channel] = self.channels.pop(channel)  # most recently used
            return False
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            if channel in self.channels and all(self.writers):
                return True  # another task subscribed it while we waited: try once more
            missing = [index for index, writer in enumerate(self.writers) if writer is None]
            if missing:
                await asyncio.gather(*(self._open(index, timeout) for index in missing))
            if len(self.channels) >= self.KEEP:
                # The oldest channel nobody listens on; none when every kept one is heard.
                unheard = (c for c in self.channels if c != channel and c not in self.listeners)
                oldest = next(unheard, None)
                if oldest is not None:
                    del self.channels[oldest]
                    for index, writer in enumerate(self.writers):
                        if writer is not None:
                            here = channel_on(self.addresses[index], oldest)
                            writer.write(encode_command(b"UNSUBSCRIBE", here))
            loop = asyncio.get_running_loop()
            confirmations = []
            for index, writer in enumerate(self.writers):
                if writer is not None:
                    future: asyncio.Future[bool] = loop.create_future()
                    self.confirming[index].append(future)
                    confirmations.append(future)
                    here = channel_on(self.addresses[index], channel)
                    writer.write(encode_command(b"SUBSCRIBE", here))
            if confirmations:
                await asyncio.wait(confirmations, timeout=timeout)
            # Listed only now: a task that finds it listed may skip its extra try.
            self.channels[channel] = None
        return True

    async def wait(self, waiter: str, timeout: float, need: int = 0, settle: float = 0.0) -> bool:
        """Wait up to ``timeout`` seconds for a release that names ``waiter`` (an id from
        :meth:`waiter_id`, not yet unregistered); True if one came since its last wait.
        ``need`` and ``settle``: for a waiter taking hand-off grants, as the sync
        :meth:`Subscriber.wait <django_redlock.wire.subscriber.Subscriber.wait>` (take
        them with :meth:`grants`)."""
        ident = waiter.encode()
        event = self.waiting.get(ident)
        if event is None:
            await asyncio.sleep(timeout)
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if not event.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), max(0.0, deadline - loop.time()))
            if not event.is_set():
                break
            event.clear()
            grants = len(self.granted.get(ident, ()))
            if ident in self.woken or not need or not grants or grants >= need:
                break
            # A first grant: the other nodes' come within the release's round trip.
            deadline = min(deadline, loop.time() + settle)
        woken = ident in self.woken or bool(self.granted.get(ident))
        self.woken.discard(ident)
        return woken

    def grants(self, waiter: str) -> dict[int, int]:
        """The hand-off grants heard for ``waiter`` since this was last called (node index ->
        the round each names)."""
        return self.granted.pop(waiter.encode(), None) or {}

    def open_count(self) -> int:
        """How many pub/sub streams are open now (at most one per node)."""
        return sum(1 for writer in self.writers if writer is not None)

    def close(self) -> None:
        """Close the streams (they reopen on the next subscribe)."""
        for task in self.tasks:
            if task is not None:
                task.cancel()
        for writer in self.writers:
            if writer is not None:
                writer.close()
        self.writers = [None] * len(self.addresses)
        self.tasks = [None] * len(self.addresses)
        self.channels.clear()


def _usable(conn: _AsyncConnection | None) -> bool:
    """True if ``conn`` is logged in and not broken: a command may be written to it now."""
    return conn is not None and conn.ready and conn.broken is None


class LoopConnections:
    """The connections of one event loop, one per node.

    Args:
        addresses: the nodes, in the manager's order.
        hello: what every new connection asks its node after its login.
        max_outstanding, stall_reset, stall_age: counts and seconds that judge a node owing
            replies (see :class:`~django_redlock.wire.stall.StallRule`): a node owing
            ``max_outstanding`` replies, the oldest older than ``stall_age``, is skipped; one
            whose oldest owed reply is older than ``stall_reset`` gets a new connection.
    """

    def __init__(
        self,
        addresses: Sequence[NodeAddress],
        hello: Hello,
        *,
        max_outstanding: int = 32,
        stall_reset: float = 1.0,
        stall_age: float | None = None,
    ) -> None:
        self.addresses = tuple(addresses)
        warm_tls(self.addresses)  # now, not inside the first command's deadline
        # Whether a node has REPLICA_ACKS: only then are grants and renewals sent otherwise.
        self.acked = any(address.replica_acks for address in self.addresses)
        self.hello = hello
        # Nodes whose server an earlier node reached: sent nothing (wire/servers.py).
        self.twins: dict[int, str] = hello.twins
        self.stall = StallRule(max_outstanding, stall_reset, stall_age)
        # How long a connection opened for a posted command may take (seconds): the node
        # timeout of the last round.
        self.delivery = 1.0
        self.connections: list[_AsyncConnection | None] = [None] * len(self.addresses)
        # Cluster nodes, as the sync transport keeps them (see ConnectionSet): the shards'
        # connections follow the nodes' in `connections`, `targets` says where each goes.
        self.targets: list[NodeAddress] = list(self.addresses)
        self.routes: dict[int, ClusterRoute] = {}
        self.shard_of: dict[int, int] = {}
        self.members: dict[tuple[int, Endpoint], int] = {}
        self.unclassified: set[int] = set()
        for index, address in enumerate(self.addresses):
            if address.sentinel is not None or address.replica_acks:
                continue
            learned, slot_map = known(address)
            if not learned:
                self.unclassified.add(index)
            elif slot_map is not None:
                self.routes[index] = ClusterRoute(address, slot_map)
        self._subscriber = LoopSubscriber(self.addresses)
        self.guard: asyncio.Task[None] | None = None
        # The rounds a task waits for (in outcome), and one timer for all their deadlines,
        # set for the earliest (loop clock; inf: none set): one timer per node timeout
        # or so instead of one made and cancelled per round.
        self.waiting: set[_LoopRound] = set()
        self.alarm_at = math.inf
        # The Sentinel nodes, each with the failovers of its service heard in this process
        # (see ConnectionSet.watches).
        self.watches: dict[int, Watch] = {
            index: watch(address)
            for index, address in enumerate(self.addresses)
            if address.sentinel is not None
        }

    @property
    def subscriber(self) -> LoopSubscriber:
        """The pub/sub streams this loop's waiting acquires listen on."""
        return self._subscriber

    async def close_at_loop_end(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self.close()

    async def connection(self, index: int, timeout: float) -> _AsyncConnection:
        """Node ``index``'s connection once its opening is over (logged in, or broken),
        opening a new one if there is none or it broke.

        The opening runs in its own task, shielded: a caller cancelled meanwhile (or a
        ``wait_for`` around it) must not cut a connection that other tasks of the loop share
        and wait on in the middle of its login.
        """
        conn = self.opened(index, timeout)
        assert conn.opening is not None
        if not conn.opening.done():
            await asyncio.shield(conn.opening)
        return conn

    def opened(self, index: int, timeout: float) -> _AsyncConnection:
        """Node ``index``'s connection, its opening started (within ``timeout`` seconds) if
        there is none or it broke; not awaited: commands given to it meanwhile are queued
        (:class:`_AsyncConnection`)."""
        conn = self.connections[index]
        if conn is None or conn.broken is not None:
            node = self.shard_of.get(index)
            if conn is not None:
                conn.close()
                if node is not None:  # a cluster shard's master: its slots may have a new one
                    self.routes[node].failed()
            if node is None:
                classify = index in self.unclassified
                conn = _AsyncConnection(self.targets[index], self.hello, classify=classify)
                if classify:
                    conn.on_classified = partial(self._classified, index)
            else:
                # A shard of a cluster node: its scripts and hello name the shard's records.
                address = self.targets[index]
                tag = self.routes[node].tag_of((address.host or "", address.port or 0)) or ""
                conn = _AsyncConnection(
                    address,
                    shard_hello(self.hello, tag, self.addresses[node].label),
                    tuple(script.for_shard(tag) for script in PRELOAD),
                )
                conn.redirect = self._redirect
            watched = self.watches.get(index)
            if watched is not None:
                watched.ensure_running()  # (a forked child has no thread of its parent's)
                conn.switches = watched.switches  # before asking: a switch meanwhile drops it
            self.connections[index] = conn
            conn.opening = asyncio.get_running_loop().create_task(conn.open(timeout))
        return conn

    async def run(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        *,
        give_up: int | None = None,
        identify: bool = False,
        queue_behind: bool = False,
    ) -> Round:
        """One round trip: send ``commands[i]`` to node ``i`` and wait up to ``timeout``
        seconds for the outcome. See :meth:`~django_redlock.wire.transport.Transport.run`
        for the arguments and results (the same as the sync transport's, so both managers
        log the same node errors).

        Commands are written synchronously to every connected node (no task per node: on a
        small machine a task costs more than the round trip); replies are tallied as they
        are parsed, and the caller resumes once the outcome is known or ``timeout`` passes:
        :meth:`send_now` (or, when a node must be connected or read first, the same with
        those awaits before it), then :meth:`outcome`.

        Raises:
            asyncio.CancelledError: the task was cancelled (the round is closed: replies
                still owed are read and dropped).
        """
        self.delivery = timeout
        answer = self.send_now(
            commands,
            timeout,
            yes_value,
            need,
            give_up=give_up,
            identify=identify,
            queue_behind=queue_behind,
        )
        if answer is None:
            answer = await self._send_after_awaits(
                commands, timeout, yes_value, need, give_up, identify, queue_behind
            )
        return await self.outcome(answer)

    def send_now(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        *,
        give_up: int | None = None,
        identify: bool = False,
        queue_behind: bool = False,
    ) -> Round | None:
        """The first half of :meth:`run` (arguments as there) when it needs no await: every
        node given a command has a logged-in connection that owes fewer than
        ``max_outstanding`` replies, the oldest not past the stall reset (so no node is
        judged, read first or replaced: :meth:`StallRule.judged
        <django_redlock.wire.stall.StallRule.judged>` is False for each). The commands are
        written now; returns the round, to pass to :meth:`outcome` with no await between
        (its deadline runs from now). None when a node needs more: nothing was sent, and
        :meth:`run` is the way.

        Raises:
            RuntimeError: no event loop is running.
        """
        if self.watches:
            self._drop_switched()
        if self.routes or self.unclassified:
            return None  # a cluster node's command goes to a shard: the general way
        connections = self.connections
        stall = self.stall
        cap = stall.max_outstanding
        now = time.monotonic()
        fresh = now - stall.stall_reset
        for conn, command in zip(connections, commands, strict=True):
            if command is None:
                continue
            if conn is None or not conn.ready:  # not logged in yet, or broken
                return None
            pending = conn.pending
            if pending and (len(pending) >= cap or pending[0][3] < fresh):
                return None
        answer = _LoopRound(len(commands), yes_value, need, give_up)  # _new_round inlined
        answer.decided = None
        answer.deadline = asyncio.get_running_loop().time() + timeout
        if self.twins:  # empty unless two nodes reached one server (wire/servers.py)
            commands = keep_apart(answer, commands, self.twins)
        results = answer.results
        expect = self._expect
        if self.acked and acked_round(commands):
            expect = partial(self._expect_acked, timeout_ms=wait_ms(timeout))
        for index, command in enumerate(commands):
            if command is None:
                if results[index] is PENDING:  # else refused (a twin)
                    results[index] = None
            else:
                conn = connections[index]
                assert conn is not None  # checked above
                answer.pending += 1
                expect(conn, index, command, answer, identify, now)
        return answer

    def _expect_acked(
        self,
        conn: _AsyncConnection,
        index: int,
        command: Command,
        answer: _LoopRound,
        identify: bool,
        now: float,
        *,
        timeout_ms: int,
    ) -> None:
        """:meth:`_expect` for a grant or renewal: followed by its WAIT on a node with
        REPLICA_ACKS (wire/acks.py); as it is on any other node."""
        if conn.acks is None:
            self._expect(conn, index, command, answer, identify, now)
        else:
            conn.send_acked(command, answer, index, now, identify, timeout_ms)

    def _drop_switched(self) -> None:
        """Fail each connection to a Sentinel node opened before a failover of its service
        heard since (see ConnectionSet._drop_switched): the next round opens a new one."""
        for index, watched in self.watches.items():
            conn = self.connections[index]
            if conn is not None and conn.broken is None and conn.switches != watched.switches:
                conn._fail("the Sentinels switched the master: connection dropped")

    async def _send_after_awaits(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        give_up: int | None,
        identify: bool,
        queue_behind: bool,
    ) -> _LoopRound:
        """The first half of :meth:`run` in general: nodes that owe many or old replies are
        read first, then judged (skipped, or given a new connection), the nodes not
        connected are connected (or their login awaited), and the commands written. The
        round's deadline runs from after those awaits."""
        answer = _new_round(len(commands), yes_value, need, give_up, math.inf)
        if self.twins:  # empty unless two nodes reached one server (wire/servers.py)
            commands = keep_apart(answer, commands, self.twins)
        commands, at = await self._placed(answer, commands, timeout)
        stall = self.stall
        now = time.monotonic()
        judged = [
            conn
            for conn, command in zip(self._of(at), commands, strict=True)
            if command is not None and conn is not None and conn.pending
            if stall.judged(len(conn.pending), conn.age(now), queue_behind)
        ]
        if judged and _unread(judged):
            # As the sync transport reads a node before it judges it stalled: this loop may
            # have been blocked (a long garbage collection, a callback that does not yield)
            # while the replies came, and that is no fault of the node.
            await self._take_in(judged)
            now = time.monotonic()
        for conn, command in zip(self._of(at), commands, strict=True):
            # Only a node that owes replies can be past the stall reset (its age is 0 else).
            if (
                command is not None
                and conn is not None
                and conn.pending
                and stall.reset(conn.age(now))
            ):
                # Open, but its oldest owed reply is long overdue (a black hole): replaced.
                conn._fail("stalled connection reset")
        for index, command in enumerate(commands):
            if command is not None and not _usable(self.connections[at[index]]):
                # Connected in the background (or its login not over): the command waits
                # in the connection's queue, and the round's deadline runs from now, as
                # the sync transport's does. The caller never waits for a connect.
                self.opened(at[index], timeout)
        cap = stall.max_outstanding
        now = time.monotonic()
        expect = self._expect
        if self.acked and acked_round(commands):
            expect = partial(self._expect_acked, timeout_ms=wait_ms(timeout))
        for index, command in enumerate(commands):
            if command is None:
                if answer.results[index] is PENDING:  # else refused: not placed
                    answer.results[index] = None
                continue
            conn = self.connections[at[index]]
            assert conn is not None
            if conn.broken is not None:
                answer.refuse(index, NodeError(conn.broken))
                continue
            owed = len(conn.pending)
            if owed >= cap and not (queue_behind and stall.room(owed, conn.age(now))):
                reason = stall.refusal(owed, conn.age(now))
                if reason is not None:
                    answer.refuse(index, NodeError(reason))
                    continue
            answer.pending += 1
            expect(conn, index, command, answer, identify, now)
        answer.deadline = asyncio.get_running_loop().time() + timeout
        return answer

    async def outcome(self, answer: Round, *, keep_open: bool = False) -> Round:
        """Wait for the outcome of ``answer`` (a round :meth:`send_now` sent) until it is
        known or its deadline passes; then it is closed (late replies are dropped) and
        returned, each reply still owed :data:`~django_redlock.wire.errors.TIMED_OUT`.

        ``keep_open``: a cancellation leaves the round open (its replies still counted), for
        a caller that waits for it again, with this method, in another task; its deadline
        stays the one it had.

        Raises:
            asyncio.CancelledError: the task was cancelled (the round is closed, unless
                ``keep_open``).
        """
        assert isinstance(answer, _LoopRound)
        # Round.known inlined: a quorum said yes, too many said no, or all answered.
        if answer.yes < answer.need and answer.no <= answer.give_up and answer.pending > 0:
            loop = asyncio.get_running_loop()
            decided = answer.decided = loop.create_future()
            # The alarm on the loop instead of asyncio.wait_for: no extra task and no shield
            # per round trip (wait_for costs more than a loopback round trip here).
            self.waiting.add(answer)
            if answer.deadline < self.alarm_at:
                self._set_alarm(loop, answer.deadline)
            cancelled = False
            try:
                await decided
                if not answer.known():
                    # The deadline passed undecided. A reply that sits in its socket is an
                    # answer, not a timeout: the loop may have been blocked while the nodes
                    # answered (the timer can run before the loop reads what came during
                    # the block), and that pause is the client's. The caller counts the
                    # validity from before the send, so the lease still loses that time (the
                    # Redlock spec's step 3).
                    await self._take_in(
                        [
                            conn
                            for index, reply in enumerate(answer.results)
                            if reply is PENDING
                            for conn in self._connections_of(index)
                        ],
                        answer.known,
                    )
                    answer.time_out()
            except asyncio.CancelledError:
                cancelled = True
                raise
            finally:
                self.waiting.discard(answer)
                answer.decided = None
                # Over, decided or cancelled: late replies are dropped, and a NOSCRIPT
                # fallback that is not ``when_over`` is no longer sent (an acquire's SET
                # re-sent now would land after the clean-up release).
                if not (cancelled and keep_open):
                    answer.closed = True
        answer.closed = True
        return answer

    def _set_alarm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """Ring :meth:`_ring` at ``when`` (the loop's clock, seconds), before the time it
        was set for (an alarm set for later rings anyway: it finds nothing due)."""
        self.alarm_at = when
        loop.call_at(when, self._ring, loop)

    def _ring(self, loop: asyncio.AbstractEventLoop) -> None:
        """The alarm: wake each waiting round whose deadline has passed (its task then
        looks at what the sockets hold and times out the rest), and set the alarm again
        for the earliest deadline still ahead."""
        self.alarm_at = math.inf
        now = loop.time()
        ahead = math.inf
        for answer in self.waiting:
            if answer.deadline <= now:
                if answer.decided is not None:
                    _settle(answer.decided)
            elif answer.deadline < ahead:
                ahead = answer.deadline
        if ahead < self.alarm_at:
            self._set_alarm(loop, ahead)

    async def _take_in(
        self, conns: Sequence[_AsyncConnection], settled: Callable[[], bool] | None = None
    ) -> None:
        """Let the event loop read what already sits in ``conns``' sockets: a few turns of
        the loop (the reading is the transports'), ending as soon as nothing is left unread
        there or ``settled()`` says the round needs no more. Never waits for new bytes."""
        for _ in range(_TAKE_IN_TURNS):
            if (settled is not None and settled()) or not _unread(conns):
                return
            await asyncio.sleep(0)

    def post(self, commands: Commands) -> None:
        """Write ``commands[i]`` to node ``i`` now, without awaiting (safe in a task being
        cancelled), queued behind what each node owes; the replies are read and dropped.
        A node not connected gets a connection opened in the background, the command
        queued on it (within the last round's node timeout). See
        :meth:`~django_redlock.wire.transport.Transport.post`.

        Raises:
            Nothing: a node that cannot be written to is left out (best effort).
        """
        # Its replies are dropped (closed), except that a NOSCRIPT still gets the EVAL
        # fallback: clean-up commands are built with ``when_over=True``.
        ignored = _new_round(len(commands), None, 0, None, math.inf)
        ignored.closed = True
        now = time.monotonic()
        for index, command in enumerate(commands):
            if command is None:
                continue
            at = index
            if index in self.routes:
                try:
                    at, command = self._place(index, command)
                except NodeError:
                    continue
            conn = self.connections[at]
            if conn is None or conn.broken is not None:
                conn = self.opened(at, self.delivery)
            self._expect(conn, index, fire_and_forget(command), ignored, False, now)

    def open_count(self) -> int:
        """How many sockets this loop holds open now, its pub/sub ones included."""
        count = sum(1 for conn in self.connections if conn is not None and conn.broken is None)
        return count + self._subscriber.open_count()

    def _expect(
        self,
        conn: _AsyncConnection,
        index: int,
        command: Command,
        answer: _LoopRound,
        identify: bool,
        now: float,
    ) -> None:
        """Send ``command`` on ``conn`` (asked at ``now``, monotonic seconds); its reply is
        node ``index``'s answer in ``answer``, re-sent as EVAL once if the node had no copy
        of the script (see :func:`~django_redlock.wire.rounds.on_reply`). The task waiting
        for ``answer`` resumes once the reply that makes its outcome known is parsed.

        :meth:`_AsyncConnection.send` inlined (one call fewer per node and round)."""
        if conn.broken is not None:
            _record(answer, index, NodeError(conn.broken))
            return
        transport = conn.transport
        if not conn.ready or transport is None:  # still opening: written once it is open
            conn.queued.append((command[0], (answer, index, command[1], now), identify))
            return
        conn.pending.append((answer, index, command[1], now))
        if conn.held is None:  # Handshake.outgoing's usual case: the hello was answered
            transport.write(command[0] + conn.identity if identify else command[0])
            return
        data = conn.outgoing(command[0], identify)
        if data:  # else held until the hello is answered
            transport.write(data)

    def close(self) -> None:
        """Close every socket (they reopen on the next round or subscribe)."""
        for conn in self.connections:
            if conn is not None:
                conn.close()
        self.connections = [None] * len(self.addresses)
        self.targets = list(self.addresses)
        self.shard_of.clear()
        self.members.clear()
        self._subscriber.close()

    # -- cluster nodes (wire/cluster_route.py; the sync transport's ConnectionSet likewise) --

    def _classified(self, index: int, conn: _AsyncConnection) -> None:
        """Node ``index``'s first connection learned what the node is: plain (nothing more
        to do: it sends what it held), or a cluster member: the node is a cluster node from
        now on, and what the connection held goes to the shards, each command in its
        shard's form, with the reply slot it had; the connection is closed."""
        if index not in self.unclassified:
            return
        address = self.addresses[index]
        if conn.cluster_shards is None:
            self.unclassified.discard(index)
            remember(address, None)
            return
        held = conn.take_held()
        slots = [conn.pending.pop() for _ in held][::-1]
        try:
            # A CLUSTER SHARDS reply (or, before Redis 7, CLUSTER SLOTS read here: blocking
            # within the node timeout, once per process and node).
            slot_map = shards_reply_map(address, conn.cluster_shards, self.delivery)
        except NodeError as exc:
            for answer, node, _, _ in slots:
                if answer is not None:
                    _record(answer, node, NodeError(str(exc)))
            conn._fail(str(exc))
            return
        remember(address, slot_map)
        self.unclassified.discard(index)
        route = self.routes[index] = ClusterRoute(address, slot_map)
        conn._fail("a cluster node: its commands go to its shards")
        for (data, identify), (answer, node, fallback, asked) in zip(held, slots, strict=True):
            try:
                endpoint, placed, _ = route.place(data)
            except NodeError as exc:
                if answer is not None:
                    _record(answer, node, exc)
                continue
            target = self.opened(self._member(index, endpoint), self.delivery)
            routed = None if fallback is None else Routed.of(fallback, route, endpoint)
            target.send(placed, (answer, node, routed, asked), identify)

    async def _placed(
        self, answer: _LoopRound, commands: Commands, timeout: float
    ) -> tuple[list[Command | None], list[int]]:
        """Each node's command as it goes (a cluster node's placed on its shard), and the
        connection it goes on; a node that gets nothing has ``None`` (refused in ``answer``
        when it could not be placed or classified)."""
        for route in self.routes.values():
            if route.stale:
                with contextlib.suppress(NodeError):  # the old map stays in use
                    route.refresh(await asyncio.to_thread(route.read, timeout))
        placed: list[Command | None] = []
        at: list[int] = []
        for index, command in enumerate(commands):
            target = index
            if command is not None and index in self.routes:
                try:
                    target, command = self._place(index, command)
                except NodeError as exc:
                    answer.refuse(index, exc)
                    command = None
            placed.append(command)
            at.append(target)
        return placed, at

    def _of(self, at: Sequence[int]) -> list[_AsyncConnection | None]:
        return [self.connections[index] for index in at]

    def _connections_of(self, index: int) -> list[_AsyncConnection]:
        """Node ``index``'s connections: its own, and its shards' (a cluster node)."""
        found = [self.connections[index]]
        found += [self.connections[at] for at, node in self.shard_of.items() if node == index]
        return [conn for conn in found if conn is not None]

    def _place(self, index: int, command: Command) -> tuple[int, Command]:
        """Cluster node ``index``'s ``command`` on its shard: the connection index and the
        command in the shard's form (see ConnectionSet._place).

        Raises:
            NodeError: it cannot be placed (no master serves its slot, or the map is stale).
        """
        route = self.routes[index]
        endpoint, data, _ = route.place(command[0])
        fallback = command[1]
        routed = None if fallback is None else Routed.of(fallback, route, endpoint)
        return self._member(index, endpoint), (data, routed)

    def _member(self, index: int, endpoint: Endpoint) -> int:
        """The index of the connection to shard master ``endpoint`` of cluster node
        ``index`` (a new entry, opened on first use)."""
        at = self.members.get((index, endpoint))
        if at is None:
            at = len(self.connections)
            self.connections.append(None)
            self.targets.append(self.routes[index].member(endpoint))
            self.shard_of[at] = index
            self.members[(index, endpoint)] = at
        return at

    def _redirect(self, conn: _AsyncConnection, redirect: Redirect, slot: _Slot) -> None:
        """A shard answered MOVED or ASK for ``slot``'s command: send it to the shard named
        (see ConnectionSet._redirect, the same rule)."""
        answer, node, fallback, _ = slot
        assert answer is not None
        assert isinstance(fallback, Routed)
        endpoint = (redirect.host or conn.address.host or "", redirect.port)
        route = fallback.route
        if not redirect.ask:
            route.moved(redirect.slot, endpoint)  # learnt even when too late to re-send
        if answer.closed and not fallback.when_over:
            return
        if fallback.hops >= MAX_HOPS:
            _record(answer, node, NodeError(f"redirected {fallback.hops} times; giving up"))
            return
        try:
            data = route.rewrite(fallback.original.build(), endpoint)
        except NodeError as exc:
            _record(answer, node, exc)
            return
        target = self.opened(self._member(node, endpoint), self.delivery)
        routed = Routed.of(fallback.original, route, endpoint, fallback.hops + 1)
        now = time.monotonic()
        identify = routed.identify
        if redirect.ask:
            # ASKING holds for the very next command only: the two go together, the command
            # never held behind the hello (its identity left blank: the node checks itself).
            target.send(ASKING, (None, ASKING_REPLY, None, now))
            if identify:
                data += UNIDENTIFIED
                identify = False
        target.send(data, (answer, node, routed, now), identify)
