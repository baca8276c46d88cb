"""The ``REDLOCK`` setting: one parser, used by the runtime and (later) the system checks.

Settings are read lazily, never at import, and the parsed result is dropped whenever Django
sends ``setting_changed`` for ``REDLOCK`` (``override_settings`` in tests just works).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from django_redlock.redlock import (
    DEFAULT_DRIFT_FACTOR,
    DEFAULT_NODE_TIMEOUT,
    DEFAULT_RETRY_DELAY,
    DEFAULT_TTL,
    LockManager,
)

__all__ = ["RedlockSettings", "get_manager", "get_settings", "reset"]

DEFAULTS: dict[str, Any] = {
    "NODES": [],
    "TTL": DEFAULT_TTL,
    "NODE_TIMEOUT": DEFAULT_NODE_TIMEOUT,
    "RETRY_DELAY": DEFAULT_RETRY_DELAY,
    "DRIFT_FACTOR": DEFAULT_DRIFT_FACTOR,
    "KEY_PREFIX": "redlock:",
}


@dataclass(frozen=True)
class RedlockSettings:
    """The parsed ``REDLOCK`` setting (times in seconds)."""

    nodes: tuple[object, ...]
    ttl: float
    node_timeout: float
    retry_delay: float
    drift_factor: float
    key_prefix: str


_settings: RedlockSettings | None = None
_manager: LockManager | None = None


def parse(raw: object) -> RedlockSettings:
    """Parse a ``REDLOCK`` value.

    Raises:
        ImproperlyConfigured: not a dict, or an unknown key.
    """
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"REDLOCK must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ImproperlyConfigured(f"REDLOCK has unknown keys: {', '.join(map(str, unknown))}")
    values = {**DEFAULTS, **raw}
    return RedlockSettings(
        nodes=tuple(values["NODES"]),
        ttl=values["TTL"],
        node_timeout=values["NODE_TIMEOUT"],
        retry_delay=values["RETRY_DELAY"],
        drift_factor=values["DRIFT_FACTOR"],
        key_prefix=values["KEY_PREFIX"],
    )


def get_settings() -> RedlockSettings:
    """The current parsed settings (parsed on first use after each change)."""
    global _settings
    if _settings is None:
        _settings = parse(getattr(settings, "REDLOCK", {}))
    return _settings


def get_manager() -> LockManager:
    """The process-wide :class:`LockManager` built from ``settings.REDLOCK``.

    Raises:
        ImproperlyConfigured: the setting is missing or invalid (the message says which part).
    """
    global _manager
    if _manager is None:
        config = get_settings()
        try:
            _manager = LockManager(
                config.nodes,
                ttl=config.ttl,
                node_timeout=config.node_timeout,
                retry_delay=config.retry_delay,
                drift_factor=config.drift_factor,
                key_prefix=config.key_prefix,
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"REDLOCK: {exc}") from None
    return _manager


def reset(**kwargs: object) -> None:
    """Drop the parsed settings and the manager (a ``setting_changed`` receiver)."""
    global _settings, _manager
    if kwargs.get("setting", "REDLOCK") != "REDLOCK":
        return
    if _manager is not None:
        _manager.close()
    _settings = None
    _manager = None
