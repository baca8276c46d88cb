"""Nodes reached through Sentinel, on real processes: real Sentinels (the same binary with
``--sentinel``) and real failovers, a killed master and ``SENTINEL FAILOVER`` (issue 39,
item 3).

Each node is one Sentinel service: a master and its replica, watched by a Sentinel started
once the replica has synced (so it knows the replica at once). The spec lists a Sentinel that
is not there first: asking it costs a refused connect, and the next one answers.

What must hold through a failover: the client follows the master the Sentinels name, never
counts a replica's vote, and the promoted replica (which may have missed the last locks its
old master granted) refuses to vote until the quarantine (``max_ttl``) has passed since its
promotion was first seen, then votes again by itself. So a lock granted before the failover
is never granted again while it could still run.

The suite runs on the bundled Valkey and again on Redis 7 (``REDLOCK_SERVER_BIN``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from django_redlock import AsyncLockManager, LockManager, LockNotAcquired
from django_redlock.core.health import status
from django_redlock.localnodes import LocalNode, LocalSentinel
from django_redlock.wire import sentinel as sentinel_cache
from django_redlock.wire.scripts import ACQUIRE
from tests.core import test_tls
from tests.helpers import lock_token, node_client

pytestmark = pytest.mark.slow

MAX_TTL = 2.0  # the quarantine: short, so that waiting it out stays short
NODE_TIMEOUT = 0.5  # generous: a node that just started compiles the scripts first
PROMPT = 30.0  # an upper bound on what a healthy set-up takes (sync, failover), never expected
PROMOTED = "QUARANTINED a replica promoted to master"
pki = test_tls.pki  # its certificates (a module fixture), for the TLS test below


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed): a Sentinel that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(condition: Callable[[], Any], what: str, bound: float = PROMPT) -> Any:
    deadline = time.monotonic() + bound
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound} s: {what}")
        time.sleep(0.02)


def synced(replica: LocalNode) -> bool:
    with node_client(replica) as client:
        return bool(client.info("replication").get("master_link_status") == "up")


def role(node: LocalNode) -> str:
    """The node's role ("" when the Sentinel closed our connection as we asked: it closes
    every client's when it reconfigures a node)."""
    try:
        with node_client(node) as client:
            return str(client.info("replication")["role"])
    except redis.ConnectionError:
        return ""


class Service:
    """A master, its replica and a Sentinel watching them as ``name``."""

    def __init__(self, directory: Path, name: str) -> None:
        self.name = name
        self.master = LocalNode(directory, name=f"{name}m", tcp=True)
        self.master.start()  # declared fresh: a master in service
        self.replica = LocalNode(
            directory,
            name=f"{name}r",
            tcp=True,
            extra_args=("--replicaof", "127.0.0.1", str(self.master.port)),
        )
        self.replica.start(fresh=False)
        wait_for(lambda: synced(self.replica), "the replica's first sync")
        self.sentinel = LocalSentinel(directory, {name: self.master}, name=f"{name}s")
        self.sentinel.start()
        wait_for(lambda: self.sentinel.replicas_ready(name) >= 1, "the Sentinel sees the replica")
        self.dead_sentinel = f"redis://127.0.0.1:{_closed_port()}"

    @property
    def spec(self) -> dict[str, Any]:
        """The node as LockManager and REDLOCK['NODES'] take it."""
        return {"SENTINELS": [self.dead_sentinel, self.sentinel.url], "SERVICE": self.name}

    def told(self) -> tuple[str, int] | None:
        return self.sentinel.master_of(self.name)

    def promoted(self) -> bool:
        """The Sentinel names the replica, and the replica is a master."""
        return self.told() == ("127.0.0.1", self.replica.port) and role(self.replica) == "master"

    def stop(self) -> None:
        self.sentinel.stop()
        self.replica.stop()
        self.master.stop()


@pytest.fixture
def make_service() -> Iterator[Callable[[str], Service]]:
    made: list[Service] = []
    directory = Path(tempfile.mkdtemp(prefix="rl-st-", dir="/tmp"))

    def make(name: str) -> Service:
        service = Service(directory, name)
        made.append(service)
        return service

    yield make
    for service in made:
        service.stop()
    shutil.rmtree(directory, ignore_errors=True)


def manager(*nodes: object) -> LockManager:
    return LockManager(
        list(nodes), ttl=MAX_TTL, max_ttl=MAX_TTL, node_timeout=NODE_TIMEOUT, retry_delay=0.05
    )


def attempt(lock: LockManager, name: str) -> str | None:
    """One try at ``name``: None when granted (and released at once), else what the
    Sentinel node answered."""
    try:
        lock.acquire(name, blocking=False).release()
    except LockNotAcquired as refused:
        return " | ".join(refused.node_errors.values()) or str(refused)
    return None


