"""``@locked_command``: one run at a time of a management command, across all machines.

Decorates a command's ``handle``. When the lock is busy the run is skipped (a line on stderr,
exit status 0, so cron stays quiet), fails with ``CommandError`` (exit 1), or waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from typing import Any, Literal, TypeVar, cast

from django.core.management.base import BaseCommand, CommandError

from django_redlock.conf import get_settings
from django_redlock.core.lease import release_quietly
from django_redlock.core.owner import describe_holder
from django_redlock.default_manager import get_manager
from django_redlock.exceptions import LockContended, LockLost, QuorumUnreachable
from django_redlock.procedures.arguments import check_seconds

__all__ = ["locked_command"]

logger = logging.getLogger("django_redlock")

F = TypeVar("F", bound=Callable[..., Any])

OnBusy = Literal["skip", "error", "wait"]


def locked_command(
    name: str | None = None,
    *,
    ttl: float | None = None,
    timeout: float = 0,
    on_busy: OnBusy = "skip",
    max_hold: float | None = None,
) -> Callable[[F], F]:
    """Decorate a management command's ``handle``: one run at a time across all machines.

    The lease is auto-extended while ``handle`` runs.

    Args:
        name: the lock name (default: the command's name, e.g. ``"clear_holds"``).
        ttl: lease length in seconds (default ``REDLOCK["TTL"]``).
        timeout: with ``on_busy="wait"``, seconds to wait (0 means ``REDLOCK["DEFAULT_TIMEOUT"]``).
        on_busy: ``"skip"`` (default: print who holds it on stderr, exit 0), ``"error"``
            (raise ``CommandError``, exit 1), or ``"wait"``.
        max_hold: seconds after which renewal stops (a stuck run cannot hold it forever).

    Raises:
        ValueError: a bad ``on_busy`` or ``timeout``, at decoration time.
        CommandError: busy with ``on_busy="error"``, or after waiting; no quorum; or the
            lease was lost while the command ran (its work may have overlapped another run).
    """
    if on_busy not in ("skip", "error", "wait"):
        raise ValueError(f"on_busy must be 'skip', 'error' or 'wait', not {on_busy!r}")
    check_seconds(timeout, "timeout", allow_zero=True)

    def decorator(handle: F) -> F:
        @wraps(handle)
        def wrapper(self: BaseCommand, *args: Any, **options: Any) -> Any:
            command = name or type(self).__module__.rsplit(".", 1)[-1]
            manager = get_manager()
            waiting = on_busy == "wait"
            wait = (timeout or get_settings().timeout) if waiting else None
            try:
                lease = manager.acquire(
                    command,
                    ttl=ttl,
                    blocking=waiting,
                    timeout=wait,
                    auto_extend=True,
                    max_hold=max_hold,
                    origin=f"command:{command}",
                )
            except QuorumUnreachable as error:
                raise CommandError(f"{command}: cannot take its lock: {error}") from None
            except LockContended:
                message = f"{command} is already running: {describe_holder(manager, command)}"
                if on_busy == "skip":
                    self.stderr.write(f"Skipped: {message}")
                    return None
                raise CommandError(message) from None
            try:
                result = handle(self, *args, **options)
            except BaseException:
                release_quietly(lease, "the command lock", logger)
                raise
            try:
                lease.__exit__(None, None, None)
            except LockLost as error:
                raise CommandError(
                    f"{command}: its lock was lost while it ran, so another run may have "
                    f"overlapped: {error}"
                ) from None
            return result

        return cast(F, wrapper)

    return decorator
