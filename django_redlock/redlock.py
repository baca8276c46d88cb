"""The sync manager's public import path: :class:`LockManager` hands out :class:`Lease`
objects (both defined in ``django_redlock.core.manager``, with the Django-free core).

This module imports no Django (a test proves it), so it can be used from any Python process.
"""

from __future__ import annotations

from django_redlock.core.manager import (
    DEFAULT_DRIFT_FACTOR,
    DEFAULT_NODE_TIMEOUT,
    DEFAULT_RETRY_DELAY,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    MANAGER_DEFAULT,
    MAX_NAME_BYTES,
    MAX_ORIGIN_BYTES,
    MAX_OWNER_BYTES,
    MAX_TTL,
    NODE_KEY,
    AcquireOptions,
    BaseLease,
    Lease,
    LockManager,
    LockObserver,
)

__all__ = [
    "DEFAULT_DRIFT_FACTOR",
    "DEFAULT_NODE_TIMEOUT",
    "DEFAULT_RETRY_DELAY",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TTL",
    "MANAGER_DEFAULT",
    "MAX_NAME_BYTES",
    "MAX_ORIGIN_BYTES",
    "MAX_OWNER_BYTES",
    "MAX_TTL",
    "NODE_KEY",
    "AcquireOptions",
    "BaseLease",
    "Lease",
    "LockManager",
    "LockObserver",
]
