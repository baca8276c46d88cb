"""The ``REDLOCK`` setting: one parser, used by the runtime and by the system checks.

Settings are read lazily (never at import) and the parsed result is dropped whenever Django
sends ``setting_changed`` for ``REDLOCK`` or ``CACHES``, so ``override_settings`` just works.

A node is one of::

    "redis://host:6379/0"                                   # a URL (also rediss://, unix://)
    {"URL": "redis://host:6379/0", "PASSWORD": "...", "USERNAME": "..."}
    {"CACHE": "default"}                                    # a django-redis / Django cache alias

The dict form keeps the password out of the URL: Django's DEBUG error page cleanses dict keys
named like ``PASSWORD`` but shows strings inside lists as they are (a password embedded in a
URL would be readable there; check ``django_redlock.W003`` says so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from django_redlock.redlock import (
    DEFAULT_DRIFT_FACTOR,
    DEFAULT_NODE_TIMEOUT,
    DEFAULT_RETRY_DELAY,
    DEFAULT_TTL,
    MAX_TTL,
    LockManager,
)
from django_redlock.wire.nodes import NodeAddress, parse_node

__all__ = ["DEFAULTS", "Problem", "RedlockSettings", "get_manager", "get_settings", "inspect"]

DEFAULTS: dict[str, Any] = {
    "NODES": [],
    "TTL": DEFAULT_TTL,
    "NODE_TIMEOUT": DEFAULT_NODE_TIMEOUT,
    "RETRY_DELAY": DEFAULT_RETRY_DELAY,
    "DRIFT_FACTOR": DEFAULT_DRIFT_FACTOR,
    "KEY_PREFIX": "redlock:",
    "DEFAULT_TIMEOUT": 10.0,
    "MAX_TTL": None,
    "METRICS_LABEL": "prefix",
}
"""Every ``REDLOCK`` key and its default."""

_CACHE_BACKENDS = ("django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the setting: the system checks report these as they are."""

    id: str
    level: Literal["error", "warning"]
    message: str
    hint: str | None = None


@dataclass(frozen=True)
class RedlockSettings:
    """The parsed ``REDLOCK`` setting (times in seconds)."""

    nodes: tuple[NodeAddress, ...]
    ttl: float
    node_timeout: float
    retry_delay: float
    drift_factor: float
    key_prefix: str
    timeout: float | None = 10.0
    max_ttl: float | None = None
    metrics_label: str = "prefix"
    problems: tuple[Problem, ...] = field(default=())


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return None if math.isnan(number) or math.isinf(number) else number


def _hint(check_id: str, text: str) -> str:
    return f"{text} See the README, System checks, {check_id}."


def _node(spec: object, caches: Mapping[str, Any]) -> tuple[NodeAddress | None, list[Problem]]:
    """One node spec to an address, or the problems that stop it."""
    problems: list[Problem] = []
    if isinstance(spec, str):
        try:
            address = parse_node(spec)
        except (TypeError, ValueError) as exc:
            return None, [Problem("django_redlock.E004", "error", str(exc))]
        if urlsplit(spec).password:
            problems.append(
                Problem(
                    "django_redlock.W003",
                    "warning",
                    f"REDLOCK node {address.label} has its password inside the URL; Django's "
                    "DEBUG error page shows such strings unredacted.",
                    _hint(
                        "django_redlock.W003",
                        'Use {"URL": "redis://host:6379/0", "PASSWORD": ...} instead.',
                    ),
                )
            )
        return address, problems
    if isinstance(spec, Mapping):
        unknown = sorted(set(map(str, spec)) - {"URL", "PASSWORD", "USERNAME", "CACHE"})
        if unknown or ("URL" in spec) == ("CACHE" in spec):
            return None, [
                Problem(
                    "django_redlock.E004",
                    "error",
                    f"REDLOCK node {_redacted(spec)!r} must have exactly one of URL or CACHE"
                    + (f" (unknown keys: {', '.join(unknown)})" if unknown else ""),
                    _hint(
                        "django_redlock.E004",
                        'Write {"URL": "redis://...", "PASSWORD": ...} or {"CACHE": "alias"}.',
                    ),
                )
            ]
        if "CACHE" in spec:
            return _cache_node(spec["CACHE"], caches)
        url = spec["URL"]
        if not isinstance(url, str):
            return None, [
                Problem("django_redlock.E004", "error", "REDLOCK node URL must be a string")
            ]
        try:
            address = parse_node(url)
        except (TypeError, ValueError) as exc:
            return None, [Problem("django_redlock.E004", "error", str(exc))]
        password = spec.get("PASSWORD", address.password)
        username = spec.get("USERNAME", address.username)
        return _with_login(address, username, password), problems
    return None, [
        Problem(
            "django_redlock.E004",
            "error",
            f"REDLOCK node must be a URL string or a dict, not {type(spec).__name__}",
        )
    ]


