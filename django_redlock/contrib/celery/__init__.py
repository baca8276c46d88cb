"""Celery tasks that run one at a time per lock name, and enqueue once per key.

``pip install ".[celery]"`` from the clone. Two spellings, one implementation::

    @app.task(bind=True)
    @locked_task(key="report:{account_id}", on_busy="retry", ttl=30, once=True)
    def build_report(self, account_id): ...

    @app.task(bind=True, base=LockedTask, redlock={"key": "report:{account_id}", "once": True})
    def build_report(self, account_id): ...

(``once=True`` works in ``apply_async``: the decorator gives the task class Celery builds
around it ``LockedTask``'s ``apply_async`` when that class is created, under ``@app.task`` or
``@shared_task``, with or without ``bind=True``. The decorator goes *under* the task
decorator: placed over a task, given a class, or written without its arguments, it is a
``TypeError`` at declaration that shows this order.)

**The run lock.** The worker takes the lock ``key`` (formatted from the task's arguments)
before the task's function runs, with the origin ``celery:<task name>[<task id>]`` (shown on
the admin page), auto-extended while the function runs, and releases it when the function
returns, raises, or asks for a retry: it is never held across a retry. When the lock is busy
the task is skipped (logged with the holder, result ``None``), retried with Celery's own
``self.retry(countdown=...)`` (the countdown is the holder's remaining lease, bounded), or
fails with :class:`~django_redlock.LockContended`.

**Once.** With ``once=True``, ``apply_async``/``delay`` first takes a lease ``once:<key>``
(no waiting, ttl ``once_ttl``) whose origin names the task id, and hands it to the worker in
a message header (``lease.handle()``). A second enqueue of the same key finds the lease
held, reads the first task id from its origin, and returns that ``AsyncResult`` (or raises
:class:`AlreadyQueued`). The worker adopts the lease when the task starts (``m.adopt``,
which proves it is still the message's), the core renews it while the task runs, and the
worker releases it when the task finishes. A retry hands it on to the retried message. A
worker killed meanwhile stops renewing it, so the key always runs out within ``once_ttl``:
never a key to delete by hand.

Both leases go through the same :class:`~django_redlock.LockManager` as every other lock, so
the quorum, validity and restart rules are the ones of ``acquire``.

The modules, one job each: ``policy`` (the options), ``naming`` (the lock name from the
task's arguments), ``run_lock``, ``once`` (the ``once`` lease and its hand-offs), ``task``
(the two spellings and a run) and ``revoke`` (a revoked copy's ``once`` lease).
"""

from __future__ import annotations

try:
    import celery  # noqa: F401 - only to fail early, with the extra to install
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "django_redlock.contrib.celery needs Celery: pip install 'django_redlock[celery]'"
    ) from error

from django_redlock.contrib.celery import revoke  # noqa: F401 - connects task_revoked
from django_redlock.contrib.celery.once import AlreadyQueued
from django_redlock.contrib.celery.run_lock import current_lease
from django_redlock.contrib.celery.task import LockedTask, locked_task

__all__ = ["AlreadyQueued", "LockedTask", "current_lease", "locked_task"]
