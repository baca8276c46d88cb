"""Celery tasks that run one at a time per lock name, and enqueue once per key.

``pip install ".[celery]"`` from the clone. Two spellings, one implementation::

    @app.task(bind=True)
    @locked_task(key="report:{account_id}", on_busy="retry", ttl=30, once=True)
    def build_report(self, account_id): ...

    @app.task(bind=True, base=LockedTask, redlock={"key": "report:{account_id}", "once": True})
    def build_report(self, account_id): ...

(``once=True`` works in ``apply_async``: the decorator gives the task class Celery builds
around it ``LockedTask``'s ``apply_async`` when that class is created, which needs
``bind=True``; ``@app.task`` without it over ``once=True`` is refused when the task runs.)

**The run lock.** The worker takes the lock ``key`` (formatted from the task's arguments)
before the task's function runs, with the origin ``celery:<task name>[<task id>]`` (shown on
the admin page), auto-extended while the function runs, and releases it when the function
returns, raises, or asks for a retry: it is never held across a retry. When the lock is busy
the task is skipped (logged with the holder, result ``None``), retried with Celery's own
``self.retry(countdown=...)`` (the countdown is the holder's remaining lease, bounded), or
fails with :class:`~django_redlock.LockContended`.

**Once.** With ``once=True``, ``apply_async``/``delay`` first takes a lease ``once:<key>``
(no waiting, ttl ``once_ttl``) whose origin names the task id, and hands the lease's token to
the worker in a message header. A second enqueue of the same key finds the lease held, reads
the first task id from its origin, and returns that ``AsyncResult`` (or raises
:class:`AlreadyQueued`). The worker adopts the lease when the task starts (extending it, which
proves it is still the owner), keeps extending it while the task runs, and releases it when the
task finishes. A retry hands it on to the retried message. A worker killed meanwhile stops
renewing it, so the key always runs out within ``once_ttl``: never a key to delete by hand.

Both leases go through the same :class:`~django_redlock.LockManager` as every other lock, so
the quorum, validity and restart rules are the ones of ``acquire``.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import string
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import update_wrapper
from types import MethodType
from typing import Any, ClassVar, Literal, TypeVar, cast

try:
    from celery import Task
    from celery._state import get_current_task
    from celery.result import AsyncResult
    from celery.signals import task_revoked
    from celery.utils import uuid
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "django_redlock.contrib.celery needs Celery: pip install 'django_redlock[celery]'"
    ) from error

from django_redlock.core.arguments import MAX_ORIGIN_BYTES, check_seconds
from django_redlock.core.lease import release_quietly
from django_redlock.core.owner import describe_holder
from django_redlock.exceptions import (
    LeaseNotExtended,
    LeaseReleased,
    LockContended,
    LockLost,
    QuorumUnreachable,
    RedlockError,
)
from django_redlock.redlock import Lease, LockManager

__all__ = ["AlreadyQueued", "LockedTask", "current_lease", "locked_task"]

logger = logging.getLogger("django_redlock.celery")

OnBusy = Literal["skip", "retry", "error"]
Key = str | Callable[..., str]
ManagerOption = LockManager | Callable[[], LockManager] | None
F = TypeVar("F", bound=Callable[..., Any])

#: The message header that carries the ``once`` lease from ``apply_async`` to the worker.
HEADER = "redlock_once"
#: Prefix of the ``once`` lease's name: ``once:<key>``.
ONCE_PREFIX = "once:"
_ONCE_ORIGIN = "celery-once:"
# Attributes set on the task's request (celery.app.task.Context) while a locked task runs.
_LEASE_ATTR = "redlock_lease"
_MARKER_ATTR = "redlock_marker"
_HANDED_ATTR = "redlock_marker_handed_off"
_POLICY_ATTR = "__redlock_policy__"


class AlreadyQueued(RedlockError):
    """``apply_async`` with ``once=True`` found the same key already queued or running.

    Raised instead of returning the existing ``AsyncResult`` when the task asks for it
    (``once_raise=True``).

    Attributes:
        name: the ``once`` lease's name (``once:<key>``).
        task_id: the id of the copy already queued or running, or None when the lease's owner
            could not be read (it was taken by something other than this module).
    """

    def __init__(self, name: str, task_id: str | None) -> None:
        self.name = name
        self.task_id = task_id
        super().__init__(name, task_id)  # the arguments, so it can be rebuilt (see RedlockError)
        self._text = f"{name!r} is already queued or running" + (
            f" as task {task_id}" if task_id else ""
        )


# -- options ------------------------------------------------------------------------------


def _optional_seconds(value: object, argument: str) -> float | None:
    return None if value is None else check_seconds(value, argument)


@dataclass(frozen=True)
class _Policy:
    """What ``locked_task`` was asked for, validated once at decoration time."""

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


def _make_policy(
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
) -> _Policy:
    if not isinstance(key, str) and not callable(key):
        raise TypeError(f"key must be a format string or a callable, not {type(key).__name__}")
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
    return _Policy(
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


# -- lock names from the task's arguments --------------------------------------------------


class _Namer:
    """Builds the lock name from a call's arguments, bound to the function's signature."""

    def __init__(self, key: Key, function: Callable[..., Any], *, bound: bool | None) -> None:
        self.key = key
        self.function = function
        signature = inspect.signature(function)
        parameters = list(signature.parameters.values())
        self.unbound = signature
        self.bound = signature.replace(parameters=parameters[1:]) if parameters else signature
        if bound is None:
            # Under @app.task(bind=True) the decorator cannot see the binding: Celery's
            # convention names the task parameter "self", and it is never part of the key.
            bound = bool(parameters) and parameters[0].name == "self"
        if isinstance(key, str):
            self._check_fields(key, parameters[1:] if bound else parameters)

    def _check_fields(self, key: str, parameters: list[inspect.Parameter]) -> None:
        """Refuse, at decoration time, a field that no argument can ever fill."""
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return  # any name may arrive in **kwargs: checked at call time
        names = [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        positional = sum(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in parameters)
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(key) if field]
        except ValueError as error:
            raise ValueError(f"key {key!r} is not a valid format string: {error}") from None
        for field in fields:
            head = field.split(".", 1)[0].split("[", 1)[0]
            if head.isdigit():
                if int(head) >= positional and not any(
                    p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters
                ):
                    raise ValueError(
                        f"key {key!r} refers to positional argument {{{head}}}, but "
                        f"{self._describe()} takes {positional} positional argument(s)"
                    )
            elif head == "":
                raise ValueError(
                    f"key {key!r} has an empty field {{}}: name the argument, e.g. "
                    f"{{{names[0] if names else 'name'}}}"
                )
            elif head not in names:
                raise ValueError(
                    f"key {key!r} refers to {{{head}}}, which is not an argument of "
                    f"{self._describe()} ({', '.join(names) or 'it takes none'})"
                )

    def _describe(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"

    def name(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, bound: bool) -> str:
        """The lock name for a call with ``args``/``kwargs`` (without the bound task).

        Raises:
            ValueError: a field of the key is missing from this call's arguments.
            TypeError: the arguments do not fit the function, or a key callable returned
                something other than a str.
        """
        if callable(self.key):
            resolved = self.key(*args, **kwargs)
            if not isinstance(resolved, str):
                raise TypeError(f"key callable must return a str, not {type(resolved).__name__}")
            return resolved
        signature = self.bound if bound else self.unbound
        try:
            call = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self._describe()}: {error}") from None
        call.apply_defaults()
        named: dict[str, Any] = {}
        for parameter in signature.parameters.values():
            value = call.arguments.get(parameter.name)
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value or {})
            elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
                named[parameter.name] = value
        try:
            return self.key.format(*call.args, **named)
        except (KeyError, IndexError, AttributeError) as error:
            raise ValueError(
                f"key {self.key!r} refers to {error}, which this call of {self._describe()} "
                f"does not give (arguments: {', '.join(named) or 'none'})"
            ) from None


# -- the run -----------------------------------------------------------------------------


def _origin(task: Task, request: Any) -> str:
    return f"celery:{task.name}[{getattr(request, 'id', None) or 'direct'}]"


def _countdown(
    retry_after: float | None,
    policy: _Policy,
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


class _MarkerKeeper:
    """Extends the ``once`` lease every third of its ttl while the task runs.

    A thread of this process: a worker killed with SIGKILL takes it along, and the lease runs
    out within its ttl. A renewal that reaches no quorum (``LeaseNotExtended``) keeps the
    lease as it was and is tried again sooner, as the extender does for every lease
    (``BaseLease.renew_once``); the keeper stops when the lease has ended (``LockLost``: its
    validity ran out, or a quorum no longer holds it; a second copy may then be enqueued,
    and the run lock still keeps the runs apart).
    """

    def __init__(self, marker: Lease) -> None:
        self.marker = marker
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"django_redlock-once:{marker.name}", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        wait = self.marker.ttl / 3
        while not self.stop.wait(wait):
            wait = self.marker.ttl / 3
            try:
                self.marker.extend()
            except LeaseNotExtended as error:
                logger.warning("the once lease %r: %s; trying again", self.marker.name, error)
                wait = self.marker._retry_in(error.validity)
            except (LockLost, LeaseReleased) as error:
                logger.warning(
                    "the once lease %r could not be renewed: %s", self.marker.name, error
                )
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _header(request: Any) -> Mapping[str, Any] | None:
    """The ``once`` lease's header on a task request (Celery's Context), or None."""
    handle = getattr(request, HEADER, None)
    if handle is None:
        handle = (getattr(request, "headers", None) or {}).get(HEADER)
    return handle if isinstance(handle, Mapping) else None


def _adopt_marker(manager: LockManager, request: Any) -> tuple[Lease, bool] | None:
    """The ``once`` lease handed over in the message, and whether this worker could adopt
    it; None when the message carries none.

    Adopting is an ``extend`` with the token: it renews only keys that still hold that
    token, on a quorum, so success proves the lease is still this message's (and gives it a
    fresh validity). Failure means it ran out in the queue, or too few nodes answered: the
    lease is kept anyway, so that a retry (``on_busy="retry"`` through a quorum outage)
    hands the same token on instead of needing a new ``once`` lease while the nodes are down.
    """
    handle = _header(request)
    if handle is None:
        return None
    try:
        name, token, ttl = str(handle["name"]), str(handle["token"]), float(handle["ttl"])
    except (KeyError, TypeError, ValueError):
        logger.warning("ignoring a malformed %s header", HEADER)
        return None
    now = manager._clock()
    lease = Lease(
        manager,
        name=name,
        key=manager.key(name),
        token=token,
        ttl=ttl,
        # Unknown until the extend below sets the real validity from its own round.
        expires_at=math.inf,
        acquired_at=now,
        origin=handle.get("origin"),
    )
    try:
        lease.extend()
    except (LockLost, LeaseNotExtended) as error:
        # LeaseNotExtended: too few nodes answered; the lease's validity stays unknown
        # (infinite here), which only matters for a confirmed lease: this one is never
        # renewed, only handed on or freed.
        logger.warning(
            "the once lease %r could not be renewed when task %s started (%s): it ran out in "
            "the queue (raise once_ttl above the time tasks wait there) or too few nodes "
            "answered",
            name,
            getattr(request, "id", None),
            error,
        )
        return lease, False
    return lease, True


class _MarkerState:
    """The ``once`` lease of the running task, and whether a retry took it over."""

    def __init__(self, marker: Lease, confirmed: bool) -> None:
        self.marker = marker
        # An unconfirmed lease (its adopt failed) is not renewed, only handed on or freed.
        self.keeper = _MarkerKeeper(marker) if confirmed else None
        self.handed_off = False

    def hand_off(self) -> dict[str, Any]:
        """Give the lease to a retry of this task: stop renewing it here, try to extend it
        once more (a full ``once_ttl`` ahead for the retried message), and return its header.
        The header goes on even when that extend fails: if the lease is gone, the retry's
        own adopt says so and it runs without it; if the nodes were only unreachable, the
        key stays this message's instead of needing a new lease while they are down."""
        if self.keeper is not None:
            self.keeper.close()
        try:
            self.marker.extend()
        except (LockLost, LeaseReleased, LeaseNotExtended) as error:
            name = self.marker.name
            logger.info("handing the once lease %r on to a retry unrenewed: %s", name, error)
        self.handed_off = True
        return _handle(self.marker)

    def finish(self) -> None:
        if self.keeper is not None:
            self.keeper.close()
        if not self.handed_off and not self.marker.released:
            release_quietly(self.marker, "the once lease", logger)