def _cache_node(
    alias: object, caches: Mapping[str, Any]
) -> tuple[NodeAddress | None, list[Problem]]:
    if not isinstance(alias, str) or alias not in caches:
        return None, [
            Problem(
                "django_redlock.E004",
                "error",
                f"REDLOCK node names cache {alias!r}, which is not in CACHES",
                _hint(
                    "django_redlock.E004", f"Known cache aliases: {', '.join(caches) or 'none'}."
                ),
            )
        ]
    cache = caches[alias]
    backend = cache.get("BACKEND", "")
    if backend not in _CACHE_BACKENDS:
        return None, [
            Problem(
                "django_redlock.E004",
                "error",
                f"REDLOCK node names cache {alias!r}, whose backend {backend!r} is not Redis",
                _hint("django_redlock.E004", f"Supported backends: {', '.join(_CACHE_BACKENDS)}."),
            )
        ]
    location = cache.get("LOCATION")
    if isinstance(location, list | tuple):
        # django-redis: the first location is the master; the others are read replicas,
        # which must never count as Redlock nodes.
        location = location[0] if location else None
    if isinstance(location, str) and "," in location:
        location = location.split(",")[0]
    if not isinstance(location, str):
        return None, [
            Problem("django_redlock.E004", "error", f"cache {alias!r} has no LOCATION URL")
        ]
    try:
        address = parse_node(location.strip())
    except (TypeError, ValueError) as exc:
        return None, [Problem("django_redlock.E004", "error", f"cache {alias!r}: {exc}")]
    options = cache.get("OPTIONS") or {}
    password = options.get("PASSWORD", options.get("password", address.password))
    username = options.get("USERNAME", options.get("username", address.username))
    return _with_login(address, username, password), []


def _with_login(address: NodeAddress, username: object, password: object) -> NodeAddress:
    from dataclasses import replace

    return replace(
        address,
        username=None if username is None else str(username),
        password=None if password is None else str(password),
    )


def _redacted(spec: Mapping[Any, Any]) -> dict[Any, Any]:
    return {
        key: ("***" if str(key).upper() == "PASSWORD" else value) for key, value in spec.items()
    }


