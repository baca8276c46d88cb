"""What a locked task was asked for (:class:`Policy`, checked once), and how to find it on a
task."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast

from celery import Task
from celery.local import Proxy

from django_redlock.contrib.celery.naming import Key, Namer
from django_redlock.procedures.arguments import check_seconds
from django_redlock.redlock import LockManager

__all__ = [
    "ONCE_ATTR",
    "POLICY_ATTR",
    "ManagerOption",
    "OnBusy",
    "Policy",
    "has_once",
    "make_policy",
    "policy_of",
    "task_like",
]

OnBusy = Literal["skip", "retry", "error"]
ManagerOption = LockManager | Callable[[], LockManager] | None

#: Set on a locked task's function: its ``(Policy, Namer)``.
POLICY_ATTR = "__redlock_policy__"
#: Set on a task class whose ``apply_async`` takes the ``once`` lease.
ONCE_ATTR = "__redlock_once__"


def _optional_seconds(value: object, argument: str) -> float | None:
    return None if value is None else check_seconds(value, argument)


@dataclass(frozen=True)
class Policy:
    """What ``locked_task`` was asked for, validated once at decoration time (seconds
    throughout)."""

    key: Key
    on_busy: OnBusy
    ttl: float | None
    timeout: float
    auto_extend: bool
    max_hold: float | None
    once: bool
    once_ttl: float | None
    once_raise: bool
    retry_max_countdown: float
    retry_first_countdown: float
    manager: ManagerOption

    def get_manager(self) -> LockManager:
        """The manager the task's leases go through.

        Raises:
            TypeError: the ``manager`` callable returned something else than a LockManager.
        """
        if self.manager is None:
            from django_redlock.default_manager import get_manager  # Django only when asked for

            return get_manager()
        if isinstance(self.manager, LockManager):
            return self.manager
        manager = self.manager()
        if not isinstance(manager, LockManager):
            raise TypeError(
                f"manager callable must return a LockManager, not {type(manager).__name__}"
            )
        return manager


def make_policy(
    key: object,
    *,
    on_busy: object = "skip",
    ttl: object = None,
    timeout: object = 0,
    auto_extend: object = True,
    max_hold: object = None,
    once: object = False,
    once_ttl: object = None,
    once_raise: object = False,
    retry_max_countdown: object = 60.0,
    retry_first_countdown: object = 0.5,
    manager: object = None,
) -> Policy:
    """``locked_task``'s arguments checked (see :func:`~django_redlock.contrib.celery.locked_task`).

    Raises:
        TypeError, ValueError: a bad argument; the message names it.
    """
    if not isinstance(key, str) and not callable(key):
        raise TypeError(f"key must be a format string or a callable, not {type(key).__name__}")
    what = task_like(key, any_class=False)  # a class may build keys: key=str
    if what is not None:
        # @locked_task without arguments over @app.task: the task became the key.
        raise TypeError(
            f"key must be a format string or a callable, not {what}: locked_task(...) takes "
            "the lock's key, and goes under @app.task (or @shared_task), next to the def"
        )
    if isinstance(key, str) and not key:
        raise ValueError("key must not be empty")
    if on_busy not in ("skip", "retry", "error"):
        raise ValueError(f"on_busy must be 'skip', 'retry' or 'error', not {on_busy!r}")
    for flag, value in (("auto_extend", auto_extend), ("once", once), ("once_raise", once_raise)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, not {type(value).__name__}")
    if manager is not None and not isinstance(manager, LockManager) and not callable(manager):
        raise TypeError(
            f"manager must be a LockManager, a callable returning one, or None, "
            f"not {type(manager).__name__}"
        )
    return Policy(
        key=cast(Key, key),
        on_busy=on_busy,
        ttl=_optional_seconds(ttl, "ttl"),
        timeout=check_seconds(timeout, "timeout", allow_zero=True),
        auto_extend=cast(bool, auto_extend),
        max_hold=_optional_seconds(max_hold, "max_hold"),
        once=cast(bool, once),
        once_ttl=_optional_seconds(once_ttl, "once_ttl"),
        once_raise=cast(bool, once_raise),
        retry_max_countdown=check_seconds(retry_max_countdown, "retry_max_countdown"),
        retry_first_countdown=check_seconds(retry_first_countdown, "retry_first_countdown"),
        manager=cast(ManagerOption, manager),
    )


def task_like(value: object, *, any_class: bool = True) -> str | None:
    """What ``value`` is when it is a Celery task, a task proxy or a task class (or, with
    ``any_class``, any class), never a task's function, for error messages; else None.

    Looks at ``type(value)`` only: a proxy (what ``@app.task`` returns before its app is
    finalized, and ``@shared_task`` always) would build its task on any attribute access,
    ``isinstance`` included.
    """
    cls = type(value)
    if issubclass(cls, Proxy):
        return "a Celery task (the proxy that @app.task or @shared_task returns)"
    if issubclass(cls, Task):
        return f"a Celery task ({cast(Task, value).name})"
    if issubclass(cls, type):
        if issubclass(cast(type, value), Task):
            return f"a task class ({cast(type, value).__qualname__})"
        if any_class:
            return f"a class ({cast(type, value).__qualname__})"
    return None


def policy_of(task: Task) -> tuple[Policy, Namer] | None:
    """The policy of a locked task (either spelling), or None."""
    found = getattr(task.run, POLICY_ATTR, None)
    return cast(tuple[Policy, Namer] | None, found)


def has_once(task: Task) -> bool:
    """Whether ``task``'s class takes the ``once`` lease in its ``apply_async``."""
    return bool(getattr(type(task), ONCE_ATTR, False))