def _handle(marker: Lease) -> dict[str, Any]:
    return {"name": marker.name, "token": marker.token, "ttl": marker.ttl, "origin": marker.origin}


def _run_locked(
    policy: _Policy,
    namer: _Namer,
    task: Task,
    call: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    bound: bool,
) -> Any:
    """Run ``call`` under the run lock (and the ``once`` lease, if handed over)."""
    request = task.request
    call_args = args[1:] if bound else args
    name = namer.name(call_args, kwargs, bound=bound)
    manager = policy.get_manager()
    state: _MarkerState | None = None
    if policy.once:
        if not _has_once(task):
            # Only @app.task without bind=True gets here (see _LockedFunction).
            raise TypeError(
                f"{task.name}: once=True works in apply_async, which Celery's task class "
                "lacks here: declare the task with @app.task(bind=True) over @locked_task, "
                "or with base=LockedTask"
            )
        adopted = _adopt_marker(manager, request)
        if adopted is not None:
            state = _MarkerState(*adopted)
    setattr(request, _MARKER_ATTR, state)
    try:
        lease = _acquire(policy, task, manager, name, _origin(task, request))
        if lease is None:
            return None
        setattr(request, _LEASE_ATTR, lease)
        try:
            result = call(*args, **kwargs)
        except BaseException:
            # A failure or a retry (celery.exceptions.Retry): the lock is never held across
            # a retry, and the task's own error is what the caller must see.
            release_quietly(lease, "the task lock", logger)
            raise
        finally:
            setattr(request, _LEASE_ATTR, None)
        # Raises LockLost when the lease was lost while the task ran: its work may have
        # overlapped another run (fenced writes were refused at the time).
        lease.__exit__(None, None, None)
        return result
    finally:
        setattr(request, _MARKER_ATTR, None)
        if state is not None:
            state.finish()


