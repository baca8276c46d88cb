"""Free the ``once`` lease of a copy that will never run: Celery's ``task_revoked`` handler."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.signals import task_revoked

from django_redlock.contrib.celery.once import free, handle_in
from django_redlock.contrib.celery.policy import has_once, policy_of

__all__ = ["free_once_of_revoked"]

logger = logging.getLogger("django_redlock.celery")


def free_once_of_revoked(
    sender: Any = None, request: Any = None, expired: bool = False, **_: Any
) -> None:
    """``task_revoked``: a copy revoked, or expired in the queue, never runs, so nothing
    else would free its ``once`` lease: free it now (adopt the message's handle, release
    it), or every enqueue with its key would be dropped for up to ``once_ttl``.

    A copy revoked while it runs (``terminate=True``) has adopted the lease already, so the
    message's handle is refused: its process, killed, stops renewing it, and the key runs
    out within ``once_ttl``. Never raises (logged)."""
    if not isinstance(sender, Task) or not has_once(sender):
        return
    found = policy_of(sender)
    if found is None or not found[0].once:
        return
    manager = found[0].get_manager()
    handle = handle_in(manager, request)
    if handle is None:
        return
    why = "expired" if expired else "revoked"
    logger.info(
        "%s[%s] %s: freeing its once lease %r",
        sender.name,
        getattr(request, "id", None),
        why,
        handle.name,
    )
    free(manager, handle, f"task {why}")


task_revoked.connect(free_once_of_revoked, weak=False)
