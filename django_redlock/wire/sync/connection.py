"""One node's non-blocking socket for the sync transport: connect, TLS, write buffer, reply
reader, and the FIFO of replies it still expects.

Owned by one :class:`~django_redlock.wire.sync.connections.ConnectionSet` (one thread), or by a
:class:`~django_redlock.wire.sync.subscriber.Subscriber` for pub/sub. Each connection keeps a FIFO
of the replies it still expects (:data:`Slot`): a reply that arrives after its round gave up
is read and dropped, so a connection with a reply in flight never hands that reply to a later
command; meanwhile later commands are pipelined behind it on the same socket.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from django_redlock.wire.acks import AckJoin
from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.resp import BAD_REPLY, PROTOCOL_ERRORS, make_reader
from django_redlock.wire.rounds import Round
from django_redlock.wire.scripts import Command, Fallback, Script
from django_redlock.wire.sentinel import master_of
from django_redlock.wire.setup import Handshake, Hello, describe, resolve, tls_context

__all__ = ["HUNG_UP", "POLL_ERR", "POLL_IN", "READ_SIZE", "NodeSocket", "Slot", "close_all"]

# Replies here are tiny; a large read buffer costs an allocation per recv for nothing.
READ_SIZE = 8192
# POLLRDHUP: told when a TCP peer closes (a unix socket peer gives POLLHUP).
_RDHUP = getattr(select, "POLLRDHUP", 0)
POLL_IN = select.POLLIN | select.POLLPRI | _RDHUP
POLL_ERR = select.POLLERR | select.POLLHUP | select.POLLNVAL
HUNG_UP = select.POLLHUP | _RDHUP

# One reply a connection still expects: (round or None for a set-up command, node index
# or the set-up step of the reply, NOSCRIPT fallback or None, when it was asked by the set's
# clock). A tuple: this is made for every command on the hot path.
Slot = tuple[Round | None, int, Fallback | None, float]

SENTINEL_TIMEOUT = 0.5
"""How long a new connection to a Sentinel node may ask its Sentinels (seconds) when its
owner names no node timeout (the pub/sub connections); the master is usually cached."""


class NodeSocket(Handshake):
    """A non-blocking socket to one node, with its write buffer and expected replies.

    A node reached through Sentinel connects to the master its Sentinels name (asked here,
    blocking, within ``timeout`` seconds, unless cached: see
    :func:`~django_redlock.wire.sentinel.master_of`); :attr:`endpoint` is where it went.

    Raises:
        NodeError: the node cannot be reached at once (no address, refused, no such socket,
            no Sentinel told its master), or its credential provider failed.
    """

    def __init__(
        self,
        address: NodeAddress,
        clock: Callable[[], float],
        preload: Sequence[Script] = (),
        hello: Hello | None = None,
        timeout: float = SENTINEL_TIMEOUT,
        classify: bool = False,
        expect_cluster: bool = False,
    ) -> None:
        super().__init__(address, hello, preload, classify, expect_cluster)
        self.tls = address.tls
        self.clock = clock
        self.out = bytearray()
        # Progress so far (bytes written from `out`, plus one for a connect and one for a TLS
        # handshake completed), and its value when a courier last gave up on this connection
        # with bytes still unsent (ConnectionSet.deliver_rest): no courier is lent again for a
        # connection that has made no progress since (a node that stays stuck).
        self.flushed = 0
        self.courier_mark = -1
        self.slots: deque[Slot] = deque()
        self.reader = make_reader()
        self.tls_handshaking = False
        # What the TLS handshake waits for (poll events): after SSLWantReadError only the
        # node's answer, so a poll does not wake at once on a writable socket and spin.
        self.handshake_events = select.POLLOUT | POLL_IN
        self.connecting = True
        self.ready = False
        self.index = -1
        """The node's index in the connection set that owns this socket (set by the set)."""
        """Connected, plain (no TLS) and its hello answered (or none asked): the one flag the
        transport's hot path tests instead of four (see :meth:`_settle`)."""
        setup = self.setup_commands()  # before the socket: a failing provider leaks nothing
        self.endpoint = address if address.sentinel is None else master_of(address, timeout)
        self.targets = resolve(self.endpoint)
        self.sock = self._open()
        if not self.connecting and self.tls:
            try:
                self._start_tls()
            except NodeError:
                self.sock.close()
                raise
        now = clock()
        for command, step in setup:
            self.out += command
            self.slots.append((None, step, None, now))
        self._settle()

    def _settle(self) -> None:
        # Every state below only moves one way (connecting -> connected, handshaking -> done,
        # holding -> hello answered; a reconnect is a new NodeSocket), so `ready` is set
        # where one of them changes and never has to be cleared.
        self.ready = not (
            self.connecting or self.tls or self.tls_handshaking or self.held is not None
        )

    def learn(self, step: int, reply: object) -> bytes:
        """:meth:`Handshake.learn`, and the connection may be :attr:`ready` after it.

        Raises:
            NodeError: the login (AUTH or SELECT) was refused: the connection is useless.
        """
        out = super().learn(step, reply)
        self._settle()
        return out

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
                self.sock, server_hostname=self.endpoint.host, do_handshake_on_connect=False
            )
        except (OSError, ValueError) as exc:
            raise NodeError(f"TLS set-up failed: {exc}") from None
        self.tls_handshaking = True

    def fileno(self) -> int:
        return self.sock.fileno()

    def events(self) -> int:
        if self.tls_handshaking and not self.connecting:
            return self.handshake_events
        if self.connecting or self.out:
            return select.POLLOUT | POLL_IN
        return POLL_IN

    def send(self, command: bytes, slot: Slot, identify: bool = False) -> None:
        """Queue ``command`` (expecting one reply for ``slot``) and write what the socket takes;
        with ``identify``, the connection's identity completes it (see
        :class:`~django_redlock.wire.setup.Hello`).

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

    def send_acked(
        self,
        command: Command,
        answer: Round,
        index: int,
        now: float,
        identify: bool,
        timeout_ms: int,
    ) -> None:
        """Send grant or renewal ``command`` for node ``index`` of ``answer``, followed by
        its WAIT (this node has REPLICA_ACKS): two replies, one answer (wire/acks.py).

        Raises:
            NodeError: the connection failed.
        """
        assert self.acks is not None
        fallback = command[1]
        assert fallback is not None  # a grant's or a renewal's (acked_round)
        join = AckJoin(answer, index, self.acks, timeout_ms, fallback.acked_yes, Round.record)
        self.slots.append((join.script, 0, command[1], now))
        self.slots.append((join, index, None, now))
        self.out += self.acked(command[0], identify, timeout_ms)
        self.flush()

    def send_held(self) -> None:
        """Send now, without the identity, the commands held until the hello is answered
        (the node checks its own process instead; see Handshake.outgoing).

        Raises:
            NodeError: the connection failed.
        """
        if self.classifying or self.switched:
            return  # its server's mode not known, or not the one expected: nothing may go
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
            self.flushed += 1
            if self.tls:
                self._start_tls()
            self._settle()
        if self.tls_handshaking:
            assert isinstance(self.sock, ssl.SSLSocket)
            try:
                self.sock.do_handshake()
            except ssl.SSLWantReadError:
                self.handshake_events = POLL_IN
                return
            except ssl.SSLWantWriteError:
                self.handshake_events = select.POLLOUT | POLL_IN
                return
            except ssl.SSLError as exc:
                raise NodeError(f"TLS handshake failed: {exc.reason or exc}") from None
            except OSError as exc:
                raise NodeError(describe(exc)) from None
            self.tls_handshaking = False
            self.flushed += 1
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return
            except OSError as exc:
                raise NodeError(describe(exc)) from None
            del self.out[:sent]
            self.flushed += sent

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
                data = sock.recv(READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError as exc:
                raise NodeError(describe(exc)) from None
            if not data:
                raise NodeError("connection closed by the server")
            self.reader.feed(data)
            if len(data) < READ_SIZE and not (self.tls and sock.pending()):  # type: ignore[attr-defined]
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


def close_all(connections: list[NodeSocket | None]) -> None:
    """Close every socket in ``connections`` (in place: the list is emptied of them)."""
    for index, conn in enumerate(connections):
        if conn is not None:
            conn.close()
            connections[index] = None
