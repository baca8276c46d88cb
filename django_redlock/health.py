"""Node health for operators: reachability, latency and server version, per node.

Uses plain redis-py clients built from the manager's addresses, with client retries off and
a short timeout, so a stopped node costs at most one timeout. Imports no Django.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redlock._nodes import NodeAddress

__all__ = ["NodeHealth", "client_for", "probe"]


@dataclass(frozen=True)
class NodeHealth:
    """What one probe of one node found.

    Attributes:
        node: the node's label (URL without password).
        reachable: PING answered in time.
        latency_ms: PING round trip in milliseconds (None when unreachable).
        server: "redis" or "valkey" (None when unknown).
        version: the server version string (None when unknown).
        error: why it is unreachable (None when reachable).
    """

    node: str
    reachable: bool
    latency_ms: float | None = None
    server: str | None = None
    version: str | None = None
    error: str | None = None


def client_for(address: NodeAddress, timeout: float) -> redis.Redis:
    """A redis-py client for ``address`` that never retries (one try, ``timeout`` seconds).

    redis-py 8's default retry policy turns one stalled node into a multi-second hang.
    """
    options: dict[str, Any] = {
        "db": address.db,
        "username": address.username,
        "password": address.password,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    if address.path is not None:
        return redis.Redis(unix_socket_path=address.path, **options)
    if address.tls:
        options.update(ssl=True, **dict(address.ssl_options))
    return redis.Redis(host=address.host or "localhost", port=address.port or 6379, **options)


def probe(address: NodeAddress, timeout: float = 0.25) -> NodeHealth:
    """PING and INFO one node; never raises for node failures (they are in ``error``)."""
    try:
        with client_for(address, timeout) as client:
            start = time.perf_counter()
            client.ping()
            latency = (time.perf_counter() - start) * 1000
            info = client.info("server")
    except redis.RedisError as exc:
        return NodeHealth(node=address.label, reachable=False, error=str(exc) or type(exc).__name__)
    server = "valkey" if "valkey_version" in info else "redis"
    version = info.get("valkey_version") or info.get("redis_version")
    return NodeHealth(
        node=address.label,
        reachable=True,
        latency_ms=round(latency, 3),
        server=server,
        version=None if version is None else str(version),
    )