def _acquire(
    policy: _Policy, task: Task, manager: LockManager, name: str, origin: str
) -> Lease | None:
    """The run lock, or None (skip), or raises (error, or Celery's Retry)."""
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
        countdown = _countdown(error.retry_after, policy, task.request.retries or 0)
        logger.info("retrying %s in %.1f s: lock %r is %s", origin, countdown, name, holder)
        raise task.retry(countdown=countdown, exc=error) from None
    except QuorumUnreachable as error:
        if policy.on_busy != "retry":
            raise
        countdown = _countdown(None, policy, task.request.retries or 0)
        logger.warning(
            "retrying %s in %.1f s: no quorum for %r: %s", origin, countdown, name, error
        )
        raise task.retry(countdown=countdown, exc=error) from None


def locked_task(
    key: Key,
    *,
    on_busy: OnBusy = "skip",
    ttl: float | None = None,
    timeout: float = 0,
    auto_extend: bool = True,
    max_hold: float | None = None,
    once: bool = False,
    once_ttl: float | None = None,
    once_raise: bool = False,
    retry_max_countdown: float = 60.0,
    retry_first_countdown: float = 0.5,
    manager: ManagerOption = None,
) -> Callable[[F], F]:
    """Decorate a Celery task's function (under ``@app.task``): one run at a time per key.

    Args:
        key: the lock name: a format string over the task's arguments, positional
            (``"{0}"``) and by name (``"report:{account_id}"``, defaults included), or a
            callable ``(*args, **kwargs) -> str`` given the task's arguments.
        on_busy: ``"skip"`` (default: log the holder, return None), ``"retry"`` (Celery's
            ``self.retry``: ``retry_first_countdown`` doubling each retry, jittered, never
            past the holder's remaining lease nor ``retry_max_countdown``; after
            ``max_retries`` the task fails with ``LockContended``) or ``"error"`` (fail with
            ``LockContended``).
        ttl: the run lock's lease in seconds (default: the manager's).
        timeout: seconds to wait for a busy lock before ``on_busy`` applies (default 0).
        auto_extend: renew the run lock while the task runs (default True).
        max_hold: with ``auto_extend``, seconds after which renewal stops.
        once: de-duplicate at enqueue (under ``@app.task(bind=True)`` or
            ``base=LockedTask``; see the module doc).
        once_ttl: the ``once`` lease in seconds (default: the manager's ``max_ttl``): how
            long a queued copy keeps the key before it must have started.
        once_raise: raise :class:`AlreadyQueued` instead of returning the existing result.
        retry_max_countdown: upper bound of the retry countdown in seconds (default 60).
        retry_first_countdown: the first retry's countdown in seconds (default 0.5).
        manager: a ``LockManager``, or a callable returning one (default:
            ``django_redlock.get_manager()``, from the ``REDLOCK`` setting).

    Raises:
        TypeError, ValueError: a bad argument, or a key field that is not an argument of the
            function, at decoration time.
    """
    policy = _make_policy(
        key,
        on_busy=on_busy,
        ttl=ttl,
        timeout=timeout,
        auto_extend=auto_extend,
        max_hold=max_hold,
        once=once,
        once_ttl=once_ttl,
        once_raise=once_raise,
        retry_max_countdown=retry_max_countdown,
        retry_first_countdown=retry_first_countdown,
        manager=manager,
    )
    return _decorator(policy, bound=None)