def refused_for_promotion(lock: LockManager, name: str) -> str:
    """Try ``name`` until the promoted replica answers (the client has followed the
    failover); its answer must be a refusal for its promotion, never a grant."""

    def answered() -> str | None:
        text = attempt(lock, name)
        assert text is not None, "granted during the failover"
        return text if PROMOTED in text else None

    result: str = wait_for(answered, "the client reaching the promoted replica")
    return result


def test_a_lock_through_a_sentinel_node_and_what_operators_see(make_service):
    service = make_service("a")
    lock = manager(service.spec)
    with lock.lock("acct:1") as lease, node_client(service.master) as client:
        assert lock_token(client, "redlock:acct:1") == lease.token.encode()
    with node_client(service.master) as client:
        assert lock_token(client, "redlock:acct:1") is None  # released there

    (node,) = status(lock, timeout=2.0).nodes
    assert node.votes
    assert node.service == "a"
    assert node.resolved == f"127.0.0.1:{service.master.port}"
    assert node.node == f"sentinel://127.0.0.1:{service.dead_sentinel.rsplit(':', 1)[1]}," + (
        f"127.0.0.1:{service.sentinel.port}/a/0"
    )


def test_a_killed_master_the_client_follows_the_promoted_replica_which_waits_its_quarantine(
    make_service,
):
    service = make_service("k")
    first = manager(service.spec).acquire("acct:2", blocking=False)
    service.master.kill()
    wait_for(service.promoted, "the Sentinel promoting the replica")

    rival = manager(service.spec)  # another client (a manager re-enters its own leases)
    text = refused_for_promotion(rival, "acct:2")
    assert text.startswith(PROMOTED), text
    # It votes again by itself once the quarantine has passed, nothing declared; never
    # while the first lease could still run.
    wait_for(lambda: attempt(rival, "acct:2") is None, "the promoted node's vote")
    assert first.validity == 0
    (node,) = status(rival, timeout=2.0).nodes
    assert node.resolved == f"127.0.0.1:{service.replica.port}"
    assert node.votes


def test_sentinel_failover_a_clean_switch_is_followed_the_same_way(make_service):
    """The old master stays up, and a master, until the Sentinel reconfigures it (at least
    8 s: it waits that long after seeing it report the wrong role, and looks every 10 s). A
    client whose connection to it lived on must not keep its vote meanwhile: it hears the
    Sentinel's +switch-master and drops that connection before its next round."""
    service = make_service("f")
    lived_on = manager(service.spec)
    assert attempt(lived_on, "warm-up") is None  # its connection to the old master lives on
    first = manager(service.spec).acquire("acct:3", blocking=False)
    wait_for(lambda: service.sentinel.fail_over("f"), "the Sentinel accepting SENTINEL FAILOVER")
    wait_for(service.promoted, "the Sentinel's failover")

    text = refused_for_promotion(lived_on, "acct:3")
    assert text.startswith(PROMOTED), text
    assert role(service.master) == "master"  # followed before the old master was demoted
    text = refused_for_promotion(manager(service.spec), "acct:3")  # a new client too
    assert text.startswith(PROMOTED), text

    wait_for(lambda: attempt(lived_on, "acct:3") is None, "the promoted node's vote")
    assert first.validity == 0
    with node_client(service.replica) as client:
        assert lock_token(client, "redlock:acct:3") is None  # released on the new master
    # Not waited for here: the Sentinel's demotion of the old master, which is the Sentinel's
    # work, not the client's (it took over 90 s once in CI on a loaded machine, after every
    # assertion above had passed).


