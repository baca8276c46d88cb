"""A minimal Redlock client: the floor of the algorithm, measured beside ours (W1, W1i, W2, W3).

It does what the Redlock description asks and nothing else, over raw sockets:

- ``acquire``: ``SET key token NX PX ttl`` written to every node at once, then one ``poll()``
  loop that returns as soon as a quorum (``N // 2 + 1``) has granted, or enough nodes have
  refused that no quorum can be reached, or the node timeout (50 ms, as every contender) has
  passed. The validity is ``ttl - elapsed - drift`` (drift: 1 % of the ttl + 2 ms, as pottery
  and the Redlock description). Without a quorum, or with no validity left, it releases on every
  node and returns ``None``.
- ``release``: ``EVALSHA`` of the compare-and-delete script to every node (loaded with ``SCRIPT
  LOAD`` once per connection; ``EVAL`` for a node that answers ``NOSCRIPT`` within the round),
  waiting until a quorum deleted or every node answered (or the node timeout). The other
  nodes delete when their turn comes; one whose ``NOSCRIPT`` comes after the round returned
  keeps the key for its ttl (nothing remembers what a late reply was for).

What it does not have, on purpose: retries (a blocking caller sleeps and tries again itself,
see ``benchmarks/contention.py``), an owner record, the quarantine of a restarted node, a fair
wait line, re-entry, extension, reconnection, clean-up tracking of what a round left behind.
It sends plain ``SET NX PX``, not our scripts: it is the floor of the algorithm, not of our
transport (``benchmarks/references.py`` has that one). Its round (:class:`Rounds`) is shared
with ``benchmarks/floor.py``, the same client sending our scripts: the floor at equal work.
Replies are parsed by ``hiredis`` as ours are, so the parser is not what differs.

Units: ``ttl_ms`` in milliseconds (an integer, as ``PX`` takes), ``validity`` and
``node_timeout`` in seconds.
"""

from __future__ import annotations

import hashlib
import secrets
import select
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import hiredis

NODE_TIMEOUT = 0.05  # seconds, the same socket timeout every contender gets
# Seconds a node has to answer while connecting (SCRIPT LOAD, AUTH, SELECT): not measured,
# and on a loaded machine 50 ms was too short for a W2 worker starting beside three others.
CONNECT_TIMEOUT = 1.0
DRIFT_FACTOR = 0.01
DRIFT_FLOOR_MS = 2

# KEYS[1]: the lock's key; ARGV[1]: the token. Returns 1 when it deleted the key, else 0.
COMPARE_AND_DELETE = (
    b'if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) '
    b"else return 0 end"
)
SHA = hashlib.sha1(COMPARE_AND_DELETE).hexdigest().encode()  # noqa: S324 (Redis's script id)


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(_bulk(part) for part in parts)


# The fixed heads of the two hot commands, encoded once: only key, token and ttl vary.
_SET_HEAD = b"*6\r\n$3\r\nSET\r\n"
_NX_PX = b"$2\r\nNX\r\n$2\r\nPX\r\n"
_EVALSHA_HEAD = b"*5\r\n$7\r\nEVALSHA\r\n" + _bulk(SHA) + b"$1\r\n1\r\n"
_EVAL_HEAD = b"*5\r\n$4\r\nEVAL\r\n" + _bulk(COMPARE_AND_DELETE) + b"$1\r\n1\r\n"


@dataclass(frozen=True)
class Held:
    """A lock this client holds: its key, its token, and the validity (seconds) it had when
    ``acquire`` returned."""

    key: bytes
    token: bytes
    validity: float


def _connect(url: str, timeout: float) -> socket.socket:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
    elif parts.scheme != "redis":
        raise ValueError(f"minimal Redlock: unsupported URL scheme in {url!r}")
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        if parts.scheme == "unix":
            sock.connect(parts.path)
        else:
            sock.connect((parts.hostname or "127.0.0.1", parts.port or 6379))
        if parts.password is not None:
            _setup(sock, _command(b"AUTH", unquote(parts.password).encode()))
        if parts.scheme == "redis" and parts.path.strip("/") not in ("", "0"):
            _setup(sock, _command(b"SELECT", parts.path.strip("/").encode()))
        if _setup(sock, _command(b"SCRIPT", b"LOAD", COMPARE_AND_DELETE)) != SHA:
            raise RuntimeError("minimal Redlock: SCRIPT LOAD returned an unexpected id")
    except BaseException:
        sock.close()
        raise
    # Blocking from now on: a send waits for room (it never has to here), and a recv only
    # follows a poll that said the socket is readable.
    sock.settimeout(None)
    return sock


def _setup(sock: socket.socket, command: bytes) -> object:
    """One command and its reply, while connecting (with the socket's timeout)."""
    sock.sendall(command)
    reader = hiredis.Reader()
    while (reply := reader.gets()) is False:
        data = sock.recv(4096)
        if not data:
            raise ConnectionError("minimal Redlock: the node closed the connection")
        reader.feed(data)
    if isinstance(reply, hiredis.ReplyError):
        raise reply
    return reply