def _decorator(policy: _Policy, *, bound: bool | None) -> Callable[[F], F]:
    def decorate(function: F) -> F:
        if hasattr(function, _POLICY_ATTR):
            raise TypeError(f"{function.__qualname__} is already a locked task")
        return cast(F, _LockedFunction(function, policy, _Namer(policy.key, function, bound=bound)))

    return decorate


class _LockedFunction:
    """A locked task's function: runs the wrapped function under the run lock.

    A callable object rather than a closure for one reason: ``__set_name__``. Celery builds a
    task class around the function (``type(name, (base,), {"run": function, ...})``), and
    Python calls ``__set_name__`` of every value in that class body, so with ``once=True``
    under ``@app.task(bind=True)`` the decorator gets to give the new class the
    ``apply_async`` that takes the ``once`` lease (:func:`_give_once`) before anything can
    be sent: no ``base=LockedTask`` needed. (With ``bind=False`` Celery wraps the function
    in a ``staticmethod``, which does not pass ``__set_name__`` on; that spelling is refused
    with a ``TypeError`` naming ``bind=True``.)
    """

    def __init__(self, function: Callable[..., Any], policy: _Policy, namer: _Namer) -> None:
        update_wrapper(self, function)
        self.function = function
        self.policy = policy
        self.namer = namer
        setattr(self, _POLICY_ATTR, (policy, namer))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task = get_current_task()
        if task is None:
            raise TypeError(
                f"{self.function.__qualname__} is a locked task's function: call the task "
                "(task(), task.delay()), not the function"
            )
        # bind=True passes the task itself first; it is not part of the key.
        is_bound = bool(args) and args[0] is task
        return _run_locked(
            self.policy, self.namer, task, self.function, args, kwargs, bound=is_bound
        )

    # Celery checks a call's arguments against the signature of a callable's __call__ (its
    # head_from_fun): like a functools.wraps closure, this one takes what the task takes.
    __call__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
            inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
        ]
    )

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        # A method of the task under bind=True, as the plain function was.
        return self if instance is None else MethodType(self, instance)

    def __set_name__(self, owner: type, name: str) -> None:
        if (
            name == "run"
            and self.policy.once
            and issubclass(owner, Task)
            and not issubclass(owner, LockedTask)
        ):
            _give_once(owner)