def test_three_nodes_one_failing_over_the_other_two_keep_the_quorum(make_service):
    service = make_service("t")
    directory = Path(tempfile.mkdtemp(prefix="rl-st3-", dir="/tmp"))
    plain = [LocalNode(directory, name=f"p{index}", tcp=True) for index in range(2)]
    try:
        for node in plain:
            node.start()
        lock = manager(service.spec, *(node.url for node in plain))
        first = lock.acquire("acct:4", blocking=False)
        service.master.kill()
        # While the Sentinel node is down, failing over and quarantined: the two others vote.
        other = lock.acquire("other", blocking=False)
        other.release()
        with pytest.raises(LockNotAcquired):  # held on the two others
            manager(service.spec, *(node.url for node in plain)).acquire("acct:4", blocking=False)
        first.release()
        wait_for(service.promoted, "the Sentinel promoting the replica")

        def sentinel_node_votes() -> bool:
            lease = lock.acquire("probe", blocking=False)
            try:
                with node_client(service.replica) as client:
                    return lock_token(client, "redlock:probe") == lease.token.encode()
            finally:
                lease.release()

        wait_for(sentinel_node_votes, "the promoted node's vote")
    finally:
        for node in plain:
            node.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_the_asyncio_manager_follows_a_killed_master_without_blocking_the_loop(make_service):
    service = make_service("y")

    async def main() -> None:
        lock = AsyncLockManager(
            [service.spec],
            ttl=MAX_TTL,
            max_ttl=MAX_TTL,
            node_timeout=NODE_TIMEOUT,
            retry_delay=0.05,
        )
        first = await lock.acquire("acct:5", blocking=False)
        rival = AsyncLockManager(
            [service.spec],
            ttl=MAX_TTL,
            max_ttl=MAX_TTL,
            node_timeout=NODE_TIMEOUT,
            retry_delay=0.05,
        )
        service.master.kill()
        await asyncio.to_thread(wait_for, service.promoted, "the Sentinel's promotion")

        async def try_once() -> str | None:
            try:
                lease = await rival.acquire("acct:5", blocking=False)
            except LockNotAcquired as refused:
                return " | ".join(refused.node_errors.values())
            await lease.release()
            return None

        deadline = time.monotonic() + PROMPT
        while True:
            text = await try_once()
            assert text is not None, "granted during the failover"
            if PROMOTED in text:
                break
            assert time.monotonic() < deadline, "the client never reached the promoted replica"
            await asyncio.sleep(0.02)
        while await try_once() is not None:
            assert time.monotonic() < deadline + PROMPT, "the promoted node never voted again"
            await asyncio.sleep(0.05)
        assert first.validity == 0
        await rival.aclose()
        await lock.aclose()

    asyncio.run(main())


class Monitor:
    """What a node is sent from now on (``MONITOR`` on a socket of its own), read on demand."""

    def __init__(self, node: LocalNode) -> None:
        assert node.port is not None
        self.sock = socket.create_connection(("127.0.0.1", node.port), timeout=2.0)
        self.sock.sendall(b"MONITOR\r\n")
        assert self.sock.recv(5) == b"+OK\r\n"

    def seen(self, marker: bytes) -> bytes:
        """Everything sent to the node since, up to the command carrying ``marker`` (sent to
        the node after what is to be seen: the MONITOR stream is in the node's order)."""
        data = b""
        while marker not in data:
            chunk = self.sock.recv(65536)
            assert chunk, "the node closed the MONITOR connection"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def test_a_sentinel_naming_a_replica_is_never_followed_and_the_others_are_asked(make_service):
    """A Sentinel that missed a failover names a replica: the hello's INFO replication says
    so, the connection is dropped before any lock command goes out, and the next connection
    asks the other Sentinels first."""
    service = make_service("s")
    behind = LocalSentinel(
        service.sentinel.directory,
        {"s": ("127.0.0.1", service.replica.port)},  # as if it had not seen a promotion
        name="behind",
    )
    behind.start()
    try:
        assert behind.master_of("s") == ("127.0.0.1", service.replica.port)
        monitor = Monitor(service.replica)
        try:
            alone = manager({"SENTINELS": [behind.url], "SERVICE": "s"})
            text = attempt(alone, "acct:6")
            alone.close()  # nothing more goes out of it (its courier has given the set back)
            with node_client(service.replica) as client:
                client.echo("end-of-the-attempt")
            seen = monitor.seen(b"end-of-the-attempt")
        finally:
            monitor.close()
        assert text is not None
        assert "is a slave now; asking the Sentinels again" in text, text
        assert b"INFO" in seen  # the hello reached the replica...
        assert ACQUIRE.sha not in seen  # ...and the acquire never did (held behind it)
        (node,) = status(manager({"SENTINELS": [behind.url], "SERVICE": "s"}), timeout=2.0).nodes
        assert node.resolved == f"127.0.0.1:{service.replica.port}"
        assert not node.votes
        assert node.problems[0].startswith(
            f"the Sentinels named a replica (of 127.0.0.1:{service.master.port})"
        )

        both = manager({"SENTINELS": [behind.url, service.sentinel.url], "SERVICE": "s"})
        with both.lock("acct:6") as lease, node_client(service.master) as client:
            assert lock_token(client, "redlock:acct:6") == lease.token.encode()
        (node,) = status(both, timeout=2.0).nodes
        assert node.resolved == f"127.0.0.1:{service.master.port}"
    finally:
        behind.stop()


