"""The asyncio transport: per event loop, one connection per node, shared by every task.

A command is written to every node at once (one round trip whatever N); each connection has a
FIFO of reply handlers, called in order as replies are parsed in ``data_received``, so replies
can never be handed to the wrong command, and commands of many tasks pipeline on one socket.
The outcome is known at a quorum of yes votes, or once a quorum is no longer possible; a node
that owes too many replies is skipped without sending. Waiting tasks are woken by the release
through per-loop pub/sub streams (:class:`_AsyncSubscriber`).

Why not ``redis.asyncio``: five ``evalsha`` calls under ``asyncio.gather`` cost 1.2 ms a pair
or more on this project's benchmark machine, three times this transport or more, and its
clients retry by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import select
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.resp import (
    BAD_REPLY,
    PROTOCOL_ERRORS,
    ReplyError,
    encode_command,
    make_reader,
)
from django_redlock.wire.scripts import HOT_SCRIPTS, Command, Commands, fire_and_forget
from django_redlock.wire.setup import (
    Handshake,
    Hello,
    aresolve,
    login_commands,
    refusal,
    tls_context,
    warm_tls,
)
from django_redlock.wire.sync import new_waiter_id, wake_channel

__all__ = ["LoopConnections"]


async def _connect(
    address: NodeAddress, protocol: asyncio.Protocol, timeout: float
) -> asyncio.BaseTransport:
    """Connect ``protocol`` to ``address`` (unix socket, TCP or TLS) within ``timeout`` s:
    every address the host resolves to (``loop.getaddrinfo``: the loop never blocks on DNS)
    is tried in turn until one connects.

    Raises:
        TimeoutError, OSError: the node cannot be reached or the TLS handshake failed.
        NodeError: the host does not resolve, or the TLS settings are unusable.
    """
    loop = asyncio.get_running_loop()
    context = tls_context(address) if address.tls else None  # built once, outside the deadline
    async with asyncio.timeout(timeout):
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


_Callback = Callable[[Any], None]


def _drop_reply(index: int, reply: Any) -> None:
    """The per-node recorder of fire-and-forget commands."""


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
    """One connection to one node: an asyncio protocol with the reply handlers it still owes,
    in order. Replies are parsed in ``data_received`` and handed to their handler right there:
    no reader task, no future per reply, so a round trip costs one wake-up of the waiting task.
    The set-up (login, scripts, hello) is :class:`~django_redlock.wire.setup.Handshake`'s.
    """

    def __init__(self, address: NodeAddress, hello: Hello) -> None:
        super().__init__(address, hello, HOT_SCRIPTS)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[_Callback] = deque()
        self.asked: deque[float] = deque()  # when each owed reply was asked (monotonic)
        self.parser = make_reader()
        self.broken: str | None = None
        # The task that connects and logs in (set by LoopConnections.connection), and
        # whether it got as far as queueing the login: commands may follow it from then on.
        self.opening: asyncio.Task[None] | None = None
        self.ready = False

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
        for command, kind in setup:
            self._send_raw(command, partial(self._take, kind))
        self.ready = True

    def _take(self, kind: int, reply: Any) -> None:
        """A set-up reply: learnt, and what it releases written (see Handshake.learn)."""
        try:
            out = self.learn(kind, reply)
        except NodeError as exc:  # AUTH or SELECT refused: the connection is useless
            self._fail(str(exc))
            return
        if out and self.transport is not None and self.broken is None:
            self.transport.write(out)

    def reload(self) -> None:
        """Load the scripts again (the node answered NOSCRIPT)."""
        for command, kind in self.reload_commands():
            self._send_raw(command, partial(self._take, kind))

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
        self.parser.feed(data)
        pending = self.pending
        asked = self.asked
        while True:
            try:
                reply = self.parser.gets()
            except PROTOCOL_ERRORS:
                self._fail(BAD_REPLY)
                return
            if reply is False:
                return
            if pending:
                asked.popleft()
                pending.popleft()(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(str(exc) if exc else "connection closed by the server")

    def _send_raw(self, command: bytes, on_reply: _Callback, identify: bool = False) -> None:
        """Write ``command``; ``on_reply`` gets its reply, or a :class:`NodeError`. With
        ``identify``, the connection's identity completes it (see Handshake.outgoing)."""
        if self.broken is not None or self.transport is None:
            on_reply(NodeError(self.broken or "not connected"))
            return
        self.pending.append(on_reply)
        self.asked.append(time.monotonic())
        command = self.outgoing(command, identify)
        if not command:
            return  # held until the hello is answered
        self.transport.write(command)

    def age(self, now: float) -> float:
        """Seconds since the oldest reply still owed was asked (0 when none is owed)."""
        return now - self.asked[0] if self.asked else 0.0

    def _fail(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
        self.asked.clear()
        while self.pending:
            self.pending.popleft()(NodeError(reason))
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        self._fail("connection closed by the client")


class _AsyncSubscriber:
    """Pub/sub streams (one per node) of one event loop, shared by all its waiting tasks.

    The asyncio twin of :class:`~django_redlock.wire.sync.Subscriber`: one listener id per
    loop, one channel per lock key (key, ``"\\x00w"``, listener), waiter ids
    ``<listener>.<nonce>``, and a release publishes only to the head of the line
    (``scripts/wake_next.lua``). A reader task per node sets the event of the waiter that a
    message names; each waiter registers its event before its first try, so a release that
    comes before the task awaits is kept, not lost.
    """

    KEEP = 16  # channels kept subscribed between waits, as in the sync Subscriber

    def __init__(self, addresses: Sequence[NodeAddress]) -> None:
        self.addresses = tuple(addresses)
        self.listener = secrets.token_hex(6)
        self.writers: list[asyncio.StreamWriter | None] = [None] * len(self.addresses)
        self.tasks: list[asyncio.Task[None] | None] = [None] * len(self.addresses)
        # Per node, the futures of SUBSCRIBE confirmations still owed, in order.
        self.confirming: list[deque[asyncio.Future[bool]]] = [deque() for _ in self.addresses]
        self.channels: dict[str, None] = {}  # subscribed (or being subscribed), oldest first
        self.lock: asyncio.Lock | None = None  # one task at a time opens and subscribes
        self.waiting: dict[bytes, asyncio.Event] = {}
        # Which channel each waiting task listens on, and how many listen on each: a channel
        # somebody listens on is never unsubscribed to make room (its wake-ups would be lost,
        # and that task left to its poll), so past KEEP only unheard channels go.
        self.listening: dict[bytes, str] = {}
        self.listeners: dict[str, int] = {}

    def waiter_id(self) -> str:
        return new_waiter_id(self.listener)

    def register(self, waiter: str) -> None:
        """Start keeping the wake-ups of ``waiter`` (before its first try)."""
        self.waiting[waiter.encode()] = asyncio.Event()

    def unregister(self, waiter: str) -> None:
        """Stop keeping ``waiter``'s wake-ups; its channel may be unsubscribed from now on."""
        ident = waiter.encode()
        self.waiting.pop(ident, None)
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
                    if reply[0] == b"message":
                        event = self.waiting.get(reply[2])
                        if event is not None:
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
                    for writer in self.writers:
                        if writer is not None:
                            writer.write(encode_command(b"UNSUBSCRIBE", oldest))
            loop = asyncio.get_running_loop()
            confirmations = []
            for index, writer in enumerate(self.writers):
                if writer is not None:
                    future: asyncio.Future[bool] = loop.create_future()
                    self.confirming[index].append(future)
                    confirmations.append(future)
                    writer.write(encode_command(b"SUBSCRIBE", channel))
            if confirmations:
                await asyncio.wait(confirmations, timeout=timeout)
            # Listed only now: a task that finds it listed may skip its extra try.
            self.channels[channel] = None
        return True

    async def wait(self, waiter: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a release that names ``waiter`` (registered
        with :meth:`register`); True if one came since the last wait."""
        event = self.waiting.get(waiter.encode())
        if event is None:
            await asyncio.sleep(timeout)
            return False
        if not event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        woken = event.is_set()
        event.clear()
        return woken

    def close(self) -> None:
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
        max_outstanding, stall_reset, stall_age: seconds and counts as for the sync
            :class:`~django_redlock.wire.sync.ConnectionSet`: a node owing ``max_outstanding``
            replies, the oldest older than ``stall_age``, is skipped; one whose oldest owed
            reply is older than ``stall_reset`` gets a new connection.
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
        self.hello = hello
        self.max_outstanding = max_outstanding
        self.stall_reset = stall_reset
        self.stall_age = stall_reset / 20 if stall_age is None else stall_age
        self.connections: list[_AsyncConnection | None] = [None] * len(self.addresses)
        self.subscriber = _AsyncSubscriber(self.addresses)
        self.guard: asyncio.Task[None] | None = None

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
        conn = self.connections[index]
        if conn is None or conn.broken is not None:
            if conn is not None:
                conn.close()
            conn = _AsyncConnection(self.addresses[index], self.hello)
            self.connections[index] = conn
            conn.opening = asyncio.get_running_loop().create_task(conn.open(timeout))
        assert conn.opening is not None
        if not conn.opening.done():
            await asyncio.shield(conn.opening)
        return conn

    async def run(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        *,
        capped: bool = True,
        identify: bool = False,
        give_up: int | None = None,
    ) -> tuple[list[Any], int, int]:
        """One round trip: send ``commands[i]`` to node ``i``; results, yes and no counts.
        With ``identify``, each command is completed with its connection's identity (see
        ``wire.setup.Hello``). A node owing many replies is skipped (a stalled node costs no
        more writes) unless ``capped`` is False: a held lease's release is queued behind
        what the node owes instead, or its keys would stay until they expire.

        Commands are written synchronously to every connected node (no task per node: on a
        small machine a task costs more than the round trip); replies are tallied by future
        callbacks, and the caller resumes once the outcome is known or ``timeout`` passes.
        Per node, as the sync transport reports it: the reply, ``None`` (no command), a
        :class:`NodeError`, :data:`TIMED_OUT` (no reply by the deadline) or :data:`PENDING`
        (not waited for: the outcome was known), so both managers log the same node errors.
        """
        size = len(commands)
        results: list[Any] = [PENDING] * size
        give_up = size - need if give_up is None else give_up
        counts = [0, 0]
        loop = asyncio.get_running_loop()
        decided: asyncio.Future[None] = loop.create_future()
        over = [False]  # set once this round is decided, timed out or cancelled

        def record(index: int, reply: Any) -> None:
            results[index] = reply
            counts[0 if reply == yes_value else 1] += 1
            if (counts[0] >= need or counts[1] > give_up) and not decided.done():
                decided.set_result(None)

        now = time.monotonic()
        judged = [
            conn
            for conn, command in zip(self.connections, commands, strict=True)
            if command is not None and conn is not None and conn.pending
            if self._behind(conn, now, capped)
        ]
        if judged and _unread(judged):
            # As the sync transport reads a node before it judges it stalled: this loop may
            # have been blocked (a long garbage collection, a callback that does not yield)
            # while the replies came, and that is no fault of the node.
            await self._take_in(judged)
            now = time.monotonic()
        for index, command in enumerate(commands):
            conn = self.connections[index]
            if command is not None and conn is not None and conn.age(now) > self.stall_reset:
                # Open, but its oldest owed reply is long overdue (a black hole): replaced.
                conn._fail("stalled connection reset")
        missing = [
            index
            for index, command in enumerate(commands)
            if command is not None and not _usable(self.connections[index])
        ]
        if missing:  # connect the nodes that need it (or wait for their login), all at once
            await asyncio.gather(*(self.connection(index, timeout) for index in missing))
        pending = 0
        for index, command in enumerate(commands):
            if command is None:
                results[index] = None
                continue
            conn = self.connections[index]
            assert conn is not None
            if conn.broken is not None:
                record(index, NodeError(conn.broken))
                continue
            if capped and len(conn.pending) >= self.max_outstanding:
                reason = refusal(
                    len(conn.pending), conn.age(now), self.max_outstanding, self.stall_age
                )
                if reason is not None:
                    record(index, NodeError(reason))
                    continue
            pending += 1
            self._expect(conn, index, command, record, over, identify)
        if pending and not decided.done():
            # A timer on the loop instead of asyncio.wait_for: no extra task and no shield
            # per round trip (wait_for costs more than a loopback round trip here).
            timer = loop.call_later(timeout, _settle, decided)
            try:
                await decided
            finally:
                timer.cancel()
                over[0] = True
        over[0] = True
        if counts[0] < need and counts[1] <= give_up:
            # The deadline passed undecided. A reply that sits in its socket is an answer,
            # not a timeout: the loop may have been blocked while the nodes answered (the
            # timer can run before the loop reads what came during the block), and that
            # pause is the client's. The caller counts the validity from before the send,
            # so the lease still loses that time (the Redlock spec's step 3).
            await self._take_in(
                [
                    conn
                    for conn, reply in zip(self.connections, results, strict=True)
                    if conn is not None and reply is PENDING
                ],
                lambda: counts[0] >= need or counts[1] > give_up,
            )
        outcome = list(results)
        if counts[0] < need and counts[1] <= give_up:  # undecided: the deadline passed
            outcome = [TIMED_OUT if reply is PENDING else reply for reply in outcome]
        return outcome, counts[0], counts[1]

    def _behind(self, conn: _AsyncConnection, now: float, capped: bool) -> bool:
        """Whether ``conn``, which owes replies, is about to be judged by them: replaced
        (its oldest owed reply is older than the stall reset) or, when ``capped``, skipped
        (see :func:`~django_redlock.wire.setup.refusal`)."""
        age = conn.age(now)
        return age > self.stall_reset or (
            capped
            and len(conn.pending) >= self.max_outstanding
            and refusal(len(conn.pending), age, self.max_outstanding, self.stall_age) is not None
        )

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
        cancelled); the replies are read and dropped. Nodes not connected are skipped."""
        for index, (conn, command) in enumerate(zip(self.connections, commands, strict=True)):
            if command is not None and conn is not None and conn.ready and conn.broken is None:
                # Through _expect, so a NOSCRIPT reply still gets the EVAL fallback.
                self._expect(conn, index, fire_and_forget(command), _drop_reply)

    def _expect(
        self,
        conn: _AsyncConnection,
        index: int,
        command: Command,
        record: Any,
        over: list[bool] | None = None,
        identify: bool = False,
    ) -> None:
        """Send ``command`` on ``conn`` and record its reply as node ``index``'s answer
        (re-sent as EVAL once if the node had no copy of the script). Once ``over[0]`` is
        set, a fallback whose ``when_over`` is False is not sent: an acquire's SET re-sent
        after its attempt was given up (or cancelled) would land after the clean-up release
        and leave a key nobody releases."""

        def done(reply: Any) -> None:
            fallback = command[1]
            if (
                isinstance(reply, ReplyError)
                and str(reply).startswith("NOSCRIPT")
                and fallback is not None
            ):
                if over is not None and over[0] and not fallback.when_over:
                    conn.reload()  # too late to run, not to load
                    return
                self._expect(conn, index, (fallback.build(), None), record, over, fallback.identify)
                conn.reload()
                return
            record(index, NodeError(str(reply)) if isinstance(reply, ReplyError) else reply)

        conn._send_raw(command[0], done, identify)

    def close(self) -> None:
        for conn in self.connections:
            if conn is not None:
                conn.close()
        self.connections = [None] * len(self.addresses)
        self.subscriber.close()
