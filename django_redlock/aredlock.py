"""The asyncio manager's public import path: :class:`AsyncLockManager` hands out
:class:`AsyncLease` objects (both defined in ``django_redlock.core.amanager``, with the
Django-free core). It imports nothing of the sync manager's module.
"""

from __future__ import annotations

from django_redlock.core.amanager import AsyncLease, AsyncLockManager

__all__ = ["AsyncLease", "AsyncLockManager"]
