"""Connection set-up, sync and asyncio, on real nodes: every resolved address is tried, the
login comes from a redis-py credential provider, and node URLs follow redis-py's forms with
the mistakes it would let through refused."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
import redis
from redis.credentials import CredentialProvider

from django_redlock import LockManager, QuorumUnreachable
from django_redlock.aredlock import AsyncLockManager
from django_redlock.localnodes import LocalCluster, LocalNode
from django_redlock.wire.nodes import parse_node

PASSWORD = "pr0vided"


# -- every address of a host ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tcp_node(tmp_path_factory) -> Iterator[LocalNode]:
    node = LocalNode(tmp_path_factory.mktemp("tcp"), tcp=True)
    node.start()
    yield node
    node.stop()


@pytest.fixture
def two_addresses(monkeypatch, tcp_node) -> str:
    """A host name that resolves to a port nobody listens on first, then to the node."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "two-addresses.test":
            return real(host, port, *args, **kwargs)
        tcp = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
        return [(*tcp, ("127.0.0.1", 1)), (*tcp, ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return f"redis://two-addresses.test:{tcp_node.port}/0"


def test_every_resolved_address_is_tried_in_turn_sync(two_addresses):
    manager = LockManager([two_addresses])
    manager.acquire("resolved", ttl=5.0, blocking=False).release()
    manager.close()


def test_every_resolved_address_is_tried_in_turn_asyncio(two_addresses):
    async def main() -> None:
        manager = AsyncLockManager([two_addresses])
        await (await manager.acquire("resolved", ttl=5.0, blocking=False)).release()
        await manager.aclose()

    asyncio.run(main())


# -- credential providers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded() -> Iterator[LocalCluster]:
    with LocalCluster(3, password=PASSWORD) as cluster:
        yield cluster


class CountingProvider(CredentialProvider):
    """Gives ``credentials`` (as redis-py's providers do) and counts the calls."""

    def __init__(self, *credentials: str) -> None:
        self.credentials = credentials
        self.calls = 0

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        self.calls += 1
        if not self.credentials:
            raise RuntimeError(f"token service down (secret {PASSWORD})")
        return self.credentials  # type: ignore[return-value]


def clients(cluster: LocalCluster, provider: CredentialProvider) -> list[redis.Redis]:
    return [
        redis.Redis(unix_socket_path=node.socket_path, credential_provider=provider)
        for node in cluster
    ]


@pytest.mark.parametrize("credentials", [(PASSWORD,), ("default", PASSWORD)])
def test_a_credential_provider_logs_in_every_connection_sync(guarded, credentials):
    provider = CountingProvider(*credentials)
    manager = LockManager(clients(guarded, provider))
    manager.declare_fresh()  # operator calls log in through the provider too
    manager.acquire("provided", ttl=5.0).release()
    assert provider.calls >= 3  # asked for each new connection, not once for all
    manager.close()


def test_a_credential_provider_logs_in_every_connection_asyncio(guarded):
    provider = CountingProvider("default", PASSWORD)

    async def main() -> None:
        manager = AsyncLockManager(clients(guarded, provider))
        await (await manager.acquire("provided", ttl=5.0)).release()
        await manager.aclose()

    asyncio.run(main())
    assert provider.calls >= 3


def test_a_failing_credential_provider_is_a_node_error_that_keeps_its_secret(guarded):
    manager = LockManager(clients(guarded, CountingProvider()))
    with pytest.raises(QuorumUnreachable, match="credential provider failed") as info:
        manager.acquire("provided", blocking=False)
    assert PASSWORD not in str(info.value)
    manager.close()


# -- URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "match"),
    [
        (["unix://"], "has no socket path"),
        (["redis://h:1/2?db=3"], "names two databases"),
        (["redis://h:65536/0"], "Port out of range"),
        (["redis://h:0/0"], "has port 0"),
        (["redis://:1/0"], "has no host"),
        (["rediss+sentinel://h:1/0"], "unsupported URL scheme"),
        (["unix:///tmp/a/../x.sock", "unix:///tmp/x.sock"], "listed twice"),
        (["redis://[::1]:1/0", "redis://127.0.0.1:1/0"], "listed twice"),
        (["redis://LOCALHOST:1/0", "redis://127.0.0.1:1"], "listed twice"),
        (["redis://h:1?db=2", "redis://h:1/2"], "listed twice"),
    ],
)
def test_bad_node_urls_are_refused_naming_the_argument(nodes, match):
    with pytest.raises(ValueError, match=match) as info:
        LockManager(nodes)
    assert str(info.value).startswith("nodes")


def test_urls_follow_redis_py_forms():
    assert parse_node("redis://h:1?db=4").db == 4
    assert parse_node("unix:///tmp/x.sock?db=2").db == 2
    assert parse_node("redis://user:pw@h:1/3").username == "user"
    tls = parse_node("rediss://h:1/0?ssl_cert_reqs=none")
    assert tls.tls
    assert dict(tls.ssl_options)["ssl_cert_reqs"] == "none"
