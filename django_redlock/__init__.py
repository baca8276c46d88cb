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

from django_redlock.exceptions import (
    LeaseReleased,
    LockContended,
    LockLost,
    LockNotAcquired,
    QuorumUnreachable,
    RedlockError,
    StaleFencingToken,
)
from django_redlock.redlock import Lease, LockManager

if TYPE_CHECKING:
    from django_redlock.conf import get_manager

__version__ = "0.1.0"

__all__ = [
    "Lease",
    "LeaseReleased",
    "LockContended",
    "LockLost",
    "LockManager",
    "LockNotAcquired",
    "QuorumUnreachable",
    "RedlockError",
    "StaleFencingToken",
    "__version__",
    "get_manager",
]

# Django-facing names, imported lazily so that `import django_redlock` works without Django.
_LAZY: dict[str, str] = {"get_manager": "django_redlock.conf"}


def __dir__() -> list[str]:
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_redlock' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
