"""Helpers shared by the tests."""

from __future__ import annotations

import select
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redlock.core.owner import base36, owner_id
from django_redlock.localnodes import LocalNode
from django_redlock.wire.scripts import HOLDER

SOURCE_ROOT = Path(__file__).resolve().parents[1]
# What a build or an install writes into the tree it runs in, and what a checkout keeps beside
# the sources (virtualenvs, caches, the built site): none of it belongs to a clone.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "site", "*.egg-info", "__pycache__", ".*_cache"
)


def copy_of_the_source(into: Path) -> Path:
    """A copy of this checkout's sources in ``into``/source, for a test that builds or
    installs the project: pip and setuptools write ``build/`` and ``*.egg-info`` into the tree
    they run in, and ``./run test`` runs two suites at once (Valkey and Redis), so two such
    tests building in the one checkout could write over each other's files. Returns the copy's
    top folder."""
    copy = into / "source"
    shutil.copytree(SOURCE_ROOT, copy, ignore=_NOT_SOURCE, symlinks=True)
    return copy


class FakeClock:
    """A monotonic clock that only moves when told (redis-py's FakeLockTime idea).

    Pass the instance as ``clock=`` and ``clock.sleep`` as ``sleep=``: sleeping advances the
    clock instead of waiting, and every sleep is recorded.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.step_per_call = 0.0

    def __call__(self) -> float:
        self.now += self.step_per_call
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def node_client(node: LocalNode) -> redis.Redis:
    """A plain redis-py client to inspect or prepare one node (never retries)."""
    return redis.Redis.from_url(node.url, socket_timeout=2, retry=Retry(NoBackoff(), 0))


def node_identity(client: redis.Redis) -> str:
    """The identity a connection to this node reads in its hello and appends to identified
    commands (``wire/setup.py``, ``scripts/node_identity.lua``):
    ``<run_id>/<master_replid2>:<second_repl_offset>``."""
    run_id = client.info("server")["run_id"]
    replication = client.info("replication")
    replid2 = replication["master_replid2"]  # redis-py reads an all-digit id as an int
    replid2 = f"{replid2:040d}" if isinstance(replid2, int) else replid2
    return f"{run_id}/{replid2}:{replication['second_repl_offset']}"


def owner_arg(pid: int = 0, acquired_ms: int = 1000) -> str:
    """An owner argument as the scripts take it (``scripts/lock_key.lua``), for a record
    ``{"pid": pid, "acquired_at": acquired_ms / 1000}``."""
    record = f'{{"pid":{pid},"acquired_at":'
    return f"{owner_id(record)}{base36(acquired_ms)} {record}"


def owner_record(pid: int = 0, acquired_ms: int = 1000) -> bytes:
    """The JSON record the scripts read back for :func:`owner_arg`'s owner."""
    return f'{{"pid":{pid},"acquired_at":{acquired_ms / 1000:.3f}}}'.encode()


OWNER = owner_arg()
"""An owner argument for scripts called by hand, when the owner does not matter."""


def lock_token(client: redis.Redis, key: str | bytes) -> bytes | None:
    """The token the lock key ``key`` holds on one node (a string ``"<token> <owner
    id><acquired_at>"``, ``scripts/lock_key.lua``), None when absent."""
    value = client.get(key)
    assert value is None or isinstance(value, bytes)
    return None if value is None else value.split(b" ", 1)[0]


def put_lock(client: redis.Redis, key: str, token: str) -> None:
    """Make ``key`` hold ``token`` on one node, as another holder's lock would, keeping the
    key's expiry (a rival that took the node's key)."""
    client.set(key, f"{token} {owner_id('x')}rs", keepttl=True)


def stored_owner(client: redis.Redis, key: str | bytes) -> bytes | None:
    """The owner record JSON of the lock key ``key`` on one node, as ``holder`` reads it
    (None when the key is absent or not a lock)."""
    reply = client.eval(HOLDER.source.decode(), 1, key)
    return reply[0] if reply else None


def queued_on_a_majority(cluster: Iterable[LocalNode], name: str, length: int) -> bool:
    """The line of lock ``name`` (prefix ``redlock:``) has ``length`` places on a majority of
    the nodes. One node alone can lag: a lease may hold a quorum without it, and a try may be
    granted there."""
    counts = []
    for node in cluster:
        with node_client(node) as client:
            counts.append(int(client.zcard(f"redlock:{name}\x00q")))
    return sum(count == length for count in counts) > len(counts) // 2


def released_everywhere(manager, timeout: float = 10.0) -> None:
    """Wait (bounded) until ``manager.locks()`` lists nothing. A release returns once a
    quorum freed the lock; on a loaded machine the last node's release may still be on its way
    (it is queued there, never skipped), so a listing right after can still see that node."""
    wait_for(lambda: manager.locks(limit=None).locks == [], "a released lock stays listed", timeout)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` every 10 ms until it is true; fail with ``what`` after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


class FaultServer:
    """A TCP listener on 127.0.0.1 for wire faults a real server cannot produce.

    Each accepted connection is forwarded to the unix socket ``upstream`` (a real node), or,
    without one, answered with ``reply`` to whatever it sends. :meth:`black_hole` turns every
    connection open now into one that reads and drops what it gets and never answers, while
    the socket stays open; connections accepted later are served again. A context manager.
    """

    def __init__(self, upstream: str | None = None, reply: bytes = b"") -> None:
        self.upstream = upstream
        self.reply = reply
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._peers: dict[socket.socket, socket.socket | None] = {}
        self._holes: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def black_hole(self) -> None:
        with self._lock:
            self._holes.update(self._peers)
            self._holes.update(peer for peer in self._peers.values() if peer is not None)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        self.accepted += 1
        peer = None
        if self.upstream is not None:
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            peer.connect(self.upstream)
            self._peers[peer] = conn
        self._peers[conn] = peer

    def _serve(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                watched = [self.listener, *self._peers]
            readable, _, _ = select.select(watched, [], [], 0.05)
            for sock in readable:
                if sock is self.listener:
                    self._accept()
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                with self._lock:
                    if not data:
                        self._forget(sock)
                        continue
                    if sock in self._holes:
                        continue  # swallowed: never forwarded, never answered
                    peer = self._peers.get(sock)
                    try:
                        if peer is not None:
                            peer.sendall(data)
                        elif self.reply:
                            sock.sendall(self.reply)
                    except OSError:  # the client went away: so does its connection
                        self._forget(sock)

    def _forget(self, sock: socket.socket) -> None:
        peer = self._peers.pop(sock, None)
        self._holes.discard(sock)
        sock.close()
        if peer is not None:
            self._forget(peer)

    def __enter__(self) -> FaultServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for sock in list(self._peers):
                if sock in self._peers:
                    self._forget(sock)
        self.listener.close()


def votes_recorded(*managers: object) -> None:
    """Wait until each manager's vote recorder has written what it was told (a node's first
    grant in this process is recorded on the other nodes by a thread of its own, with an INFO
    call: see core/witness.py). Tests that count what the nodes run call this first, so those
    writes fall outside what they count."""
    for manager in managers:
        engine = manager.engine  # type: ignore[attr-defined]
        assert engine._voters.wait_idle(10.0), "the vote recorder did not finish writing"