def inspect(
    raw: object, caches: Mapping[str, Any] | None = None
) -> tuple[RedlockSettings | None, list[Problem]]:
    """Parse a ``REDLOCK`` value; return the settings (None if unusable) and every problem.

    Does no network I/O. The system checks report the problems; the runtime refuses to start
    on any error-level one.
    """
    caches = {} if caches is None else caches
    problems: list[Problem] = []
    if not isinstance(raw, Mapping):
        return None, [
            Problem(
                "django_redlock.E001",
                "error",
                f"REDLOCK must be a dict, not {type(raw).__name__}",
                _hint("django_redlock.E001", 'REDLOCK = {"NODES": ["redis://...", ...]}'),
            )
        ]
    if "TIMEOUT" in raw:
        # The setting's name until 0.1: still read, with a warning, unless both are given.
        raw = dict(raw)
        old = raw.pop("TIMEOUT")
        raw.setdefault("DEFAULT_TIMEOUT", old)
        problems.append(
            Problem(
                "django_redlock.W004",
                "warning",
                "REDLOCK['TIMEOUT'] is now called REDLOCK['DEFAULT_TIMEOUT'] (it is also the "
                "default of LockManager.acquire and lock)",
                _hint("django_redlock.W004", "Rename the key."),
            )
        )
    unknown = sorted(str(key) for key in raw if key not in DEFAULTS)
    if unknown:
        problems.append(
            Problem(
                "django_redlock.E002",
                "error",
                f"REDLOCK has unknown keys: {', '.join(unknown)}",
                _hint("django_redlock.E002", f"Known keys: {', '.join(DEFAULTS)}."),
            )
        )
    values = {**DEFAULTS, **raw}

    nodes_raw = values["NODES"]
    addresses: list[NodeAddress] = []
    if isinstance(nodes_raw, str) or not isinstance(nodes_raw, list | tuple):
        problems.append(
            Problem(
                "django_redlock.E003",
                "error",
                "REDLOCK['NODES'] must be a list of nodes",
                _hint("django_redlock.E003", "Three or five independent Redis/Valkey masters."),
            )
        )
    elif not nodes_raw:
        problems.append(
            Problem(
                "django_redlock.E003",
                "error",
                "REDLOCK['NODES'] is empty: no lock can be taken",
                _hint("django_redlock.E003", "Three or five independent Redis/Valkey masters."),
            )
        )
    else:
        for spec in nodes_raw:
            address, node_problems = _node(spec, caches)
            problems.extend(node_problems)
            if address is not None:
                addresses.append(address)
        seen: set[tuple[object, ...]] = set()
        for address in addresses:
            if address.identity in seen:
                problems.append(
                    Problem(
                        "django_redlock.E005",
                        "error",
                        f"REDLOCK node {address.label} is listed twice",
                        _hint("django_redlock.E005", "Redlock needs independent nodes."),
                    )
                )
            seen.add(address.identity)
        if len(nodes_raw) == 1:
            problems.append(
                Problem(
                    "django_redlock.W002",
                    "warning",
                    "REDLOCK has a single node: the lock fails whenever that node does.",
                    _hint(
                        "django_redlock.W002",
                        "Fine for development; use 3 or 5 independent masters in production.",
                    ),
                )
            )
        elif len(nodes_raw) % 2 == 0:
            problems.append(
                Problem(
                    "django_redlock.W001",
                    "warning",
                    f"REDLOCK has {len(nodes_raw)} nodes: an even count tolerates no more "
                    f"failures than {len(nodes_raw) - 1} nodes would.",
                    _hint("django_redlock.W001", "Use an odd number of nodes (3 or 5)."),
                )
            )

    ttl = _number(values["TTL"])
    if ttl is None or not 0 < ttl <= MAX_TTL:
        problems.append(
            Problem(
                "django_redlock.E006",
                "error",
                f"REDLOCK['TTL'] must be seconds in (0, {MAX_TTL:g}], not {values['TTL']!r}",
            )
        )
    drift = _number(values["DRIFT_FACTOR"])
    if drift is None or not 0 <= drift < 0.5:
        problems.append(
            Problem(
                "django_redlock.E007",
                "error",
                f"REDLOCK['DRIFT_FACTOR'] must be in [0, 0.5), not {values['DRIFT_FACTOR']!r}",
                _hint("django_redlock.E007", "The Redlock spec uses 0.01."),
            )
        )
    node_timeout = _number(values["NODE_TIMEOUT"])
    if node_timeout is None or node_timeout <= 0:
        problems.append(
            Problem(
                "django_redlock.E008",
                "error",
                f"REDLOCK['NODE_TIMEOUT'] must be positive seconds, not {values['NODE_TIMEOUT']!r}",
            )
        )
    elif ttl is not None and ttl > 0 and node_timeout > ttl / 10:
        problems.append(
            Problem(
                "django_redlock.E008",
                "error",
                f"REDLOCK['NODE_TIMEOUT'] ({node_timeout:g} s) must be well below the TTL "
                f"({ttl:g} s): at most a tenth of it",
                _hint(
                    "django_redlock.E008",
                    "A slow node must cost a small part of the lease (the default is 0.05 s).",
                ),
            )
        )
    retry_delay = _number(values["RETRY_DELAY"])
    if retry_delay is None or retry_delay <= 0:
        problems.append(
            Problem(
                "django_redlock.E009",
                "error",
                f"REDLOCK['RETRY_DELAY'] must be positive seconds, not {values['RETRY_DELAY']!r}",
            )
        )
    timeout = values["DEFAULT_TIMEOUT"]
    if timeout is not None and (_number(timeout) is None or timeout < 0):
        problems.append(
            Problem(
                "django_redlock.E011",
                "error",
                f"REDLOCK['DEFAULT_TIMEOUT'] must be seconds >= 0 or None, not {timeout!r}",
                _hint("django_redlock.E011", "None makes acquires wait forever (discouraged)."),
            )
        )
    max_ttl = values["MAX_TTL"]
    if max_ttl is not None and (
        _number(max_ttl) is None
        or not 0 < max_ttl <= MAX_TTL
        or (ttl is not None and max_ttl < ttl)
    ):
        problems.append(
            Problem(
                "django_redlock.E012",
                "error",
                f"REDLOCK['MAX_TTL'] must be seconds in [TTL, {MAX_TTL:g}] or None, "
                f"not {max_ttl!r}",
                _hint(
                    "django_redlock.E012",
                    "It is the longest lease allowed and the restart quarantine of a node.",
                ),
            )
        )
    if values["METRICS_LABEL"] not in ("prefix", "name"):
        problems.append(
            Problem(
                "django_redlock.E013",
                "error",
                f"REDLOCK['METRICS_LABEL'] must be 'prefix' or 'name', "
                f"not {values['METRICS_LABEL']!r}",
            )
        )
    if not isinstance(values["KEY_PREFIX"], str):
        problems.append(
            Problem(
                "django_redlock.E010",
                "error",
                f"REDLOCK['KEY_PREFIX'] must be a str, not {type(values['KEY_PREFIX']).__name__}",
            )
        )
    if any(problem.level == "error" for problem in problems):
        return None, problems
    assert ttl is not None
    assert drift is not None
    assert node_timeout is not None
    assert retry_delay is not None
    return (
        RedlockSettings(
            nodes=tuple(addresses),
            ttl=ttl,
            node_timeout=node_timeout,
            retry_delay=retry_delay,
            drift_factor=drift,
            key_prefix=values["KEY_PREFIX"],
            timeout=None if timeout is None else float(timeout),
            max_ttl=None if max_ttl is None else float(max_ttl),
            metrics_label=values["METRICS_LABEL"],
            problems=tuple(problems),
        ),
        problems,
    )


