"""The ``once`` lease: taken at enqueue, handed to the worker in the message, adopted there,
handed on to a retry, freed at the end (all through the core's ``handle()`` and ``adopt``).

The producer acquires ``once:<key>`` (no waiting, ``once_ttl``) and gives it away at once
with ``lease.handle()``: the handle's text goes in the message header :data:`HEADER`. The
worker adopts it (``m.adopt``, one round trip: the keys move to a new token and keep their
expiry) with ``auto_extend=True``, so the core's extender renews it while the task runs and
a killed worker's key runs out within ``once_ttl``. A retry of the task hands it on with
``lease.handle()`` into the retried message; the end of the task releases it. Every adopt
names the same origin, ``celery-once:<task name>[<task id>]``, so a second enqueue reads the
queued copy's id from the lease's holder record whichever process holds it at that moment."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

from celery import Task
from celery.result import AsyncResult
from celery.utils import uuid

from django_redlock.contrib.celery.naming import Namer
from django_redlock.contrib.celery.policy import Policy
from django_redlock.core.handle import LeaseHandle, as_handle
from django_redlock.core.lease import release_quietly
from django_redlock.exceptions import (
    LeaseNotExtended,
    LeaseReleased,
    LockContended,
    LockLost,
    QuorumUnreachable,
    RedlockError,
)
from django_redlock.procedures.arguments import MAX_ORIGIN_BYTES
from django_redlock.redlock import Lease, LockManager

__all__ = [
    "HEADER",
    "ONCE_PREFIX",
    "RUNNING_ATTR",
    "AlreadyQueued",
    "RunningOnce",
    "apply_once",
    "free",
    "handle_in",
    "start_once",
]

logger = logging.getLogger("django_redlock.celery")

#: The message header that carries the ``once`` lease from ``apply_async`` to the worker:
#: ``LeaseHandle.dumps()`` text (in 0.1: a dict ``{name, token, ttl, origin}``).
HEADER = "redlock_once"
#: Prefix of the ``once`` lease's name: ``once:<key>``.
ONCE_PREFIX = "once:"
_ONCE_ORIGIN = "celery-once:"
#: Set on the task's request while a locked task runs: its :class:`RunningOnce`, or None.
RUNNING_ATTR = "redlock_marker"


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


def _origin(task_name: str, task_id: str) -> str:
    """The origin of every lease of one queued copy: how a second enqueue finds its id."""
    return f"{_ONCE_ORIGIN}{task_name}[{task_id}]"


# -- the producer ----------------------------------------------------------------------------


def apply_once(
    task: Task,
    policy: Policy,
    namer: Namer,
    send: Callable[..., AsyncResult],
    args: Any,
    kwargs: Any,
    task_id: str | None,
    *more: Any,
    **options: Any,
) -> AsyncResult:
    """``apply_async`` of a task with ``once=True``: take the ``once`` lease, then ``send``
    (the class's own ``apply_async``) with its handle in the header.

    Returns:
        What ``send`` returns, or the queued copy's ``AsyncResult`` (nothing sent).

    Raises:
        AlreadyQueued: a copy is queued or running and ``policy.once_raise``.
        QuorumUnreachable: no quorum for the ``once`` lease (nothing is sent).
        ValueError: the task id does not fit in the lease's origin.
    """
    # bind=True: run is a method and the task is not among the arguments.
    bound = inspect.ismethod(task.run)
    task_id = task_id or uuid()
    origin = _origin(task.name, task_id)
    if len(origin.encode("utf-8")) > MAX_ORIGIN_BYTES:
        # The origin is how a second enqueue finds this copy's id: it must fit whole.
        raise ValueError(
            f"task_id is too long for once=True: the origin {_ONCE_ORIGIN}<task>[<id>] "
            f"must fit in {MAX_ORIGIN_BYTES} bytes"
        )
    headers = dict(options.pop("headers", None) or {})
    headers.pop(HEADER, None)  # a retry copies the request's headers: never reuse them
    name = ONCE_PREFIX + namer.name(tuple(args or ()), dict(kwargs or {}), bound=bound)
    manager = policy.get_manager()
    running = _running(task, task_id, name)
    if running is not None:
        # A retry of the request running now: it passes its lease on (the key stays taken
        # while the retry waits in the queue), or sends the retry without one when it has
        # none left; never answered with "already queued", which would lose the retry.
        handle = running.hand_off()
    else:
        taken = _take(task, policy, manager, name, task_id, origin)
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
        handle = taken
    if handle is not None:
        headers[HEADER] = handle.dumps()
    try:
        return send(args, kwargs, task_id, *more, headers=headers, **options)
    except BaseException:
        # Not sent: free the key at once rather than after once_ttl.
        if handle is not None:
            free(manager, handle, "not sent")
        raise


def _take(
    task: Task, policy: Policy, manager: LockManager, name: str, task_id: str, origin: str
) -> LeaseHandle | AsyncResult:
    """The new ``once`` lease's handle, or the ``AsyncResult`` of the copy that holds it.

    ``lease.handle()`` gives the lease away in this process at once: it now belongs to the
    message, not to this thread (a second enqueue from this thread must find the key taken,
    not re-enter it), and nothing here renews it.
    """
    ttl = policy.once_ttl if policy.once_ttl is not None else manager.max_ttl
    for _ in range(3):
        try:
            lease = manager.acquire(name, ttl=ttl, blocking=False, origin=origin)
        except LockContended:
            pass
        else:
            if lease.depth == 1:
                return lease.handle()
            # This thread holds the key already: it runs the copy that adopted it (an adopted
            # lease is this thread's, and the core counts an acquire of it as a re-entry).
            # Undo the re-entry only (no round trip; the keys stay that copy's) and answer as
            # for any copy queued or running.
            lease.release()
        existing = _queued_task_id(manager, name)
        if existing is None:
            continue  # ran out between our try and the read: try again
        if policy.once_raise:
            raise AlreadyQueued(name, existing)
        logger.info("%s[%s] not sent: %r is queued as %s", task.name, task_id, name, existing)
        return cast(AsyncResult, task.AsyncResult(existing))
    raise AlreadyQueued(name, None)


def _queued_task_id(manager: LockManager, name: str) -> str | None:
    """The task id in the origin (``celery-once:<task name>[<id>]``) of the ``once`` lease
    ``name``, or None. The id runs from the first ``[`` (task names, dotted Python paths,
    have none; several tasks may share a key) to the last ``]``, so it may hold brackets."""
    owner = manager.holder(name)
    origin = owner.get("origin") if owner else None
    if not isinstance(origin, str) or not origin.startswith(_ONCE_ORIGIN):
        return None
    begin = origin.find("[", len(_ONCE_ORIGIN))
    if begin < 0 or not origin.endswith("]"):
        return None
    return origin[begin + 1 : -1] or None


# -- the message -----------------------------------------------------------------------------


def handle_in(manager: LockManager, request: Any) -> LeaseHandle | None:
    """The ``once`` lease's handle in a task request's header (Celery's Context), or None
    (no header, or a malformed one: logged).

    Reads the header of this version (``LeaseHandle.dumps()`` text) and the one of the
    version 0.1 (a dict ``{name, token, ttl, origin}``, the token of the lease as
    the producer took it), so messages queued before an upgrade keep their key.
    """
    header = getattr(request, HEADER, None)
    if header is None:
        header = (getattr(request, "headers", None) or {}).get(HEADER)
    if header is None:
        return None
    try:
        if isinstance(header, Mapping):
            name = str(header["name"])
            header = LeaseHandle(
                name=name,
                key=manager.key(name),
                token=str(header["token"]),
                ttl=float(header["ttl"]),
            )
        return as_handle(header)  # checks the fields, as adopt would
    except (KeyError, TypeError, ValueError):
        pass
    logger.warning("ignoring a malformed %s header", HEADER)
    return None


def free(manager: LockManager, handle: LeaseHandle, why: str) -> bool:
    """Free the ``once`` lease ``handle`` gives (adopt it, then release it): True when freed.
    Best effort: a lease that ran out, or that another process adopted (a worker running
    the copy), or nodes that do not answer, are logged, not raised."""
    try:
        manager.adopt(handle, origin=None).release()
    except (RedlockError, TypeError, ValueError) as error:
        logger.info("the once lease %r was not freed (%s): %s", handle.name, why, error)
        return False
    return True


# -- the worker ------------------------------------------------------------------------------


class RunningOnce:
    """The ``once`` lease of the task running now: adopted when it started (renewed by the
    core's extender), or still the message's handle when it could not be adopted for lack
    of a quorum, or neither (it had run out).

    Attributes:
        name: the lease's name (``once:<key>``).
    """

    def __init__(
        self,
        manager: LockManager,
        name: str,
        lease: Lease | None,
        handle: LeaseHandle | None,
        origin: str,
    ) -> None:
        self.manager = manager
        self.handle_origin = origin
        self.name = name
        self.lease = lease
        # Set only while the lease is not adopted: the nodes did not answer, and the keys
        # still hold the handle's token (a failed adopt hands them back).
        self.handle = handle
        self.handed_off = False
        self.handed: LeaseHandle | None = None

    def hand_off(self) -> LeaseHandle | None:
        """Give the lease to a retry of this task: its handle for the retried message, or
        None when there is nothing left to give (it ran out or was lost).

        An adopted lease is extended once more first (a full ``once_ttl`` ahead for the
        retried message; best effort) and handed off (renewal here stops). A lease never
        adopted (no quorum at the start) is tried once more, else its handle goes on as it
        came: if the nodes were only unreachable the key stays this message's instead of
        needing a new lease while they are down.
        """
        if self.handed_off:
            return self.handed  # a second retry message of the same run: the same lease
        self.handed_off = True
        self.handed = self._give()
        return self.handed

    def _give(self) -> LeaseHandle | None:
        lease = self.lease
        if lease is None and self.handle is not None:
            try:
                lease = self.manager.adopt(self.handle, origin=self.handle_origin)
            except QuorumUnreachable as error:
                logger.info(
                    "handing the once lease %r on to a retry unconfirmed: %s", self.name, error
                )
                return self.handle
            except LockLost as error:
                logger.warning(
                    "the once lease %r is not handed on to a retry: %s", self.name, error
                )
                return None
        if lease is None:
            return None
        try:
            lease.extend()
        except (LockLost, LeaseReleased, LeaseNotExtended) as error:
            logger.info("handing the once lease %r on to a retry unrenewed: %s", self.name, error)
        try:
            return lease.handle()
        except (LockLost, LeaseReleased) as error:
            logger.warning("the once lease %r is not handed on to a retry: %s", self.name, error)
            return None

    def finish(self) -> None:
        """The task ended (not in a retry): free the lease, best effort."""
        if self.handed_off:
            return
        if self.lease is not None:
            if not self.lease.released:
                release_quietly(self.lease, "the once lease", logger)
        elif self.handle is not None:
            free(self.manager, self.handle, "the task ended")


def start_once(task: Task, manager: LockManager, request: Any) -> RunningOnce | None:
    """Adopt the ``once`` lease the message carries, when the task starts; None when it
    carries none.

    Adopting proves the lease is still this message's (a quorum held its token) and moves
    it to this process, renewed from now on by the core's extender (``auto_extend``): a
    worker killed meanwhile stops renewing it, and the key runs out within ``once_ttl``.
    A lease that ran out in the queue, or that too few nodes confirmed, is logged; the task
    runs anyway (the run lock keeps runs apart).
    """
    handle = handle_in(manager, request)
    if handle is None:
        return None
    task_id = getattr(request, "id", None)
    origin = _origin(task.name, task_id or "direct")
    problem: BaseException | None = None
    lease: Lease | None = None
    kept: LeaseHandle | None = None
    try:
        lease = manager.adopt(handle, auto_extend=True, origin=origin)
    except QuorumUnreachable as error:
        # The keys were handed back to the handle's token: it can be adopted later, and a
        # retry hands it on instead of needing a new lease while the nodes are down.
        problem, kept = error, handle
    except LockLost as error:
        problem = error
    except (TypeError, ValueError) as error:  # e.g. a handle for another key prefix
        logger.warning("ignoring the %s header of task %s: %s", HEADER, task_id, error)
        return None
    if lease is not None and lease.validity < lease.ttl / 2:
        # The adopted lease keeps what was left of the queued one (the extender renews it
        # within that, at a third of it). One extend now gives a copy that waited most of
        # once_ttl in the queue the whole ttl at its start, as an enqueue gives it.
        try:
            lease.extend()
        except LeaseNotExtended as error:
            logger.info("the once lease %r was not renewed at the start: %s", handle.name, error)
        except (LockLost, LeaseReleased) as error:
            problem, lease = error, None
    if problem is not None:
        logger.warning(
            "the once lease %r could not be renewed when task %s started (%s): it ran out in "
            "the queue (raise once_ttl above the time tasks wait there) or too few nodes "
            "answered",
            handle.name,
            task_id,
            problem,
        )
    return RunningOnce(manager, handle.name, lease, kept, origin)


def _running(task: Task, task_id: str, name: str) -> RunningOnce | None:
    """The ``once`` lease ``name`` of the request running now when the message about to be
    sent (``task_id``) is its retry, else None. A message with the same id but another key
    (``self.replace`` with new arguments) is no retry: it takes a lease of its own, and this
    run's is freed when it ends."""
    request = task.request
    running = getattr(request, RUNNING_ATTR, None)
    if not isinstance(running, RunningOnce) or getattr(request, "id", None) != task_id:
        return None
    return running if running.name == name else None
