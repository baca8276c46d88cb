"""The keyword arguments every acquire takes, sync and asyncio alike, whatever the lease
(a lock, a semaphore slot, a read or write lease, several locks)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import NamedTuple, TypedDict

__all__ = ["MANAGER_DEFAULT", "AcquireOptions", "Checked", "ManagerDefault", "acquire_options"]


class ManagerDefault(enum.Enum):
    """The type of :data:`MANAGER_DEFAULT`."""

    TIMEOUT = "the manager's default_timeout"


MANAGER_DEFAULT = ManagerDefault.TIMEOUT
"""``acquire(timeout=...)``'s default: the manager's ``default_timeout``."""


class AcquireOptions(TypedDict, total=False):
    """The keyword arguments of ``acquire`` and ``lock``, sync and asyncio alike (see
    :meth:`LockManager.acquire`); absent ones take their defaults."""

    ttl: float | None
    blocking: bool
    timeout: float | ManagerDefault | None
    auto_extend: bool
    max_hold: float | None
    origin: str | None


class Checked(NamedTuple):
    """An acquire's arguments once checked (``LockManager._acquire_arguments``): what the
    sync and the asyncio managers' rounds take."""

    ttl: float
    """The lease length in seconds."""
    blocking: bool
    wait: float | None
    """Seconds to keep trying; None: forever (and for a single try)."""
    auto_extend: bool
    hold: float | None
    """``max_hold`` in seconds, or None."""
    origin: str | None
    """The origin, cut to its budget."""


_ACQUIRE_DEFAULTS: dict[str, object] = {
    "ttl": None,
    "blocking": True,
    "timeout": MANAGER_DEFAULT,
    "auto_extend": False,
    "max_hold": None,
    "origin": None,
}


def acquire_options(options: Mapping[str, object]) -> tuple[object, ...]:
    """``options`` as (ttl, blocking, timeout, auto_extend, max_hold, origin), defaults
    filled in.

    Raises:
        TypeError: an argument ``acquire`` does not take.
    """
    unknown = set(options) - set(_ACQUIRE_DEFAULTS)
    if unknown:
        raise TypeError(f"acquire() got an unexpected keyword argument {min(unknown)!r}")
    return tuple(options.get(name, default) for name, default in _ACQUIRE_DEFAULTS.items())
