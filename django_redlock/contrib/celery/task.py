"""The two spellings of a locked task, :func:`locked_task` and :class:`LockedTask`, and the
run of one: the ``once`` lease adopted, the function under the run lock."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from functools import update_wrapper
from types import MethodType
from typing import Any, ClassVar, TypeVar, cast

from celery import Task
from celery._state import get_current_task
from celery.result import AsyncResult

from django_redlock.contrib.celery import run_lock
from django_redlock.contrib.celery.naming import Key, Namer
from django_redlock.contrib.celery.once import RUNNING_ATTR, RunningOnce, apply_once, start_once
from django_redlock.contrib.celery.policy import (
    ONCE_ATTR,
    POLICY_ATTR,
    ManagerOption,
    OnBusy,
    Policy,
    has_once,
    make_policy,
    policy_of,
    task_like,
)
from django_redlock.core.lease import release_quietly
from django_redlock.redlock import Lease

__all__ = ["LockedTask", "locked_task"]

logger = logging.getLogger("django_redlock.celery")

F = TypeVar("F", bound=Callable[..., Any])


def _run_locked(
    policy: Policy,
    namer: Namer,
    task: Task,
    call: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    bound: bool,
) -> Any:
    """Run ``call`` under the run lock (and the ``once`` lease, if handed over).

    Raises:
        TypeError: ``once=True`` on a task class without the ``once`` ``apply_async``.
        LockLost: the run lock was lost while the function ran.
        Whatever :func:`~django_redlock.contrib.celery.run_lock.acquire` and the function
        raise.
    """
    request = task.request
    call_args = args[1:] if bound else args
    name = namer.name(call_args, kwargs, bound=bound)
    manager = policy.get_manager()
    running: RunningOnce | None = None
    if policy.once:
        if not has_once(task):
            # The task's class was not seen when it was built (see _LockedFunction): a
            # spelling or a Celery version this module does not know. Its copies were sent
            # without the once lease, so refuse rather than run them as if de-duplicated.
            raise TypeError(
                f"{task.name}: once=True works in apply_async, which this task's class "
                "lacks: declare the task with @app.task over @locked_task(..., once=True), "
                "or with base=LockedTask"
            )
        running = start_once(task, manager, request)
    setattr(request, RUNNING_ATTR, running)
    try:
        lease = run_lock.acquire(policy, task, manager, name, run_lock.origin(task, request))
        if lease is None:
            return None
        setattr(request, run_lock.LEASE_ATTR, lease)
        try:
            result = call(*args, **kwargs)
        except BaseException:
            # A failure or a retry (celery.exceptions.Retry): the lock is never held across
            # a retry, and the task's own error is what the caller must see.
            release_quietly(lease, "the task lock", logger)
            raise
        finally:
            setattr(request, run_lock.LEASE_ATTR, None)
        # Raises LockLost when the lease was lost while the task ran: its work may have
        # overlapped another run (fenced writes were refused at the time).
        lease.__exit__(None, None, None)
        return result
    finally:
        setattr(request, RUNNING_ATTR, None)
        if running is not None:
            running.finish()


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
    """Decorate a Celery task's function (under ``@app.task`` or ``@shared_task``, next to
    the ``def``; or a class-based task's ``run``): one run at a time per key.

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
        once: de-duplicate at enqueue, in the task's ``apply_async`` (any spelling above,
            with or without ``bind=True``, or ``base=LockedTask``; see the module doc).
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
        TypeError: at declaration, with the spelling that works: the decorator placed over
            ``@app.task``/``@shared_task`` (it got a task), applied to a class, or written
            without its arguments (``@locked_task`` bare: the function became the key).
    """
    policy = make_policy(
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
    return _Decorator(policy, bound=None)


class _ClassHook(str):
    """A locked function's ``__module__``: the module's name, that also sees the task class
    Celery builds around the function.

    Celery builds that class with ``type(name, (base,), {..., "run": run, "__module__":
    fun.__module__, ...})``, and Python calls ``__set_name__`` of every value of that
    namespace as the class is created. ``run`` is the function itself only under
    ``bind=True`` (Celery wraps it in a ``staticmethod`` otherwise, which passes nothing on),
    but ``__module__`` is there whatever the task's options: so the decorator sees the class
    before anything can be sent, and gives it the ``once`` ``apply_async`` under
    ``@app.task`` and ``@shared_task`` alike. The class then gets a plain ``str`` back.
    """

    on_class: Callable[[type], None]

    def __new__(cls, module: str, on_class: Callable[[type], None]) -> _ClassHook:
        hook = super().__new__(cls, module)
        hook.on_class = on_class
        return hook

    def __set_name__(self, owner: type, name: str) -> None:
        if name == "__module__" and owner.__dict__.get("__module__") is self:
            owner.__module__ = str(self)
        self.on_class(owner)

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (str(self),))  # pickled (say, in a traceback's frame) as the plain name


def _run_of(owner: type) -> Any:
    """The function a task class runs (``run`` in its own namespace; a ``bind=False``
    ``staticmethod`` unwrapped), or None."""
    run = owner.__dict__.get("run")
    return run.__func__ if isinstance(run, staticmethod) else run


class _Decorator:
    """What ``locked_task(...)`` returns: applied to a task's function, a locked function.

    Refuses, with a ``TypeError`` that shows the spelling that works, whatever is not a
    task's function: a task (``@locked_task`` over ``@app.task``), a task proxy, a class.
    Handed to ``@app.task`` itself (a bare ``@locked_task``, without arguments: the function
    became the key), it refuses when Celery reads its ``__name__``, which Celery does when
    the task is declared (``@app.task``) or its class built (``@shared_task``).
    """

    def __init__(self, policy: Policy, *, bound: bool | None) -> None:
        self.policy = policy
        self.bound = bound

    def __call__(self, function: F) -> F:
        what = task_like(function)
        if what is not None and isinstance(function, type):
            raise TypeError(
                f"locked_task(...) decorates a task's function, not {what}: for a class-based "
                "task, decorate its run method with @locked_task(...), or subclass LockedTask "
                "with redlock = {'key': ...} and a run method"
            )
        if what is not None:
            raise TypeError(
                f"locked_task(...) decorates a task's function, not {what}: place it under "
                f"@app.task (or @shared_task), next to the def:\n\n{_spelling(self.policy)}"
            )
        if not callable(function):
            raise TypeError(f"locked_task(...) decorates a function, not {function!r}")
        if hasattr(function, POLICY_ATTR):
            raise TypeError(
                f"{function.__qualname__} is already a locked task: give its options once"
            )
        namer = Namer(self.policy.key, function, bound=self.bound)
        return cast(F, _LockedFunction(function, self.policy, namer))

    @property
    def __name__(self) -> str:
        # Only Celery asks a decorator for its name: when @app.task got it as the function.
        key = self.policy.key
        named = getattr(key, "__qualname__", None) if callable(key) else None
        function = getattr(key, "__name__", None) if named else None
        raise TypeError(
            "@locked_task needs its arguments"
            + (f" (here {named} became the lock's key)" if named else "")
            + f": call it with the key, under @app.task:\n\n{_spelling(self.policy, function)}"
        )


def _spelling(policy: Policy, function: str | None = None) -> str:
    """The decorator order that works, for error messages."""
    key = policy.key if isinstance(policy.key, str) else "job:{job_id}"
    once = ", once=True" if policy.once else ""
    return (
        "    @app.task(bind=True)\n"
        f"    @locked_task(key={key!r}{once})\n"
        f"    def {function or 'your_task'}(self, ...): ..."
    )


class _LockedFunction:
    """A locked task's function: runs the wrapped function under the run lock.

    A callable object rather than a closure so that it sees the task class it runs in, and
    with ``once=True`` gives that class the ``apply_async`` that takes the ``once`` lease
    (:func:`_give_once`) before anything can be sent: no ``base=LockedTask`` needed. The
    class Celery builds around it (``@app.task``, ``@shared_task``, with or without
    ``bind=True``) is seen through its ``__module__`` (:class:`_ClassHook`); a class-based
    task whose ``run`` it is, through its own ``__set_name__``.
    """

    def __init__(self, function: Callable[..., Any], policy: Policy, namer: Namer) -> None:
        update_wrapper(self, function)
        self.__module__ = _ClassHook(function.__module__, self._on_class)
        self.function = function
        self.policy = policy
        self.namer = namer
        setattr(self, POLICY_ATTR, (policy, namer))

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
        if name == "run":
            self._on_class(owner)

    def _on_class(self, owner: type) -> None:
        """``owner`` was just created with this function in its namespace: when it is a task
        class that runs it, with ``once=True``, give it the ``once`` ``apply_async`` (unless
        it has it already, as ``LockedTask`` and its subclasses do)."""
        if not issubclass(owner, Task):
            return
        # Celery's pydantic=True wraps the function first (functools.wraps copies the
        # policy): whose run it is, is told by the policy, not by identity.
        run = _run_of(owner)
        if getattr(run, POLICY_ATTR, None) is not getattr(self, POLICY_ATTR):
            return
        if self.policy.once and not getattr(owner, ONCE_ATTR, False):
            _give_once(owner)


def _apply(
    task: Task,
    send: Callable[..., AsyncResult],
    args: Any,
    kwargs: Any,
    task_id: str | None,
    *more: Any,
    **options: Any,
) -> AsyncResult:
    """``apply_async`` of a task class with the ``once`` ``apply_async``: with ``once=True``
    it goes through :func:`~django_redlock.contrib.celery.once.apply_once`, else straight to
    ``send`` (the class's own ``apply_async``)."""
    found = policy_of(task)
    if found is None or not found[0].once or task.app.conf.task_always_eager:
        # Eager: Celery runs it here and now, not from a queue (documented bypass).
        return send(args, kwargs, task_id, *more, **options)
    policy, namer = found
    return apply_once(task, policy, namer, send, args, kwargs, task_id, *more, **options)


# -- the base class ------------------------------------------------------------------------


class LockedTask(Task):  # type: ignore[misc]  # Celery ships no type hints
    """A Celery task base class: ``redlock={...}`` takes :func:`locked_task`'s arguments,
    and ``once=True`` de-duplicates in ``apply_async``.

    Use ``@app.task(bind=True, base=LockedTask, redlock={"key": ...})``, or subclass it with
    a ``redlock`` attribute and a ``run`` method, or stack ``@locked_task(...)`` under
    ``@app.task(base=LockedTask)``.
    """

    redlock: ClassVar[Mapping[str, Any] | None] = None
    #: Its ``apply_async`` takes the ``once`` lease (see ``policy.has_once``).
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
        policy = make_policy(options.pop("key"), **options)
        # Celery stores a bind=False function as a staticmethod, a bind=True one (and a
        # method written in a subclass) as a plain function that receives the task first.
        if isinstance(run, staticmethod):
            cls.run = staticmethod(_Decorator(policy, bound=False)(run.__func__))
        else:
            cls.run = _Decorator(policy, bound=True)(run)

    @property
    def lease(self) -> Lease | None:
        """The run lock's lease of the request running now (see :func:`current_lease`)."""
        return run_lock.lease_of(self.request)

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
        return _apply(self, super().apply_async, args, kwargs, task_id, *more, **options)


def _give_once(owner: type) -> None:
    """Give the task class that runs a ``once=True`` function (``@app.task`` or
    ``@shared_task`` over ``@locked_task``, or a class-based task whose ``run`` it is) the
    ``apply_async`` of :class:`LockedTask`. The class is this one task's own (Celery makes
    one per task and app), so nothing else changes; an ``apply_async`` written in that class
    is kept, as what sends."""
    own = owner.__dict__.get("apply_async")

    def apply_async(
        self: Task,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        *more: Any,
        **options: Any,
    ) -> AsyncResult:
        send = (
            own.__get__(self, owner)
            if own is not None
            else super(cast(Any, owner), self).apply_async
        )
        return _apply(self, send, args, kwargs, task_id, *more, **options)

    apply_async.__doc__ = LockedTask.apply_async.__doc__
    apply_async.__qualname__ = f"{owner.__qualname__}.apply_async"
    owner.apply_async = apply_async  # type: ignore[attr-defined]
    setattr(owner, ONCE_ATTR, True)