def current_lease() -> Lease | None:
    """The run lock's lease of the locked task running in this thread, or None.

    ``lease.check()`` raises ``LockLost`` once it may have expired; ``lease.fencing_token``
    is None (the run lock mints none: use ``lock_for(instance)`` for fenced writes).
    """
    task = get_current_task()
    if task is None:
        return None
    lease = getattr(task.request, _LEASE_ATTR, None)
    return lease if isinstance(lease, Lease) else None


# -- the base class ------------------------------------------------------------------------


class LockedTask(Task):  # type: ignore[misc]  # Celery ships no type hints
    """A Celery task base class: ``redlock={...}`` takes :func:`locked_task`'s arguments,
    and ``once=True`` de-duplicates in ``apply_async``.

    Use ``@app.task(bind=True, base=LockedTask, redlock={"key": ...})``, or subclass it with
    a ``redlock`` attribute and a ``run`` method, or stack ``@locked_task(...)`` under
    ``@app.task(base=LockedTask)``.
    """

    redlock: ClassVar[Mapping[str, Any] | None] = None
    #: Its ``apply_async`` takes the ``once`` lease (see ``_has_once``).
    __redlock_once__: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        options = cls.__dict__.get("redlock")
        if options is None:
            return
        if not isinstance(options, Mapping):
            raise TypeError(f"redlock must be a dict of locked_task's arguments, not {options!r}")
        run = cls.__dict__.get("run")
        if run is None:
            raise TypeError(f"{cls.__qualname__}: redlock= needs the task's run in the same class")
        options = dict(options)
        if "key" not in options:
            raise TypeError(f"{cls.__qualname__}: redlock= needs a 'key'")
        policy = _make_policy(options.pop("key"), **options)
        # Celery stores a bind=False function as a staticmethod, a bind=True one (and a
        # method written in a subclass) as a plain function that receives the task first.
        if isinstance(run, staticmethod):
            cls.run = staticmethod(_decorator(policy, bound=False)(run.__func__))
        else:
            cls.run = _decorator(policy, bound=True)(run)

    @property
    def lease(self) -> Lease | None:
        """The run lock's lease of the request running now (see :func:`current_lease`)."""
        lease = getattr(self.request, _LEASE_ATTR, None)
        return lease if isinstance(lease, Lease) else None

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        *more: Any,
        **options: Any,
    ) -> AsyncResult:
        """Celery's ``apply_async``; with ``once=True`` it first takes the ``once`` lease.

        Returns:
            The new task's ``AsyncResult``, or, when a copy with the same key is queued or
            running, that copy's ``AsyncResult`` (nothing is sent).

        Raises:
            AlreadyQueued: a copy is queued or running and ``once_raise=True``.
            QuorumUnreachable: no quorum for the ``once`` lease (nothing is sent: without the
                lease no de-duplication could be promised).
        """
        return _apply_once(self, super().apply_async, args, kwargs, task_id, *more, **options)