def test_a_stalled_sentinel_costs_one_node_timeout_and_never_blocks_the_loop():
    """A Sentinel that accepts and never answers (a listening socket nobody reads): the
    round ends within its bound with the Sentinel named, and on asyncio other tasks keep
    running meanwhile."""
    with socket.socket() as stalled:
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(8)
        spec = {"SENTINELS": [f"redis://127.0.0.1:{stalled.getsockname()[1]}"], "SERVICE": "z"}
        lock = LockManager([spec], ttl=2.0, node_timeout=0.05)
        with pytest.raises(LockNotAcquired) as refused:
            lock.acquire("acct:7", blocking=False)
        (text,) = refused.value.node_errors.values()
        assert "no Sentinel told the master of service 'z'" in text
        assert "timed out" in text

        async def main() -> int:
            alock = AsyncLockManager([spec], ttl=2.0, node_timeout=0.05)
            ticks = 0
            done = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not done.is_set():
                    ticks += 1
                    await asyncio.sleep(0)

            task = asyncio.create_task(ticker())
            with pytest.raises(LockNotAcquired):
                await alock.acquire("acct:7", blocking=False)
            done.set()
            await task
            await alock.aclose()
            return ticks

        assert asyncio.run(main()) > 1  # the loop ran other tasks while the Sentinel stalled


def test_the_cache_is_forgotten_when_a_connection_is_lost(make_service):
    service = make_service("c")
    lock = manager(service.spec)
    (address,) = lock.addresses
    assert attempt(lock, "acct:8") is None
    assert sentinel_cache.cached(address) == ("127.0.0.1", service.master.port)
    service.master.kill()
    attempt(lock, "acct:8")  # meets the closed connection
    wait_for(service.promoted, "the Sentinel promoting the replica")
    wait_for(
        lambda: (
            attempt(lock, "acct:8") is not None
            and sentinel_cache.cached(address) == ("127.0.0.1", service.replica.port)
        ),
        "the client asking the Sentinels again",
    )


def test_passwords_of_the_master_and_of_the_sentinels(tmp_path):
    master = LocalNode(tmp_path, name="pm", tcp=True, password="m4ster")
    sentinel = LocalSentinel(
        tmp_path, {"p": master}, name="ps", password="s3nt", master_password="m4ster"
    )
    try:
        master.start()
        sentinel.start()
        spec = {"SENTINELS": [sentinel.url], "SERVICE": "p", "PASSWORD": "m4ster"}
        assert attempt(manager({**spec, "SENTINEL_PASSWORD": "s3nt"}), "acct:9") is None
        for wrong, why in [
            ({}, "refused: NOAUTH"),
            ({"SENTINEL_PASSWORD": "nope"}, "login refused: WRONGPASS"),
        ]:
            text = attempt(manager({**spec, **wrong}), "acct:9")
            assert text is not None
            assert "no Sentinel told the master of service 'p'" in text, text
            assert why in text, text
            assert "s3nt" not in text
            assert "nope" not in text
    finally:
        sentinel.stop()
        master.stop()


def test_tls_to_the_sentinels_and_to_the_master(pki, tmp_path):
    """A TLS-only master and a TLS-only Sentinel (Debian's redis-server; skipped on a
    server built without TLS): the Sentinel URL is rediss://, TLS and SSL_OPTIONS are the
    master's, and the CA given once serves both."""
    serving = contextlib.contextmanager(test_tls.tls_server_or_skip)
    with serving(pki, tmp_path) as port:
        sentinel = LocalSentinel(tmp_path, {"t": ("127.0.0.1", port)}, name="ts", tls=pki)
        try:
            sentinel.start()
            spec = {
                "SENTINELS": [f"rediss://127.0.0.1:{sentinel.port}"],
                "SERVICE": "t",
                "TLS": True,
                "SSL_OPTIONS": {"ssl_ca_certs": str(pki["ca"])},
            }
            lock = manager(spec)
            lock.declare_fresh()  # a brand-new node: no quarantine to sit out
            assert attempt(lock, "acct:10") is None
            (node,) = status(lock, timeout=2.0).nodes
            assert node.resolved == f"127.0.0.1:{port}"

            async def main(spec: dict[str, Any]) -> None:
                alock = AsyncLockManager([spec], ttl=MAX_TTL, node_timeout=NODE_TIMEOUT)
                await (await alock.acquire("acct:10", blocking=False)).release()
                await alock.aclose()

            asyncio.run(main(spec))
            wrong = {**spec, "SSL_OPTIONS": {"ssl_ca_certs": str(pki["wrong_ca"])}}
            text = attempt(manager(wrong), "acct:10")
            assert text is not None
            assert "CERTIFICATE_VERIFY_FAILED" in text, text
        finally:
            sentinel.stop()


def test_the_failover_listener_ends_with_the_last_manager_of_its_service(make_service):
    service = make_service("w")
    lock = manager(service.spec)
    assert attempt(lock, "acct:11") is None
    name = "django_redlock-sentinel-w"

    def listening() -> bool:
        return any(thread.name == name for thread in threading.enumerate())

    assert listening()
    lock.close()
    del lock
    gc.collect()
    wait_for(lambda: not listening(), "the listener's end")
