"""One round trip to every node at once: non-blocking sockets, pipelining and one poll loop.

Redlock's safety argument assumes the time to reach the nodes is small next to the lease
(the spec: "the client uses a timeout that is small compared to the auto-release time").
Asking nodes one after another makes that time grow with N; a thread per node costs more than
it saves. So each operation writes its command to every node's socket, then reads replies with
one ``poll()`` until the caller has an answer (a quorum reached, or no longer reachable) or the
per-node timeout ends.

Connections are plain sockets owned by one thread (see :class:`ConnectionSet`; the pub/sub
ones, on which waiters hear of releases, are shared by a manager's threads: see
:class:`Subscriber`). Each keeps a FIFO of the replies it still expects. A reply that arrives
after its operation gave up is read and dropped, so a connection with a reply in flight never
hands that reply to a later command; meanwhile later commands are pipelined behind it on the
same socket, which keeps the order of an acquire and its clean-up release on a node that
stalled (a SIGSTOPped server applies its queued input on SIGCONT: without that order a late SET
would leave a zombie key).
A node that owes too many replies is skipped without sending until it answers or its
connection is reset, so a stalled node costs neither time nor new connections.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import select
import socket
import ssl
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError, NotSent
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.process import current_pid
from django_redlock.wire.resp import (
    BAD_REPLY,
    PROTOCOL_ERRORS,
    ReplyError,
    encode_command,
    make_reader,
)
from django_redlock.wire.scripts import Command, Fallback, Script, fire_and_forget
from django_redlock.wire.setup import (
    HELLO_PERSISTENCE,
    HELLO_RUN_ID,
    UNIDENTIFIED,
    Handshake,
    Hello,
    describe,
    hello_quarantine,
    identity_of,
    persistence_hint,
    quarantine_of,
    refusal,
    resolve,
    run_id_of,
    tls_context,
    warm_tls,
)

__all__ = [
    "HELLO_PERSISTENCE",
    "HELLO_RUN_ID",
    "PENDING",
    "TIMED_OUT",
    "UNIDENTIFIED",
    "Command",
    "ConnectionSet",
    "Hello",
    "NodeError",
    "NotSent",
    "Script",
    "Subscriber",
    "ThreadConnections",
    "hello_quarantine",
    "identity_of",
    "new_waiter_id",
    "persistence_hint",
    "quarantine_of",
    "run_id_of",
    "wake_channel",
]

# A connection set unused this long (seconds) looks for closed sockets before sending.
_IDLE = 0.005
# Replies here are tiny; a large read buffer costs an allocation per recv for nothing.
_READ_SIZE = 8192
# POLLRDHUP: told when a TCP peer closes (a unix socket peer gives POLLHUP).
_RDHUP = getattr(select, "POLLRDHUP", 0)
_POLL_IN = select.POLLIN | select.POLLPRI | _RDHUP
_POLL_ERR = select.POLLERR | select.POLLHUP | select.POLLNVAL
_HUNG_UP = select.POLLHUP | _RDHUP
# Clean-ups and queued releases go behind up to this many times ``max_outstanding`` owed
# replies: twice the most that ``refusal`` lets a node owe, so a command sent under that bound
# always finds room for its clean-up behind it.
_ROOM = 8


class _Exchange:
    """Replies collected for one operation (one command per node), and its vote count.

    A reply equal to ``yes_value`` is a yes vote; any other reply or a failure is a no. The
    outcome is known once ``need`` said yes, or once more than ``size - need`` said no.
    """

    __slots__ = ("closed", "give_up", "need", "no", "pending", "results", "yes", "yes_value")

    def __init__(self, size: int, yes_value: object, need: int, give_up: int | None = None) -> None:
        self.results: list[Any] = [PENDING] * size
        self.pending = 0
        self.closed = False
        self.yes_value = yes_value
        self.need = need
        self.give_up = size - need if give_up is None else give_up
        self.yes = 0
        self.no = 0

    def record(self, index: int, reply: object) -> None:
        self.results[index] = reply
        self.pending -= 1
        if reply == self.yes_value:
            self.yes += 1
        else:
            self.no += 1


# One reply a connection still expects: (exchange or None for a set-up command, node index
# or the set-up reply's kind, NOSCRIPT fallback or None, when it was asked by the set's
# clock). A tuple: this is made for every command on the hot path.
_Slot = tuple[_Exchange | None, int, Fallback | None, float]


class _Connection(Handshake):
    """A non-blocking socket to one node, with its write buffer and expected replies.

    Raises:
        NodeError: the node cannot be reached at once (no address, refused, no such socket),
            or its credential provider failed.
    """

    def __init__(
        self,
        address: NodeAddress,
        clock: Callable[[], float],
        preload: Sequence[Script] = (),
        hello: Hello | None = None,
    ) -> None:
        super().__init__(address, hello, preload)
        self.tls = address.tls
        self.clock = clock
        self.out = bytearray()
        self.slots: deque[_Slot] = deque()
        self.reader = make_reader()
        self.tls_handshaking = False
        self.connecting = True
        setup = self.setup_commands()  # before the socket: a failing provider leaks nothing
        self.targets = resolve(address)
        self.sock = self._open()
        if not self.connecting and self.tls:
            try:
                self._start_tls()
            except NodeError:
                self.sock.close()
                raise
        now = clock()
        for command, kind in setup:
            self.out += command
            self.slots.append((None, kind, None, now))

    def _open(self) -> socket.socket:
        """Start a non-blocking connect to the next address not tried yet; TLS is layered on
        once TCP is up (see flush). An address that fails at once is passed over.

        Raises:
            NodeError: every address left failed at once (refused, no such socket).
        """
        error = "no address to connect to"
        while self.targets:
            family, target = self.targets.pop(0)
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                error = describe(exc)
                continue
            if family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            code = sock.connect_ex(target)
            if code in (0, errno.EINPROGRESS):
                self.connecting = code != 0
                return sock
            # EAGAIN on a unix socket means its backlog is full: the connect did not start.
            sock.close()
            error = os.strerror(code).lower()
        raise NodeError(error)

    def _start_tls(self) -> None:
        context = tls_context(self.address)  # built once per address, before any deadline
        try:
            self.sock = context.wrap_socket(
                self.sock, server_hostname=self.address.host, do_handshake_on_connect=False
            )
        except (OSError, ValueError) as exc:
            raise NodeError(f"TLS set-up failed: {exc}") from None
        self.tls_handshaking = True

    def fileno(self) -> int:
        return self.sock.fileno()

    def events(self) -> int:
        if self.connecting or self.out or self.tls_handshaking:
            return select.POLLOUT | _POLL_IN
        return _POLL_IN

    def send(self, command: bytes, slot: _Slot, identify: bool = False) -> None:
        """Queue ``command`` (expecting one reply for ``slot``) and write what the socket takes;
        with ``identify``, the connection's identity completes it (see :class:`Hello`).

        Raises:
            NodeError: the connection failed.
        """
        self.slots.append(slot)
        if self.held is None:  # the hello was answered: the common case, inlined
            if identify:
                command += self.identity
        else:
            command = self.outgoing(command, identify)
            if not command:
                return  # held until the hello is answered
        if self.out or self.connecting or self.tls_handshaking:
            self.out += command
            self.flush()
            return
        # Fast path: nothing buffered, so write straight from the command's bytes.
        try:
            sent = self.sock.send(command)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            sent = 0
        except OSError as exc:
            raise NodeError(describe(exc)) from None
        if sent < len(command):
            self.out += command[sent:]

    def send_held(self) -> None:
        """Send now, without the identity, the commands held until the hello is answered
        (the node checks its own process instead; see Handshake.outgoing).

        Raises:
            NodeError: the connection failed.
        """
        command = self.outgoing(b"", False)
        if command:
            self.out += command
            self.flush()

    def flush(self) -> None:
        """Write as much of the buffer as the socket takes now. A connect that failed moves
        on to the node's next address, if any (the socket, and its file descriptor, change).

        Raises:
            NodeError: the connection failed.
        """
        if self.connecting:
            code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code == 0 and not self._connected():
                return
            if code:
                self.sock.close()
                if not self.targets:
                    raise NodeError(os.strerror(code).lower())
                self.sock = self._open()
                if self.connecting:
                    return
            self.connecting = False
            if self.tls:
                self._start_tls()
        if self.tls_handshaking:
            assert isinstance(self.sock, ssl.SSLSocket)
            try:
                self.sock.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except ssl.SSLError as exc:
                raise NodeError(f"TLS handshake failed: {exc.reason or exc}") from None
            except OSError as exc:
                raise NodeError(describe(exc)) from None
            self.tls_handshaking = False
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return
            except OSError as exc:
                raise NodeError(describe(exc)) from None
            del self.out[:sent]

    def _connected(self) -> bool:
        try:
            self.sock.getpeername()
        except OSError:
            return False
        return True

    def receive(self) -> None:
        """Read what has arrived into the reply reader (without blocking).

        Raises:
            NodeError: the connection closed or failed.
        """
        if self.connecting or self.tls_handshaking:
            self.flush()
            if self.connecting or self.tls_handshaking:
                return
        sock = self.sock
        while True:
            try:
                data = sock.recv(_READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError as exc:
                raise NodeError(describe(exc)) from None
            if not data:
                raise NodeError("connection closed by the server")
            self.reader.feed(data)
            if len(data) < _READ_SIZE and not (self.tls and sock.pending()):  # type: ignore[attr-defined]
                return

    def replies(self) -> Any:
        """The next reply read (``False``: none complete yet).

        Raises:
            NodeError: the bytes are not RESP (:data:`~django_redlock.wire.resp.BAD_REPLY`).
        """
        try:
            return self.reader.gets()
        except PROTOCOL_ERRORS:
            raise NodeError(BAD_REPLY) from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _noscript(reply: object) -> bool:
    """The node had no copy of the script (after SCRIPT FLUSH, a restart, a failover)."""
    return type(reply) is ReplyError and str(reply).startswith("NOSCRIPT")


def _close_quietly(connections: list[_Connection | None]) -> None:
    """Close every socket in ``connections`` (in place: the list is emptied of them)."""
    for index, conn in enumerate(connections):
        if conn is not None:
            conn.close()
            connections[index] = None


class ConnectionSet:
    """One connection per node for one thread, and the poll loop that uses them.

    Not thread-safe by design: :class:`~django_redlock.redlock.LockManager` keeps one set per
    thread, so no lock is taken on the hot path. A set notices a fork (the child owns none of
    the parent's sockets) and starts afresh.

    Args:
        addresses: the nodes, in the manager's order.
        clock: monotonic clock in seconds (injected by tests).
        max_outstanding: replies a node may owe before it is judged by the age of the oldest
            (see :func:`~django_redlock.wire.setup.refusal`): skipped without sending if
            that reply is older than ``stall_age``.
        stall_reset: seconds a node may owe a reply before its connection is replaced.
        stall_age: seconds past which an owed reply is late (default: ``stall_reset / 20``,
            the manager's node timeout).
        preload: scripts loaded (SCRIPT LOAD) on every new connection.
        hello: what every new connection asks the node after its login (see :class:`Hello`).
    """

    def __init__(
        self,
        addresses: Sequence[NodeAddress],
        *,
        clock: Callable[[], float],
        max_outstanding: int,
        stall_reset: float,
        preload: Sequence[Script] = (),
        hello: Hello | None = None,
        stall_age: float | None = None,
    ) -> None:
        self.addresses = tuple(addresses)
        warm_tls(self.addresses)  # now, not inside the first command's deadline
        self.preload = tuple(preload)
        self.hello = hello
        self.clock = clock
        self.max_outstanding = max_outstanding
        self.stall_reset = stall_reset
        self.stall_age = stall_reset / 20 if stall_age is None else stall_age
        self.pid = current_pid()
        self.connections: list[_Connection | None] = [None] * len(self.addresses)
        # One poll object for the set's life: every open socket stays registered, so a wait
        # costs one poll() call per wake-up and no per-call registration.
        self.poller = select.poll()
        self.by_fd: dict[int, int] = {}
        self.polling: dict[int, int] = {}
        self.last_post = float("-inf")
        # Whether a connection opened lately may still hold commands until its hello is
        # answered (see wait): checked only then, not on every round trip.
        self.settling = False
        # The pub/sub sockets: the manager's, shared by all its threads (see ThreadConnections),
        # or this set's own, opened on first use, when the set stands alone.
        self._subscriber: Subscriber | None = None
        self._shared_subscriber = False
        # Closes the sockets when the set is dropped without close(). A weakref finalizer
        # runs before the garbage collector finalizes the sockets themselves, even when the
        # set is freed as part of a reference cycle; it holds the list, not the set.
        weakref.finalize(self, _close_quietly, self.connections)

    @property
    def subscriber(self) -> Subscriber:
        """The pub/sub sockets a waiting acquire listens on: the manager's, shared by all its
        threads, or (a set standing alone) this set's own, opened on first use."""
        if self._subscriber is None:
            self._subscriber = Subscriber(self.addresses)
        return self._subscriber

    def share(self, subscriber: Subscriber) -> None:
        """Listen on ``subscriber`` (shared with other sets, which close and count it)."""
        self._subscriber = subscriber
        self._shared_subscriber = True

    def open_count(self) -> int:
        """How many sockets this set holds open now (its own pub/sub ones included, a shared
        subscriber's not: :class:`ThreadConnections` counts those once)."""
        count = sum(1 for conn in self.connections if conn is not None)
        if self._subscriber is not None and not self._shared_subscriber:
            count += self._subscriber.open_count()
        return count

    def close(self) -> None:
        """Close every socket (in the owning process only)."""
        if self.pid != current_pid():
            self._forget_all()
            return
        for index in range(len(self.connections)):
            self._drop(index, "connection closed by the client")
        if self._subscriber is not None and not self._shared_subscriber:
            self._subscriber.close()

    def _forget_all(self) -> None:
        # After fork: the sockets are copies of the parent's. Closing our copy does not touch
        # the parent's connection (no shutdown is sent), and nothing is read or written.
        _close_quietly(self.connections)
        if not self._shared_subscriber:  # a shared one starts afresh in its own fork hook
            if self._subscriber is not None:
                _close_quietly(self._subscriber.connections)
            self._subscriber = None
        self.poller = select.poll()
        self.by_fd.clear()
        self.polling.clear()
        self.pid = current_pid()

    def _drop(self, index: int, reason: str) -> None:
        conn = self.connections[index]
        if conn is None:
            return
        self.connections[index] = None
        fd = self.by_fd.pop(index, None)
        if fd is not None:
            self.polling.pop(fd, None)
            self.poller.unregister(fd)
        conn.close()
        for exchange, index_, _, _ in conn.slots:
            if exchange is not None and not exchange.closed:
                exchange.record(index_, NodeError(reason))

    def _connection(self, index: int, now: float) -> _Connection:
        """The usable connection to node ``index``, opened if needed.

        Replies still owed from earlier operations do not stop a new command: it is pipelined
        behind them and they are read (and dropped) as they come. A node is judged by the age
        of its oldest owed reply, not by a count alone (see
        :func:`~django_redlock.wire.setup.refusal`): one that owes many replies, the oldest
        older than ``stall_age``, is first drained without blocking, then skipped if that
        did not help; one whose oldest owed reply is older than ``stall_reset`` gets a new
        connection (a black hole: open, never answering).

        Raises:
            NodeError: the node cannot be reached, or is stalled.
        """
        conn = self.connections[index]
        if conn is not None and conn.slots:
            age = now - conn.slots[0][3]
            if age > self.stall_reset or (
                len(conn.slots) >= self.max_outstanding
                and refusal(len(conn.slots), age, self.max_outstanding, self.stall_age)
            ):
                self._read(index, conn)
                conn = self.connections[index]
                if conn is not None and conn.slots:
                    age = now - conn.slots[0][3]
                    if age > self.stall_reset:
                        self._drop(index, "stalled connection reset")
                        conn = None
                    else:
                        reason = refusal(len(conn.slots), age, self.max_outstanding, self.stall_age)
                        if reason is not None:
                            raise NodeError(reason)
        if conn is None:
            conn = _Connection(self.addresses[index], self.clock, self.preload, self.hello)
            self.settling = self.hello is not None
            self.connections[index] = conn
            self._rearm(index, conn)
        return conn

    def _rearm(self, index: int, conn: _Connection) -> None:
        """Poll ``conn`` for what it waits on now, under its current file descriptor (a
        connect that moved on to the node's next address has a new socket)."""
        fd = conn.fileno()
        if self.by_fd.get(index) == fd:
            self.poller.modify(fd, conn.events())
            return
        old = self.by_fd.pop(index, None)
        if old is not None:
            self.polling.pop(old, None)
            with contextlib.suppress(KeyError):
                self.poller.unregister(old)
        self.by_fd[index] = fd
        self.polling[fd] = index
        self.poller.register(fd, conn.events())

    def _read(self, index: int, conn: _Connection, hung_up: bool = False) -> None:
        """Read what node ``index`` sent and hand each reply to the operation waiting for it
        (a node that fails, or sends bytes that are not RESP, is dropped and its owed replies
        become errors).

        ``hung_up``: the poll said the node closed the connection. Its last replies and the
        close often come in one read, which then ends without seeing the close: the
        connection is dropped here, after those replies, so that the next command (the
        release right after a node restarted) goes on a new connection instead of failing
        with "broken pipe" on this one, and the key it should delete staying until its ttl.
        """
        try:
            conn.receive()
        except NodeError as exc:
            self._drop(index, str(exc))
            return
        if conn.connecting:  # may have moved on to the node's next address
            self._rearm(index, conn)
            return
        reader = conn.reader
        slots = conn.slots
        while slots:
            try:
                reply = reader.gets()
            except PROTOCOL_ERRORS:
                self._drop(index, BAD_REPLY)
                return
            if reply is False:
                break
            exchange, slot_index, fallback, _ = slots.popleft()
            if exchange is None:
                try:
                    out = conn.learn(slot_index, reply)
                except NodeError as exc:  # AUTH or SELECT refused: the connection is useless
                    self._drop(index, str(exc))
                    return
                if out and not self._write(index, conn, out):
                    return
                continue
            if exchange.closed and (fallback is None or not fallback.when_over):
                if fallback is not None and _noscript(reply):  # too late to run, not to load
                    for command, kind in conn.reload_commands():
                        if not self._write_expecting(index, conn, command, kind):
                            return
                continue
            if type(reply) is ReplyError:
                if fallback is not None and _noscript(reply):
                    if not self._resend(index, conn, fallback, exchange, slot_index):
                        return
                    continue
                reply = NodeError(str(reply))
            if not exchange.closed:
                exchange.record(slot_index, reply)
        if hung_up:
            self._drop(index, "connection closed by the server")

    def _write(self, index: int, conn: _Connection, data: bytes) -> bool:
        """Write ``data`` (no reply expected of its own) on ``conn``; False if that failed
        (the node was dropped)."""
        conn.out += data
        try:
            conn.flush()
        except NodeError as exc:
            self._drop(index, str(exc))
            return False
        self._rearm(index, conn)
        return True

    def _write_expecting(self, index: int, conn: _Connection, command: bytes, kind: int) -> bool:
        """Send set-up ``command`` (its reply of ``kind`` goes to the handshake); False if
        the node was dropped."""
        return self._send_or_drop(index, conn, [(command, (None, kind, None, self.clock()))])

    def _resend(
        self, index: int, conn: _Connection, fallback: Fallback, exchange: _Exchange, slot: int
    ) -> bool:
        """The node had no copy of a script (NOSCRIPT): send the EVAL fallback for node
        ``slot`` of ``exchange``, and load the scripts again. False if the node was dropped."""
        now = self.clock()
        # Completed with the connection's identity when the command it replaces was.
        try:
            conn.send(fallback.build(), (exchange, slot, None, now), fallback.identify)
        except NodeError as exc:
            self._drop(index, str(exc))
            return False
        sends = [(command, (None, kind, None, now)) for command, kind in conn.reload_commands()]
        return self._send_or_drop(index, conn, sends)

    def _send_or_drop(
        self, index: int, conn: _Connection, sends: Sequence[tuple[bytes, _Slot]]
    ) -> bool:
        """Send each command with the reply slot it fills; False (and the node dropped) when
        the connection failed."""
        try:
            for command, slot in sends:
                conn.send(command, slot)
        except NodeError as exc:
            self._drop(index, str(exc))
            return False
        if conn.out:
            self._rearm(index, conn)
        return True

    def post(
        self,
        commands: Sequence[Command | None],
        yes_value: object = None,
        need: int = 0,
        give_up: int | None = None,
        identify: bool = False,
        *,
        queue_behind: bool = False,
    ) -> _Exchange:
        """Send ``commands[i]`` (command, EVAL fallback) to node ``i``; ``None`` skips a node.
        With ``identify``, each command is completed with its connection's identity (two
        more arguments, see :class:`Hello`; :data:`UNIDENTIFIED` until the node answered).

        Returns the exchange whose results fill in as replies are read; a reply equal to
        ``yes_value`` is a yes vote, and the outcome is known at ``need`` yes votes or at more
        than ``give_up`` other answers (default ``len(commands) - need``).

        ``queue_behind``: a node judged stalled still gets the command, queued behind what it
        owes (up to eight times ``max_outstanding`` replies), instead of being skipped. For a
        release: a skipped release leaves the key to its ttl, a queued one frees the lock as
        soon as the node catches up. A connection past the stall reset is still replaced.
        """
        exchange = _Exchange(len(commands), yes_value, need, give_up)
        now = self.clock()
        if self.pid != current_pid():
            self._forget_all()
        if now - self.last_post > _IDLE:
            # After a pause, first take in what arrived meanwhile: a node that restarted has
            # closed our socket, and learning that now (instead of from a failed send) lets
            # this very operation reconnect to it.
            self._poll_once(0)
        self.last_post = now
        connections = self.connections
        for index, command in enumerate(commands):
            if command is None:
                exchange.results[index] = None
                continue
            conn = connections[index]
            if (conn is None or conn.slots) and not (
                queue_behind and conn is not None and self._can_queue_behind(conn, now)
            ):
                try:
                    conn = self._connection(index, now)
                except NodeError as exc:
                    # Stored without its traceback: frames hold this set, and a cycle through
                    # them would leave the sockets to the garbage collector.
                    exchange.results[index] = NotSent(str(exc))
                    exchange.no += 1
                    continue
            exchange.pending += 1
            try:
                conn.send(command[0], (exchange, index, command[1], now), identify)
            except NodeError as exc:
                # Records the error for this slot (and any other still owed) on this node.
                self._drop(index, str(exc))
                continue
            if conn.out:  # includes a connect or TLS handshake still under way
                self._rearm(index, conn)
        return exchange

    def clean_up(self, commands: Sequence[Command | None]) -> None:
        """Send ``commands[i]`` to node ``i`` and read their replies later, unused (``None``
        skips a node): the release of a failed attempt, or leaving a wait line.

        A clean-up undoes a command sent before it that a stalled node may not have run yet
        (a SIGSTOPped server runs its queued input when it wakes), so it must reach the node
        *after* that command: it goes on the same connection whatever that connection owes.
        The cap on owed replies does not apply up to twice ``max_outstanding`` (a memory
        bound that never bites a release that matters: an acquire is only sent below the cap,
        and its clean-up follows at once), and a stall reset does not move it elsewhere. A
        connection past ``stall_reset`` may be half-open instead of stalled, so there the
        clean-up goes once more on a new connection; clean-ups are idempotent.
        """
        if self.pid != current_pid():
            self._forget_all()
        now = self.clock()
        # Its replies are read and dropped (closed), except that a NOSCRIPT still gets the
        # EVAL fallback: clean-up commands are built with ``when_over=True``.
        ignored = _Exchange(len(commands), None, 0)
        ignored.closed = True
        for index, given in enumerate(commands):
            if given is None:
                continue
            command = fire_and_forget(given)
            conn = self.connections[index]
            if conn is not None and conn.slots:
                if len(conn.slots) < _ROOM * self.max_outstanding:
                    self._send_to(index, conn, command, ignored, now)
                if not conn.slots or now - conn.slots[0][3] <= self.stall_reset:
                    continue
                self._drop(index, "stalled connection reset")
            try:
                conn = self._connection(index, now)
            except NodeError:
                continue  # best effort: nothing more can be done for this node now
            self._send_to(index, conn, command, ignored, now)

    def _can_queue_behind(self, conn: _Connection, now: float) -> bool:
        slots = conn.slots
        return len(slots) < _ROOM * self.max_outstanding and (
            not slots or now - slots[0][3] <= self.stall_reset
        )

    def _send_to(
        self, index: int, conn: _Connection, command: Command, exchange: _Exchange, now: float
    ) -> None:
        try:
            conn.send(command[0], (exchange, index, command[1], now))
        except NodeError as exc:
            self._drop(index, str(exc))
            return
        if conn.out:
            self._rearm(index, conn)

    def wait(self, exchange: _Exchange, deadline: float) -> _Exchange:
        """Read replies until the outcome is known, every node answered, or ``deadline``.

        Afterwards ``exchange.results`` holds per node: the reply, ``None`` for a skipped
        node, a :class:`NodeError`, :data:`TIMED_OUT` (no reply by the deadline) or
        :data:`PENDING` (not waited for: the outcome was already known). Late replies are
        read and dropped by later operations.

        A reply that already sits in its socket when the deadline is found passed counts as
        an answer, never as :data:`TIMED_OUT`: this thread may have been away (a garbage
        collection, a slow thread holding the GIL, SIGSTOP) while the nodes answered, and
        that pause is the client's, not the nodes'. It costs nothing to the lease's safety:
        the caller counts the validity from before the commands were sent (the Redlock
        spec's step 3), so the time the client was away is still taken off the lease.
        """
        try:
            need, give_up = exchange.need, exchange.give_up
            drained = False
            while exchange.pending > 0 and exchange.yes < need and exchange.no <= give_up:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    if not drained:
                        # Before judging any node late, take in what arrived meanwhile: one
                        # look without waiting at every socket (each is read to its end).
                        drained = True
                        self._poll_once(0)
                        continue
                    results = exchange.results
                    for index, reply in enumerate(results):
                        if reply is PENDING:
                            results[index] = TIMED_OUT
                    break
                self._poll_once(remaining)
        finally:
            exchange.closed = True
        if self.settling:
            # Until every new connection's hello is answered (held is None): one whose hello
            # is still out may hold the commands of this round or of a later one.
            if any(conn is not None and conn.held is not None for conn in self.connections):
                # Take in what has arrived (held commands then go out identified), then send
                # what is still held.
                self._poll_once(0)
                self._send_held()
            else:
                self.settling = False
        return exchange

    def _send_held(self) -> None:
        """Send, unidentified, what new connections still hold behind an unanswered hello.

        The round is over, so the vote that the identity speeds up no longer matters; held
        to this thread's next operation, which may never come, a command could reach its
        node at any later time or never: a lease's SET that misses the last node of a
        quorum leaves the lease one failure from lost, and a late one takes a key after the
        lease is over. Left as it is: a connection still connecting or in its TLS handshake
        keeps these bytes buffered until this thread's next poll (waiting for it here would
        add a connect to the round that already has its answer).
        """
        for index, conn in enumerate(self.connections):
            if conn is None or not conn.held:
                continue
            try:
                conn.send_held()
            except NodeError as exc:
                self._drop(index, str(exc))
                continue
            if conn.out:
                self._rearm(index, conn)

    def _poll_once(self, timeout: float) -> None:
        # poll() takes whole milliseconds; round up so a short timeout is not a busy loop
        # (a timeout of exactly 0 only looks).
        wait = 0 if timeout == 0 else max(1, int(timeout * 1000 + 0.999))
        for fd, event in self.poller.poll(wait):
            index = self.polling.get(fd)
            if index is None:
                continue
            conn = self.connections[index]
            if conn is None:  # pragma: no cover - dropped earlier in this same loop
                continue
            if event & select.POLLOUT:
                try:
                    conn.flush()
                except NodeError as exc:
                    self._drop(index, str(exc))
                    continue
                self._rearm(index, conn)
            if event & (_POLL_IN | _POLL_ERR):
                self._read(index, conn, hung_up=bool(event & _HUNG_UP))

    def run(
        self,
        commands: Sequence[Command | None],
        deadline: float,
        yes_value: object,
        need: int,
        give_up: int | None = None,
        identify: bool = False,
        *,
        queue_behind: bool = False,
    ) -> _Exchange:
        """:meth:`post` then :meth:`wait`: one round trip to every node."""
        exchange = self.post(
            commands, yes_value, need, give_up, identify, queue_behind=queue_behind
        )
        return self.wait(exchange, deadline)


class ThreadConnections:
    """Hands each thread its own :class:`ConnectionSet`, and closes them all on demand.

    Every set listens on one :class:`Subscriber` shared by all the threads, so threads that
    wait for locks add no connections: per node, one command connection per thread that used
    the manager, plus one pub/sub connection.

    After ``fork()`` the child's sets start afresh before any use (:meth:`get`), so a child
    never reads or writes a socket it shares with its parent, pub/sub ones included.
    """

    def __init__(self, factory: Callable[[], ConnectionSet]) -> None:
        self._factory = factory
        self._local = threading.local()
        self._all: weakref.WeakSet[ConnectionSet] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._subscriber: Subscriber | None = None
        _EVERY_THREAD_CONNECTIONS.add(self)

    def get(self) -> ConnectionSet:
        sets: ConnectionSet | None = getattr(self._local, "sets", None)
        if sets is None:
            sets = self._factory()
            self._local.sets = sets
            with self._lock:
                if self._subscriber is None:
                    self._subscriber = Subscriber(sets.addresses)
                sets.share(self._subscriber)
                self._all.add(sets)
        elif sets.pid != current_pid():
            sets._forget_all()  # forked: our copies of the parent's sockets are closed unused
        return sets

    def _after_fork_in_child(self) -> None:
        # Another thread of the parent may have held the lock at the instant of the fork;
        # that thread does not exist here, so the child's copy would stay locked forever.
        self._lock = threading.Lock()

    def open_count(self) -> int:
        """How many node sockets are open now, in every thread (the shared pub/sub ones
        counted once)."""
        with self._lock:
            count = sum(sets.open_count() for sets in list(self._all))
            if self._subscriber is not None:
                count += self._subscriber.open_count()
            return count

    def close(self) -> None:
        with self._lock:
            every = list(self._all)
            subscriber = self._subscriber
        for sets in every:
            sets.close()
        if subscriber is not None:
            subscriber.close()


_EVERY_THREAD_CONNECTIONS: weakref.WeakSet[ThreadConnections] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for connections in list(_EVERY_THREAD_CONNECTIONS):
        connections._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def wake_channel(key: str, listener: str) -> str:
    """The pub/sub channel on which ``listener``'s waiters for lock ``key`` are woken (the
    name ``scripts/wake_next.lua`` publishes to: the key, NUL, ``w``, the listener id)."""
    return f"{key}\x00w{listener}"


def new_waiter_id(listener: str) -> str:
    """A fresh id for one blocking acquire of ``listener``: ``<listener>.<nonce>``."""
    return f"{listener}.{secrets.token_hex(4)}"


class Subscriber:
    """Pub/sub sockets (one per node) on which the waiting acquires of one manager, in every
    thread of this process, hear of releases.

    Each subscriber is a *listener* with its own channel per lock (the lock key, ``"\\x00w"``,
    the listener id), and its waiters' ids start with the listener id (:meth:`waiter_id`).
    A release publishes only to the first waiter in line (``scripts/wake_next.lua``), and the
    message is that waiter's id, so a hand-off wakes one thread, not every waiter on every
    node. A message only says "your turn may have come": the caller then retries, so a message
    lost or a node that fails costs at most one poll delay.

    Shared by every thread of the manager (one per manager and process, held by
    :class:`ThreadConnections`), so waiting never adds connections: a process holds at most
    one command connection per thread and node plus this one pub/sub connection per node.
    (One per thread doubled them while threads waited in one line.)

    Design: no thread of its own. The waiting threads take turns reading ("whoever waits
    reads"): one at a time polls the sockets, without the lock, for as long as it waits
    itself; it routes each message, under the lock, to the waiter it names (a flag per
    registered waiter, and a notify of that waiter's condition only, so a message wakes one
    thread), and hands the reading over to a waiting thread when it leaves. A background
    reader thread would need a start after fork and a stop on close, and would wake on every
    message even with no waiter left. Commands (SUBSCRIBE, UNSUBSCRIBE, the login) are written
    under the lock by the thread that needs them, and a byte on a pipe makes the reader poll
    again with the new sockets and buffers.

    A channel is listed once every node confirmed it; a waiter that registered (before its
    first try) after that skips subscribing and the extra try that follows a subscription.
    Channels are counted by the acquires listening on them (:meth:`subscribe` with a
    ``waiter``, until :meth:`unregister`): only a channel nobody listens on is unsubscribed
    when more than :attr:`KEEP` are kept. A node that fails is dropped; the next subscribe
    opens it again and subscribes there every channel kept or listened on. After ``fork()``
    the child closes its copies of the parent's sockets unused and becomes a new listener, so
    it never hears the parent's wake-ups.
    """

    # Channels stay subscribed between waits (a thread that waited for a lock once is likely
    # to wait for it again): SUBSCRIBE/UNSUBSCRIBE on every node for every wait would cost
    # more than the wait itself. The oldest nobody listens on are dropped past this many.
    KEEP = 16

    def __init__(self, addresses: Sequence[NodeAddress]) -> None:
        self.addresses = tuple(addresses)
        self.connections: list[_Connection | None] = [None] * len(self.addresses)
        self.pipe: list[int] = []  # read end, write end: wakes the reading thread's poll
        self._fresh()
        weakref.finalize(self, _close_subscriber, self.connections, self.pipe)
        _EVERY_SUBSCRIBER.add(self)

    def _fresh(self) -> None:
        """Start with no channel, no waiter and no reader (at creation, and after fork)."""
        self.pid = current_pid()
        self.listener = secrets.token_hex(6)
        self.lock = threading.Lock()
        # Subscribed and confirmed on every node open since: the stamp of its listing (see
        # subscribe), oldest used first.
        self.channels: dict[str, int] = {}
        self.stamp = 0  # the next listing's stamp
        self.born: dict[bytes, int] = {}  # registered waiter: the next stamp at registration
        self.users: dict[str, int] = {}  # channel: acquires listening on it now
        self.listens: dict[bytes, str] = {}  # waiter: the channel it is counted on
        self.woken: dict[bytes, bool] = {}  # registered waiter: named since its last wait
        self.sleepers: dict[threading.Condition, Callable[[], bool]] = {}
        self.reading = False
        # Per node: SUBSCRIBE confirmations asked and heard on the current connection, and
        # how many connections were dropped (a confirmation owed by a dropped one never
        # comes).
        self.asked = [0] * len(self.addresses)
        self.heard = [0] * len(self.addresses)
        self.drops = [0] * len(self.addresses)

    def _after_fork_in_child(self) -> None:
        # Our copies of the parent's sockets and pipe: closed unused (no shutdown is sent,
        # the parent's connections stay up). A thread of the parent may have held the lock or
        # been reading at the instant of the fork: it does not exist here.
        _close_subscriber(self.connections, self.pipe)
        self._fresh()

    def _check_fork(self) -> None:
        if self.pid != current_pid():  # pragma: no cover - the fork hook did it already
            self._after_fork_in_child()

    def waiter_id(self) -> str:
        """A new id for one blocking acquire, ``<listener>.<nonce>`` (see wake_next.lua),
        registered: from now on a release naming it is kept until :meth:`wait` or
        :meth:`unregister`. Every id given must be unregistered when its acquire ends."""
        self._check_fork()
        waiter = new_waiter_id(self.listener)
        with self.lock:
            self.woken[waiter.encode()] = False
            self.born[waiter.encode()] = self.stamp
        return waiter

    def unregister(self, waiter: str) -> None:
        """Forget ``waiter`` (its acquire is over) and stop counting it on its channel."""
        key = waiter.encode()
        with self.lock:
            self.woken.pop(key, None)
            self.born.pop(key, None)
            channel = self.listens.pop(key, None)
            if channel is not None:
                left = self.users[channel] - 1
                if left:
                    self.users[channel] = left
                else:
                    del self.users[channel]
                    self._trim()

    def channel(self, key: str) -> str:
        """The channel on which this listener's waiters for ``key`` are woken."""
        return wake_channel(key, self.listener)

    def subscribe(self, key: str, timeout: float, waiter: str = "") -> bool:
        """Subscribe to this listener's channel for lock ``key`` on every node and wait (up to
        ``timeout`` seconds) for the nodes to confirm, so that a release from then on cannot
        go unheard.

        Returns False, doing nothing, when the channel was already subscribed and confirmed
        on every node (a release since then was heard), True when it had to subscribe (the
        caller then tries once more: a release between its last try and the subscription
        was not heard). ``waiter`` (from :meth:`waiter_id`) is counted as listening on the
        channel until it is unregistered, so no other thread unsubscribes it meanwhile; it
        skips the subscription only if the channel was confirmed before it registered, that
        is before its first try (if another thread listed it later, a release between that
        try and the confirmation went unheard).

        Never raises: a node that cannot be reached is left out (its releases are not
        heard; the caller's poll delay covers it).
        """
        self._check_fork()
        channel = self.channel(key)
        with self.lock:
            if waiter and waiter.encode() not in self.listens:
                self.listens[waiter.encode()] = channel
                self.users[channel] = self.users.get(channel, 0) + 1
            listed = self.channels.get(channel)
            if (
                listed is not None
                and listed < self.born.get(waiter.encode(), self.stamp)
                and all(self.connections)
            ):
                self.channels[channel] = self.channels.pop(channel)  # most recently used
                return False
            owed = self._send(b"SUBSCRIBE", channel)
            drops = list(self.drops)

            def confirmed() -> bool:
                return all(
                    self.heard[index] >= asked or self.drops[index] != drops[index]
                    for index, asked in owed.items()
                )

            if self._progress(confirmed, time.monotonic() + timeout):
                # Listed only now: a waiter registered after this may skip its extra try.
                self.channels[channel] = self.channels.pop(channel, self.stamp)
                self.stamp += 1
                self._trim()
        return True

    def wait(self, timeout: float, waiter: str) -> bool:
        """Wait up to ``timeout`` seconds for a release that names ``waiter`` (an id from
        :meth:`waiter_id`, not yet unregistered); True if one came since its last wait."""
        self._check_fork()
        key = waiter.encode()
        with self.lock:
            if key not in self.woken:  # pragma: no cover - the acquire loop registers first
                self.woken[key] = False
            self._progress(lambda: self.woken.get(key, False), time.monotonic() + timeout)
            woken = self.woken.get(key, False)
            if key in self.woken:
                self.woken[key] = False
        return woken

    def _trim(self) -> None:
        """Unsubscribe the oldest channels nobody listens on past :attr:`KEEP` (lock held)."""
        if len(self.channels) <= self.KEEP:
            return
        for channel in [c for c in self.channels if c not in self.users]:
            del self.channels[channel]
            self._send(b"UNSUBSCRIBE", channel)
            if len(self.channels) <= self.KEEP:
                return

    def _send(self, verb: bytes, channel: str) -> dict[int, int]:
        """Write ``verb channel`` to every node, opening what is closed (lock held): per node
        written to, the count of SUBSCRIBE confirmations that includes this one."""
        owed: dict[int, int] = {}
        for index, conn in enumerate(self.connections):
            channels = [channel]
            if conn is None:
                if verb != b"SUBSCRIBE":
                    continue  # a new connection subscribes nothing it was not asked to
                try:
                    conn = _Connection(self.addresses[index], time.monotonic)
                except NodeError:
                    continue
                self.connections[index] = conn
                self.asked[index] = self.heard[index] = 0
                # Everything kept or listened on, on the node that just came back.
                channels = list(dict.fromkeys([*self.channels, *self.users, channel]))
                verb_here = b"SUBSCRIBE"
            else:
                verb_here = verb
            conn.out += encode_command(verb_here, *channels)
            if verb_here == b"SUBSCRIBE":
                self.asked[index] += len(channels)
                owed[index] = self.asked[index]
            try:
                conn.flush()
            except NodeError:
                self._drop(index)
        self._nudge()
        return owed

    def _drop(self, index: int) -> None:
        """Close node ``index``'s socket (lock held); confirmations owed on it are given up."""
        conn = self.connections[index]
        if conn is not None:
            conn.close()
            self.connections[index] = None
            self.drops[index] += 1
            # Listed channels must be confirmed on the next connection to this node before
            # a waiter skips its extra try (those listened on are subscribed there at once).
            self.channels.clear()
            self._notify_done()

    def _nudge(self) -> None:
        """Make the reading thread poll again now, with the sockets and buffers as they are."""
        if self.reading and self.pipe:
            with contextlib.suppress(OSError):  # full: a nudge is pending already
                os.write(self.pipe[1], b"x")

    def _notify_done(self) -> None:
        for condition, done in self.sleepers.items():
            if done():
                condition.notify()

    def _progress(self, done: Callable[[], bool], deadline: float) -> bool:
        """Until ``done()`` or ``deadline`` (monotonic seconds): read the sockets if no other
        thread does, else sleep until told. Called with the lock held; returns ``done()``."""
        condition: threading.Condition | None = None
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if not self.reading:
                self._read(done, deadline)
                continue
            if condition is None:
                condition = threading.Condition(self.lock)
            self.sleepers[condition] = done
            try:
                condition.wait(remaining)
            finally:
                del self.sleepers[condition]
        return True

    def _read(self, done: Callable[[], bool], deadline: float) -> None:
        """Poll and route until ``done()`` or ``deadline``, as the one reading thread (lock
        held, released while polling); then hand the reading to a thread still waiting."""
        self.reading = True
        try:
            if not self.pipe:
                self.pipe.extend(os.pipe())
                for fd in self.pipe:
                    os.set_blocking(fd, False)
            while not done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                # With no socket open this only sleeps (the caller's poll delay applies), woken
                # early by a nudge: a subscribe opened a connection.
                poller = select.poll()
                polled: dict[int, tuple[int, _Connection]] = {}
                for index, conn in enumerate(self.connections):
                    if conn is not None:
                        polled[conn.fileno()] = (index, conn)
                        poller.register(conn.fileno(), conn.events())
                poller.register(self.pipe[0], select.POLLIN)
                self.lock.release()
                try:
                    events = poller.poll(max(1, int(remaining * 1000 + 0.999)))
                finally:
                    self.lock.acquire()
                self._route(events, polled)
        finally:
            self.reading = False
            # The next reader: one thread still waiting (those done were told already).
            for condition, other in self.sleepers.items():
                if not other():
                    condition.notify()
                    break

    def _route(
        self, events: list[tuple[int, int]], polled: dict[int, tuple[int, _Connection]]
    ) -> None:
        """Read what ``events`` report (lock held): set the flag of each waiter a message
        names and wake that thread; count SUBSCRIBE confirmations; drop failed nodes."""
        for fd, event in events:
            if fd == self.pipe[0]:
                with contextlib.suppress(OSError):
                    os.read(fd, 4096)
                continue
            index, conn = polled[fd]
            if self.connections[index] is not conn:
                continue  # dropped (and maybe reopened) while we polled
            try:
                if event & select.POLLOUT:
                    conn.flush()
                if event & (_POLL_IN | _POLL_ERR):
                    conn.receive()
                    while (reply := conn.replies()) is not False:
                        if conn.slots:  # the login's own replies come first
                            conn.learn(conn.slots.popleft()[1], reply)
                        elif isinstance(reply, list) and len(reply) == 3:
                            if reply[0] == b"message" and isinstance(reply[2], bytes):
                                self._wake(reply[2])
                            elif reply[0] == b"subscribe":
                                self.heard[index] += 1
            except NodeError:
                self._drop(index)
        self._notify_done()

    def _wake(self, waiter: bytes) -> None:
        """A release named ``waiter``: keep it for its next wait (if it is still registered:
        a message for an acquire that is over is dropped)."""
        if waiter in self.woken:
            self.woken[waiter] = True

    def open_count(self) -> int:
        """How many pub/sub sockets are open now (at most one per node)."""
        return sum(1 for conn in self.connections if conn is not None)

    def close(self) -> None:
        """Close the sockets (they reopen on the next subscribe). Waiters still registered
        stay so; those listening hear nothing more until they subscribe again (their poll
        delay covers it)."""
        self._check_fork()
        with self.lock:
            for index in range(len(self.connections)):
                self._drop(index)
            self._nudge()  # a thread polling the closed sockets would not notice


def _close_subscriber(connections: list[_Connection | None], pipe: list[int]) -> None:
    """Close a subscriber's sockets and pipe (in place: both lists are emptied of them)."""
    _close_quietly(connections)
    for fd in pipe:
        with contextlib.suppress(OSError):
            os.close(fd)
    pipe.clear()


_EVERY_SUBSCRIBER: weakref.WeakSet[Subscriber] = weakref.WeakSet()


def _after_fork_in_child_subscribers() -> None:
    for subscriber in list(_EVERY_SUBSCRIBER):
        subscriber._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child_subscribers)