#: Set on a task class that takes the ``once`` lease in its ``apply_async``.
_ONCE_ATTR = "__redlock_once__"


def _has_once(task: Task) -> bool:
    return bool(getattr(type(task), _ONCE_ATTR, False))


def _give_once(owner: type) -> None:
    """Give the task class Celery built over a ``once=True`` function (``@app.task(bind=True)``
    over ``@locked_task``) the ``apply_async`` of :class:`LockedTask`. The class is this one
    task's own (Celery makes one per task), so nothing else changes."""
    parent: Any = owner.__mro__[1]

    def apply_async(
        self: Task,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        *more: Any,
        **options: Any,
    ) -> AsyncResult:
        send = MethodType(parent.apply_async, self)
        return _apply_once(self, send, args, kwargs, task_id, *more, **options)

    apply_async.__doc__ = LockedTask.apply_async.__doc__
    apply_async.__qualname__ = f"{owner.__qualname__}.apply_async"
    owner.apply_async = apply_async  # type: ignore[attr-defined]
    setattr(owner, _ONCE_ATTR, True)


def _policy_of(task: Task) -> tuple[_Policy, _Namer] | None:
    """The policy of a locked task (either spelling), or None."""
    found = getattr(task.run, _POLICY_ATTR, None)
    return cast(tuple[_Policy, _Namer] | None, found)


def _apply_once(
    task: Task,
    send: Callable[..., AsyncResult],
    args: Any,
    kwargs: Any,
    task_id: str | None,
    *more: Any,
    **options: Any,
) -> AsyncResult:
    """``apply_async`` of a task with ``once=True``: take the ``once`` lease, then ``send``
    (the class's own ``apply_async``) with its header; see :meth:`LockedTask.apply_async`."""
    found = _policy_of(task)
    if found is None or not found[0].once or task.app.conf.task_always_eager:
        # Eager: Celery runs it here and now, not from a queue (documented bypass).
        return send(args, kwargs, task_id, *more, **options)
    policy, namer = found
    # bind=True: run is a method and the task is not among the arguments.
    bound = inspect.ismethod(task.run)
    task_id = task_id or uuid()
    origin = f"{_ONCE_ORIGIN}{task.name}[{task_id}]"
    if len(origin.encode("utf-8")) > MAX_ORIGIN_BYTES:
        # The origin is how a second enqueue finds this copy's id: it must fit whole.
        raise ValueError(
            f"task_id is too long for once=True: the origin {_ONCE_ORIGIN}<task>[<id>] "
            f"must fit in {MAX_ORIGIN_BYTES} bytes"
        )
    headers = dict(options.pop("headers", None) or {})
    headers.pop(HEADER, None)  # a retry copies the request's headers: never reuse them
    name = ONCE_PREFIX + namer.name(tuple(args or ()), dict(kwargs or {}), bound=bound)
    handle = _retry_hand_off(task, task_id, name)
    if handle is None:
        taken = _take_once(task, policy, name, task_id, origin)
        if isinstance(taken, AsyncResult):
            if not (options.get("group_id") or options.get("chord")):
                return taken
            # In a group or chord Celery has fixed this copy's id and waits for its
            # result: it must be sent. It runs under the run lock like any other copy.
            logger.info(
                "%s[%s] sent although %r is queued as %s: it is part of a group or chord",
                task.name,
                task_id,
                name,
                taken.id,
            )
            return send(args, kwargs, task_id, *more, headers=headers, **options)
        handle = _handle(taken)
    headers[HEADER] = handle
    try:
        return send(args, kwargs, task_id, *more, headers=headers, **options)
    except BaseException:
        # Not sent: free the key at once rather than after once_ttl.
        marker = _lease_from_handle(policy, handle)
        release_quietly(marker, "the once lease", logger)
        raise


