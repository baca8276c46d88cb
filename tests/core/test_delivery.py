"""Every reachable node gets each round's request, without the caller's help (issue 39).

An acquire returns at a quorum. A node whose connection was still being set up then (a connect
under way, a TLS handshake) used to keep the command in the client's buffer until the calling
thread's next operation, which may never come: the lease held on a bare quorum, one failure
from lost, and a late SET could take a key after the lease was over. The asyncio transport
waited for every connect before sending anything, so one slow node held up the whole round.
Now the sync transport's courier thread, and the asyncio transport's opening task, write the
command as soon as the node can take it, within one node timeout.

A connection is kept in its set-up deterministically: the third node is reached through a TLS
front (a thread here) that accepts TCP at once, as the kernel does, but answers the TLS
handshake and forwards to the real node only once its gate opens. Nothing here calls the
manager after the acquire or the release returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme

from django_redlock import AsyncLockManager, LockManager
from django_redlock.localnodes import LocalNode
from tests.helpers import lock_token, node_client

pytestmark = pytest.mark.slow

PROMPT = 15.0  # an upper bound on what a healthy node takes, never expected
NODE_TIMEOUT = 5.0  # the courier's time, and the opening's


class GatedTlsFront:
    """TLS in front of a plain node: connections are accepted at once, but their handshake
    is answered (and the node reached) only while :attr:`gate` is set."""

    def __init__(self, backend: LocalNode, folder: Path) -> None:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        self.ca_path = folder / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_path))
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(self.context)
        self.backend = ("127.0.0.1", backend.port or 0)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.gate = threading.Event()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca_path}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        while not self.gate.wait(0.05):
            if self.stop.is_set():
                conn.close()
                return
        with contextlib.ExitStack() as stack:
            conn.settimeout(5.0)
            try:
                tls = stack.enter_context(self.context.wrap_socket(conn, server_side=True))
                node = stack.enter_context(socket.create_connection(self.backend, timeout=5.0))
            except OSError:
                return
            while not self.stop.is_set():
                readable, _, _ = select.select([tls, node], [], [], 0.05)
                if tls.pending() and tls not in readable:
                    readable.append(tls)
                for source in readable:
                    try:
                        data = source.recv(65536)
                        if not data:
                            return
                        (node if source is tls else tls).sendall(data)
                    except OSError:
                        return

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.listener.close()


@pytest.fixture
def setup() -> Iterator[tuple[list[LocalNode], GatedTlsFront]]:
    directory = Path(tempfile.mkdtemp(prefix="rl-dl-", dir="/tmp"))
    nodes = [LocalNode(directory, name=f"n{index}", tcp=True) for index in range(3)]
    for node in nodes:
        node.start()
    front = GatedTlsFront(nodes[2], directory)
    yield nodes, front
    front.close()
    for node in nodes:
        node.stop()
    shutil.rmtree(directory, ignore_errors=True)


def urls(nodes: list[LocalNode], front: GatedTlsFront) -> list[str]:
    return [nodes[0].url, nodes[1].url, front.url]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PROMPT
    while not condition():
        assert time.monotonic() < deadline, f"not within {PROMPT} s: {what}"
        time.sleep(0.02)


def key_on(node: LocalNode, key: str) -> bytes | None:
    with node_client(node) as client:
        return lock_token(client, key)


def test_an_acquire_that_returned_at_a_quorum_still_reaches_the_node_still_connecting(setup):
    nodes, front = setup
    manager = LockManager(urls(nodes, front), ttl=60.0, node_timeout=NODE_TIMEOUT)
    lease = manager.acquire("first", blocking=False)  # nodes 0 and 1: a quorum
    assert key_on(nodes[2], "redlock:first") is None
    front.gate.set()
    # No call into the manager from here on: the courier writes the SET.
    wait_for(lambda: key_on(nodes[2], "redlock:first") is not None, "the SET on node 2")
    assert key_on(nodes[2], "redlock:first") == lease.token.encode()


def test_a_release_that_returned_at_a_quorum_still_reaches_the_node_still_connecting(setup):
    nodes, front = setup
    front.gate.set()
    manager = LockManager(urls(nodes, front), ttl=60.0, node_timeout=NODE_TIMEOUT)
    lease = manager.acquire("second", blocking=False)
    wait_for(lambda: key_on(nodes[2], "redlock:second") is not None, "the SET on node 2")
    front.gate.clear()
    # Released from a thread of its own, whose connections are new: node 2's is still in
    # its TLS handshake when nodes 0 and 1 have answered.
    releasing = threading.Thread(target=lease.release)
    releasing.start()
    releasing.join()
    assert key_on(nodes[2], "redlock:second") is not None
    front.gate.set()
    wait_for(lambda: key_on(nodes[2], "redlock:second") is None, "the release on node 2")


def test_the_asyncio_manager_never_waits_for_a_connect_and_still_reaches_the_node(setup):
    nodes, front = setup

    async def take() -> str:
        manager = AsyncLockManager(urls(nodes, front), ttl=60.0, node_timeout=NODE_TIMEOUT)
        began = time.monotonic()
        lease = await manager.acquire("third", blocking=False)
        # It did not wait for node 2's handshake, which cannot end before the gate opens.
        assert key_on(nodes[2], "redlock:third") is None
        assert not front.gate.is_set()
        front.gate.set()
        # The loop keeps running (this task waits), and no call goes to the manager.
        deadline = began + PROMPT
        while key_on(nodes[2], "redlock:third") is None:
            assert time.monotonic() < deadline, "the SET on node 2"
            await asyncio.sleep(0.02)
        return lease.token

    token = asyncio.run(take())
    assert key_on(nodes[2], "redlock:third") == token.encode()


def test_a_node_that_stays_stuck_costs_no_courier_per_round(setup, monkeypatch):
    """A connection that makes no progress for a whole node timeout while lent (here: its TLS
    handshake never answered) is not lent again: later rounds start no courier each (a thread
    per operation for as long as the node stays stuck); it is lent again once it moves."""
    nodes, front = setup
    started: list[threading.Thread] = []
    real = threading.Thread

    class Counting(real):  # type: ignore[misc,valid-type]
        def start(self) -> None:
            if self.name == "django_redlock-courier":
                started.append(self)
            super().start()

    monkeypatch.setattr(threading, "Thread", Counting)
    manager = LockManager(urls(nodes, front), ttl=60.0, node_timeout=0.05)
    manager.acquire("stuck", blocking=False).release()
    assert started  # the first rounds lend the set
    for courier in started:
        courier.join(PROMPT)  # the last one gives up after its node timeout, nothing sent
    lent = len(started)
    for index in range(20):
        manager.acquire(f"stuck:{index}", blocking=False).release()
    assert len(started) == lent  # the stuck node is lent for no more
    front.gate.set()  # it moves: the rounds that follow poll it, and its bytes go out
    taken: list[str] = []

    def moved() -> bool:
        lease = manager.acquire(f"moved:{len(taken)}", blocking=False)
        taken.append(lease.key)
        return key_on(nodes[2], taken[-1]) is not None  # skipped while it owed too many

    wait_for(moved, "node 2 getting what was queued for it")
    manager.close()
