"""The run lock: taken by the worker before a locked task's function runs, never held across
a retry; what happens when it is busy; and :func:`current_lease`."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from celery import Task
from celery._state import get_current_task

from django_redlock.contrib.celery.policy import Policy
from django_redlock.core.owner import describe_holder
from django_redlock.exceptions import LockContended, QuorumUnreachable
from django_redlock.redlock import Lease, LockManager

__all__ = ["LEASE_ATTR", "acquire", "countdown", "current_lease", "lease_of", "origin"]

logger = logging.getLogger("django_redlock.celery")

#: Set on the task's request (celery.app.task.Context) while a locked task runs: its lease.
LEASE_ATTR = "redlock_lease"


def origin(task: Task, request: Any) -> str:
    """The run lock's origin, shown on the admin page: ``celery:<task name>[<task id>]``."""
    return f"celery:{task.name}[{getattr(request, 'id', None) or 'direct'}]"


def countdown(
    retry_after: float | None,
    policy: Policy,
    retries: int,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds until retry number ``retries + 1`` of a task whose lock was busy.

    ``retry_first_countdown`` doubled each retry, with ±25 % jitter (copies that met the
    same holder do not all come back at once), but never past the holder's remaining lease
    (``retry_after``, when the nodes told it: by then the lock is free even if its holder
    died), at least 0.1 s (never a hot loop) and at most ``retry_max_countdown``. Waiting
    for the holder's whole lease, as before, retried a task 30 s after a holder that was
    done in 3 s (issue 23); now the retry comes within about one doubling of the release.
    """
    seconds = policy.retry_first_countdown * 2.0 ** min(retries, 30) * uniform(0.75, 1.25)
    if retry_after is not None:
        seconds = min(seconds, retry_after)
    return min(max(seconds, 0.1), policy.retry_max_countdown)


def acquire(
    policy: Policy, task: Task, manager: LockManager, name: str, origin: str
) -> Lease | None:
    """The run lock ``name``, or None (busy, ``on_busy="skip"``).

    Raises:
        LockContended: busy, with ``on_busy="error"``.
        celery.exceptions.Retry: busy, or no quorum, with ``on_busy="retry"`` (Celery's
            ``task.retry``, which sends the retried message first).
        QuorumUnreachable: no quorum, unless ``on_busy="retry"``.
    """
    try:
        return manager.acquire(
            name,
            ttl=policy.ttl,
            blocking=policy.timeout > 0,
            timeout=policy.timeout if policy.timeout > 0 else None,
            auto_extend=policy.auto_extend,
            max_hold=policy.max_hold,
            origin=origin,
        )
    except LockContended as error:
        holder = describe_holder(manager, name)
        if policy.on_busy == "skip":
            logger.warning("skipped %s: lock %r is %s", origin, name, holder)
            return None
        if policy.on_busy == "error":
            logger.warning("failing %s: lock %r is %s", origin, name, holder)
            raise
        seconds = countdown(error.retry_after, policy, task.request.retries or 0)
        logger.info("retrying %s in %.1f s: lock %r is %s", origin, seconds, name, holder)
        raise task.retry(countdown=seconds, exc=error) from None
    except QuorumUnreachable as error:
        if policy.on_busy != "retry":
            raise
        seconds = countdown(None, policy, task.request.retries or 0)
        logger.warning("retrying %s in %.1f s: no quorum for %r: %s", origin, seconds, name, error)
        raise task.retry(countdown=seconds, exc=error) from None


def lease_of(request: Any) -> Lease | None:
    """The run lock's lease set on a task ``request`` while its function runs, or None."""
    lease = getattr(request, LEASE_ATTR, None)
    return lease if isinstance(lease, Lease) else None


def current_lease() -> Lease | None:
    """The run lock's lease of the locked task running in this thread, or None.

    ``lease.check()`` raises ``LockLost`` once it may have expired; ``lease.fencing_token``
    is None (the run lock mints none: use ``lock_for(instance)`` for fenced writes).
    """
    task = get_current_task()
    return None if task is None else lease_of(task.request)