def _retry_hand_off(task: Task, task_id: str, name: str) -> dict[str, Any] | None:
    """A retry of the request running now passes its ``once`` lease ``name`` on to the
    retried message (the key stays taken while the retry waits in the queue). A message
    with the same id but another key (``self.replace`` with new arguments) is no retry:
    it takes a lease of its own, and this run's is freed when it ends."""
    request = task.request
    state = getattr(request, _MARKER_ATTR, None)
    if not isinstance(state, _MarkerState) or getattr(request, "id", None) != task_id:
        return None
    if state.marker.name != name:
        return None
    return state.hand_off()


def _take_once(
    task: Task, policy: _Policy, name: str, task_id: str, origin: str
) -> Lease | AsyncResult:
    manager = policy.get_manager()
    ttl = policy.once_ttl if policy.once_ttl is not None else manager.max_ttl
    for _ in range(3):
        try:
            lease = manager.acquire(name, ttl=ttl, blocking=False, origin=origin)
        except LockContended:
            existing = _queued_task_id(manager, name)
            if existing is None:
                continue  # ran out between our try and the read: try again
            if policy.once_raise:
                raise AlreadyQueued(name, existing) from None
            logger.info("%s[%s] not sent: %r is queued as %s", task.name, task_id, name, existing)
            return cast(AsyncResult, task.AsyncResult(existing))
        # The lease now belongs to the message, not to this thread: drop it from the
        # manager's re-entry table, or a second enqueue from this thread would re-enter
        # it instead of finding the key taken.
        manager._forget_owner(lease)
        return lease
    raise AlreadyQueued(name, None)


def _lease_from_handle(policy: _Policy, handle: Mapping[str, Any]) -> Lease:
    manager = policy.get_manager()
    now = manager._clock()
    return Lease(
        manager,
        name=handle["name"],
        key=manager.key(handle["name"]),
        token=handle["token"],
        ttl=handle["ttl"],
        expires_at=now + handle["ttl"],
        acquired_at=now,
    )


def _queued_task_id(manager: LockManager, name: str) -> str | None:
    """The task id in the origin (``celery-once:<task name>[<id>]``) of the ``once`` lease
    ``name``, or None. The id runs from the first ``[`` (task names, dotted Python paths,
    have none; several tasks may share a key) to the last ``]``, so it may hold brackets."""
    owner = manager.holder(name)
    origin = owner.get("origin") if owner else None
    if not isinstance(origin, str) or not origin.startswith(_ONCE_ORIGIN):
        return None
    start = origin.find("[", len(_ONCE_ORIGIN))
    if start < 0 or not origin.endswith("]"):
        return None
    return origin[start + 1 : -1] or None


def _free_once_of_revoked(
    sender: Any = None, request: Any = None, expired: bool = False, **_: Any
) -> None:
    """``task_revoked``: a copy revoked, or expired in the queue, never runs, so nothing
    else would free its ``once`` lease: free it now, or every enqueue with its key would be
    dropped for up to ``once_ttl``. A copy revoked while running (``terminate=True``) is
    freed the same way; its run lock runs out within its ttl."""
    if not isinstance(sender, Task) or not _has_once(sender):
        return
    found = _policy_of(sender)
    handle = _header(request)
    if found is None or not found[0].once or handle is None:
        return
    try:
        marker = _lease_from_handle(found[0], handle)
    except (KeyError, TypeError, ValueError):
        logger.warning("ignoring a malformed %s header", HEADER)
        return
    logger.info(
        "%s[%s] %s: freeing its once lease %r",
        sender.name,
        getattr(request, "id", None),
        "expired" if expired else "revoked",
        marker.name,
    )
    try:
        marker.release()
    except RedlockError as error:  # not held (ran out, or adopted and freed) or no quorum
        logger.info("the once lease %r was not freed: %s", marker.name, error)


task_revoked.connect(_free_once_of_revoked, weak=False)
