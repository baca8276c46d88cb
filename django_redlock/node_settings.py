"""``REDLOCK['NODES']``: each entry (a URL, a dict with credentials, a cache alias, or a
Sentinel service) to the :class:`~django_redlock.wire.nodes.NodeAddress` the managers connect
to.

Called by :mod:`django_redlock.conf` while it reads the setting; every problem is reported
through the reading (``report``), with its system check id, and an unusable entry is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from django_redlock.wire.nodes import NodeAddress, parse_node, parse_sentinel, replica_acks_of

__all__ = ["CACHE_BACKENDS", "Reading", "check_nodes"]

CACHE_BACKENDS = ("django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")
"""The ``CACHES`` backends whose server a ``{"CACHE": alias}`` node may name."""


class Reading(Protocol):
    """What this module needs of a reading of the setting (``conf``'s)."""

    @property
    def caches(self) -> Mapping[str, Any]: ...

    def report(
        self, check_id: str, message: str, hint: str, level: Literal["error", "warning"] = ...
    ) -> None: ...


def check_nodes(value: object, name: str, reading: Reading) -> tuple[NodeAddress, ...]:
    """Every usable node; each bad one, duplicate and risky count is reported as it is."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise TypeError(f"{name} must be a list of nodes")
    if not value:
        raise ValueError(f"{name} is empty: no lock can be taken")
    addresses: list[NodeAddress] = []
    seen: set[tuple[object, ...]] = set()
    # The server of each address (its identity without the database): two databases of one
    # server are one node, whatever the list says (issue 40, item 2: found before any
    # connection; the acquire also refuses a quorum of one server, by run_id).
    servers: dict[tuple[object, ...], NodeAddress] = {}
    for spec in value:
        address = _node(spec, reading)
        if address is None:
            continue
        identity = address.identity
        if identity in seen:
            reading.report(
                "django_redlock.E005",
                f"REDLOCK node {address.label} is listed twice",
                "Redlock needs independent nodes.",
            )
        elif identity[:-1] in servers:
            reading.report(
                "django_redlock.E005",
                f"REDLOCK nodes {servers[identity[:-1]].label} and {address.label} are two "
                "databases of the same server: not independent nodes",
                "Redlock needs independent servers: one database of each of 3 or 5.",
            )
        seen.add(identity)
        servers.setdefault(identity[:-1], address)
        addresses.append(address)
    if len(value) == 1:
        reading.report(
            "django_redlock.W002",
            "REDLOCK has a single node: the lock fails whenever that node does.",
            "Fine for development; use 3 or 5 independent masters in production.",
            "warning",
        )
    elif len(value) % 2 == 0:
        reading.report(
            "django_redlock.W001",
            f"REDLOCK has {len(value)} nodes: an even count tolerates no more failures than "
            f"{len(value) - 1} nodes would.",
            "Use an odd number of nodes (3 or 5).",
            "warning",
        )
    return tuple(addresses)


def _node(spec: object, reading: Reading) -> NodeAddress | None:
    """One node spec to an address; None (with the problem reported) when it is unusable."""
    bad = "django_redlock.E004"
    acks = 0
    if isinstance(spec, Mapping) and "REPLICA_ACKS" in spec:
        try:
            acks = replica_acks_of(spec["REPLICA_ACKS"], "a node's REPLICA_ACKS")
        except ValueError as exc:
            _bad_acks(exc, reading)
            return None
    try:
        if isinstance(spec, str):
            address = parse_node(spec)
            if urlsplit(spec).password:
                reading.report(
                    "django_redlock.W003",
                    f"REDLOCK node {address.label} has its password inside the URL; Django's "
                    "DEBUG error page shows such strings unredacted.",
                    'Use {"URL": "redis://host:6379/0", "PASSWORD": ...} instead.',
                    "warning",
                )
            return address
        if not isinstance(spec, Mapping):
            raise TypeError(
                f"REDLOCK node must be a URL string or a dict, not {type(spec).__name__}"
            )
        if "SENTINELS" in spec or "SERVICE" in spec:
            return _sentinel_node(spec, reading)
        unknown = sorted(
            set(map(str, spec)) - {"URL", "PASSWORD", "USERNAME", "CACHE", "REPLICA_ACKS"}
        )
        if unknown or ("URL" in spec) == ("CACHE" in spec):
            reading.report(
                bad,
                f"REDLOCK node {_redacted(spec)!r} must have exactly one of URL or CACHE"
                + (f" (unknown keys: {', '.join(unknown)})" if unknown else ""),
                'Write {"URL": "redis://...", "PASSWORD": ...}, {"CACHE": "alias"} or, for a '
                'node managed by Sentinel, {"SENTINELS": [...], "SERVICE": "name"}.',
            )
            return None
        if "CACHE" in spec:
            cached = _cache_node(spec["CACHE"], reading)
            return cached if cached is None or not acks else replace(cached, replica_acks=acks)
        if not isinstance(spec["URL"], str):
            raise TypeError("REDLOCK node URL must be a string")
        address = parse_node(spec["URL"])
        return _with_login(
            replace(address, replica_acks=acks) if acks else address,
            spec.get("USERNAME", address.username),
            spec.get("PASSWORD", address.password),
        )
    except (TypeError, ValueError) as exc:
        if "REPLICA_ACKS" in str(exc):  # ?replica_acks= in a URL
            _bad_acks(exc, reading)
            return None
        # The parser names the LockManager argument ("nodes: ..."): here it is the setting.
        text = str(exc).removeprefix("nodes: ")
        reading.report(
            bad, f"REDLOCK['NODES']: {text}", "Write a redis://, rediss:// or unix:// URL."
        )
        return None


def _bad_acks(exc: Exception, reading: Reading) -> None:
    """A malformed REPLICA_ACKS (a node's key, or ``?replica_acks=`` in its URL): E015."""
    reading.report(
        "django_redlock.E015",
        f"REDLOCK['NODES']: {str(exc).removeprefix('nodes: ')}",
        "Give REPLICA_ACKS the number of replicas that must acknowledge each grant (1 or "
        "more; every replica online must too), or leave it out.",
    )


def _sentinel_node(spec: Mapping[Any, Any], reading: Reading) -> NodeAddress | None:
    """A node reached through Sentinel (``wire.nodes.parse_sentinel``, the very parser of
    ``LockManager(nodes=...)``); a malformed one is E014."""
    try:
        return parse_sentinel(spec)
    except (TypeError, ValueError) as exc:
        reading.report(
            "django_redlock.E014",
            f"REDLOCK['NODES']: {str(exc).removeprefix('nodes: ')}",
            'Write {"SENTINELS": ["redis://host:26379", ...], "SERVICE": "name"} (and '
            "PASSWORD, SENTINEL_PASSWORD, DB, TLS, SSL_OPTIONS as needed).",
        )
        return None


def _cache_node(alias: object, reading: Reading) -> NodeAddress | None:
    """The master of a Redis cache in ``CACHES``, with its password."""
    bad = "django_redlock.E004"
    if not isinstance(alias, str) or alias not in reading.caches:
        known = ", ".join(reading.caches) or "none"
        reading.report(
            bad,
            f"REDLOCK node names cache {alias!r}, which is not in CACHES",
            f"Known cache aliases: {known}.",
        )
        return None
    cache = reading.caches[alias]
    if not isinstance(cache, Mapping) or not isinstance(cache.get("OPTIONS") or {}, Mapping):
        reading.report(
            bad,
            f"REDLOCK node names cache {alias!r}, whose CACHES entry is not a dict "
            "(or its OPTIONS is not)",
            "Each CACHES entry, and its OPTIONS, is a dict.",
        )
        return None
    backend = cache.get("BACKEND", "")
    if backend not in CACHE_BACKENDS:
        reading.report(
            bad,
            f"REDLOCK node names cache {alias!r}, whose backend {backend!r} is not Redis",
            f"Supported backends: {', '.join(CACHE_BACKENDS)}.",
        )
        return None
    location = cache.get("LOCATION")
    if isinstance(location, list | tuple):
        # django-redis: the first location is the master; the others are read replicas,
        # which must never count as Redlock nodes.
        location = location[0] if location else None
    if isinstance(location, str) and "," in location:
        location = location.split(",")[0]
    if not isinstance(location, str):
        reading.report(bad, f"cache {alias!r} has no LOCATION URL", "Give the cache a LOCATION.")
        return None
    try:
        address = parse_node(location.strip())
    except (TypeError, ValueError) as exc:
        reading.report(bad, f"cache {alias!r}: {exc}", "Fix the cache's LOCATION.")
        return None
    options = cache.get("OPTIONS") or {}
    password = options.get("PASSWORD", options.get("password", address.password))
    username = options.get("USERNAME", options.get("username", address.username))
    return _with_login(address, username, password)


def _with_login(address: NodeAddress, username: object, password: object) -> NodeAddress:
    return replace(
        address,
        username=None if username is None else str(username),
        password=None if password is None else str(password),
    )


def _redacted(spec: Mapping[Any, Any]) -> dict[Any, Any]:
    return {
        key: ("***" if str(key).upper() == "PASSWORD" else value) for key, value in spec.items()
    }
