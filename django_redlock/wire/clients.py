"""redis-py clients for everything off the hot path (operator probes, declarations, the
status page): a client per call that never retries, so a stalled node costs one timeout.
A Sentinel node's client goes to the master its Sentinels name (asked within that timeout)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.sentinel import master_of

__all__ = ["client_for"]


def client_for(address: NodeAddress, timeout: float) -> redis.Redis:
    """A redis-py client for ``address`` that never retries (one try, ``timeout`` seconds).

    redis-py 8's default retry policy turns one stalled node into a multi-second hang.

    Raises:
        redis.ConnectionError: ``address`` is a Sentinel node and no Sentinel told its
            master within ``timeout`` (the message says what each one did).
    """
    if address.sentinel is not None:
        try:
            address = master_of(address, timeout)
        except NodeError as exc:
            raise redis.ConnectionError(str(exc)) from None
    options: dict[str, Any] = {
        "db": address.db,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    # redis-py refuses a username or password next to a credential provider.
    if address.credential_provider is not None:
        options["credential_provider"] = address.credential_provider
    else:
        options.update(username=address.username, password=address.password)
    if address.path is not None:
        return redis.Redis(unix_socket_path=address.path, **options)
    if address.tls:
        options.update(ssl=True, **dict(address.ssl_options))
    return redis.Redis(host=address.host or "localhost", port=address.port or 6379, **options)