class Rounds:
    """One connection per node and the round every operation is: send one command to each,
    count the answers equal to a ``yes`` value (see the module docstring). What a client
    sends is its own: :class:`MinimalRedlock` sends ``SET NX PX``, and the floor at equal
    work (``benchmarks/floor.py``) our scripts, over this same code path. Not thread-safe."""

    def __init__(self, urls: list[str], node_timeout: float = NODE_TIMEOUT) -> None:
        self.node_timeout = node_timeout
        self.quorum = len(urls) // 2 + 1
        self._socks: list[socket.socket] = []
        try:
            for url in urls:  # every node must answer now: there is no reconnection later
                self._socks.append(_connect(url, max(node_timeout, CONNECT_TIMEOUT)))
        except BaseException:
            self.close()
            raise
        self._readers = [hiredis.Reader() for _ in urls]
        # Replies of earlier rounds still to come on each socket (a round returns at a quorum
        # and does not wait for the rest): they are read and dropped before this round's.
        self._owed = [0] * len(urls)
        self._alive = [True] * len(urls)
        self._poller = select.poll()
        self._by_fd = {sock.fileno(): index for index, sock in enumerate(self._socks)}
        for fd in self._by_fd:
            self._poller.register(fd, select.POLLIN)

    def close(self) -> None:
        for sock in self._socks:
            sock.close()

    def _noscript(self, held: Any, index: int) -> bytes:
        """The command that replaces a release the node ``index`` answered ``NOSCRIPT`` (the
        script's body); only called for a release's round, with its ``held``."""
        raise NotImplementedError

    def _round(
        self,
        commands: Sequence[bytes],
        yes: object,
        *,
        stop_at_refusals: bool,
        held: Any = None,
        replies: list[object] | None = None,
    ) -> int:
        """Send ``commands[i]`` to node ``i`` and count the answers equal to ``yes``.

        Returns at a quorum of ``yes``; else when every node answered, when (if
        ``stop_at_refusals``) no quorum can be reached any more, or after the node timeout.
        With ``held`` (a release), a node answering ``NOSCRIPT`` is sent :meth:`_noscript`.
        ``replies`` (W3's floor, ``benchmarks/floor_line.py``): each answer is stored at its
        node's index (the others are left as they are).
        """
        socks, readers, owed, alive = self._socks, self._readers, self._owed, self._alive
        count = len(socks)
        answered = [not up for up in alive]
        for index, sock in enumerate(socks):
            if alive[index]:
                try:
                    sock.sendall(commands[index])
                except OSError:
                    alive[index] = False
                    answered[index] = True
        granted = 0
        refused = sum(answered)
        deadline = time.monotonic() + self.node_timeout
        while granted < self.quorum and granted + refused < count:
            if stop_at_refusals and refused > count - self.quorum:
                break
            wait_ms = (deadline - time.monotonic()) * 1000
            if wait_ms <= 0:
                break
            for fd, _ in self._poller.poll(wait_ms):
                index = self._by_fd[fd]
                try:
                    data = socks[index].recv(65536)
                except OSError:
                    data = b""
                if not data:  # the node closed: it refuses from now on (no reconnection)
                    alive[index] = False
                    self._poller.unregister(fd)
                    if not answered[index]:
                        answered[index] = True
                        refused += 1
                    continue
                readers[index].feed(data)
                while (reply := readers[index].gets()) is not False:
                    if owed[index]:
                        owed[index] -= 1
                    elif answered[index]:
                        continue  # cannot happen: one command per round and socket
                    elif (
                        held is not None
                        and isinstance(reply, hiredis.ReplyError)
                        and str(reply).startswith("NOSCRIPT")
                    ):
                        # The node lost its scripts (a restart, SCRIPT FLUSH): send the body.
                        socks[index].sendall(self._noscript(held, index))
                    else:
                        answered[index] = True
                        if replies is not None:
                            replies[index] = reply
                        if reply == yes:
                            granted += 1
                        else:
                            refused += 1
        for index, done in enumerate(answered):
            if not done:
                owed[index] += 1
        return granted


class MinimalRedlock(Rounds):
    """Redlock over one connection per node (see the module docstring). Not thread-safe."""

    def acquire(self, name: str, ttl_ms: int) -> Held | None:
        """One try at ``name``: a :class:`Held` with the validity left, or ``None``."""
        key = name.encode()
        token = secrets.token_hex(20).encode()
        start = time.monotonic()
        command = _SET_HEAD + _bulk(key) + _bulk(token) + _NX_PX + _bulk(b"%d" % ttl_ms)
        granted = self._round((command,) * len(self._socks), b"OK", stop_at_refusals=True)
        drift = ttl_ms * DRIFT_FACTOR + DRIFT_FLOOR_MS
        validity = (ttl_ms - drift) / 1000 - (time.monotonic() - start)
        if granted >= self.quorum and validity > 0:
            return Held(key, token, validity)
        # A node may have granted (or may yet grant, if its answer was late): free them all.
        self.release(Held(key, token, 0.0))
        return None

    def release(self, held: Held) -> bool:
        """Delete ``held`` on every node where it still has its token; True when a quorum did."""
        command = _EVALSHA_HEAD + _bulk(held.key) + _bulk(held.token)
        commands = (command,) * len(self._socks)
        return self._round(commands, 1, stop_at_refusals=False, held=held) >= self.quorum

    def _noscript(self, held: Held, index: int) -> bytes:
        return _EVAL_HEAD + _bulk(held.key) + _bulk(held.token)
