"""Distributed locks for Django on Redis or Valkey (Redlock), with database fencing tokens.

Efficiency from Redis, correctness from your database: Redlock keeps two workers from doing
the same work at once; the fencing token, minted and checked in the database, refuses the
write of a holder whose lease silently expired.

Importing this package imports no Django: the core (``LockManager``, ``Lease``, the errors)
works in any Python process. The Django-facing names are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from django_redlock.core.handle import LeaseHandle
from django_redlock.core.kinds import RWLock, Semaphore
from django_redlock.exceptions import (
    FencingUnavailable,
    LeaseInherited,
    LeaseNotExtended,
    LeaseReleased,
    LockContended,
    LockLost,
    LockNotAcquired,
    QuorumUnreachable,
    RedlockError,
    StaleFencingToken,
    UnfencedWrite,
)
from django_redlock.redlock import Lease, LockManager

if TYPE_CHECKING:
    from django_redlock.aredlock import AsyncLease, AsyncLockManager
    from django_redlock.command_lock import locked_command
    from django_redlock.decorators import LockedViewMixin, locked_view
    from django_redlock.default_manager import get_async_manager, get_manager
    from django_redlock.locks import alock_for, lock_for

__version__ = "0.1.0"

__all__ = [
    "AsyncLease",
    "AsyncLockManager",
    "FencingUnavailable",
    "Lease",
    "LeaseHandle",
    "LeaseInherited",
    "LeaseNotExtended",
    "LeaseReleased",
    "LockContended",
    "LockLost",
    "LockManager",
    "LockNotAcquired",
    "LockedViewMixin",
    "QuorumUnreachable",
    "RWLock",
    "RedlockError",
    "Semaphore",
    "StaleFencingToken",
    "UnfencedWrite",
    "__version__",
    "alock_for",
    "get_async_manager",
    "get_manager",
    "lock_for",
    "locked_command",
    "locked_view",
]

# Django-facing names, imported lazily so that `import django_redlock` works without Django.
_LAZY: dict[str, str] = {
    # The asyncio core imports no Django either; lazy only so `import django_redlock` stays cheap.
    "AsyncLockManager": "django_redlock.aredlock",
    "AsyncLease": "django_redlock.aredlock",
    "get_manager": "django_redlock.default_manager",
    "get_async_manager": "django_redlock.default_manager",
    "lock_for": "django_redlock.locks",
    "alock_for": "django_redlock.locks",
    "locked_view": "django_redlock.decorators",
    "locked_command": "django_redlock.command_lock",
    "LockedViewMixin": "django_redlock.decorators",
}


def __dir__() -> list[str]:
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_redlock' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