# -- the process-wide state: built on first use, dropped on setting_changed ------------------

_settings: RedlockSettings | None = None
_manager: LockManager | None = None


def get_settings() -> RedlockSettings:
    """The current parsed settings (parsed on first use after each change).

    Raises:
        ImproperlyConfigured: ``REDLOCK`` has an error (the same text the system check shows).
    """
    global _settings
    if _settings is None:
        parsed, problems = inspect(
            getattr(settings, "REDLOCK", {}), getattr(settings, "CACHES", {})
        )
        if parsed is None:
            errors = [problem for problem in problems if problem.level == "error"]
            raise ImproperlyConfigured(
                "; ".join(f"{problem.message} ({problem.id})" for problem in errors)
            )
        _settings = parsed
    return _settings


def get_manager() -> LockManager:
    """The process-wide :class:`~django_redlock.LockManager` built from ``settings.REDLOCK``.

    Raises:
        ImproperlyConfigured: the setting is missing or invalid (the message names the part
            and the system check id).
    """
    global _manager
    if _manager is None:
        from django_redlock.signals import SignalObserver

        config = get_settings()
        observer = SignalObserver()
        observer.label_mode = config.metrics_label
        try:
            _manager = LockManager(
                config.nodes,
                ttl=config.ttl,
                node_timeout=config.node_timeout,
                retry_delay=config.retry_delay,
                default_timeout=config.timeout,
                drift_factor=config.drift_factor,
                key_prefix=config.key_prefix,
                max_ttl=config.max_ttl,
                observer=observer,
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"REDLOCK: {exc}") from None
        observer.manager = _manager
    return _manager


_async_manager: Any = None


def get_async_manager() -> Any:
    """The process-wide :class:`~django_redlock.aredlock.AsyncLockManager`, built from the
    same settings (and observer) as :func:`get_manager`; its connections are per event loop.

    Raises:
        ImproperlyConfigured: as :func:`get_manager`.
    """
    global _async_manager
    manager = get_manager()
    if _async_manager is None or _async_manager.sync is not manager:
        from django_redlock.aredlock import AsyncLockManager

        wrapper = AsyncLockManager.__new__(AsyncLockManager)
        AsyncLockManager._wrap(wrapper, manager)
        _async_manager = wrapper
    return _async_manager


def reset(**kwargs: object) -> None:
    """Drop the parsed settings and the manager (a ``setting_changed`` receiver)."""
    global _settings, _manager
    if kwargs.get("setting", "REDLOCK") not in ("REDLOCK", "CACHES"):
        return
    if _manager is not None:
        _manager.close()
    _settings = None
    _manager = None
    global _async_manager
    _async_manager = None
