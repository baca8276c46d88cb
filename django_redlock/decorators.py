"""``@locked_view`` and :class:`LockedViewMixin`: one request at a time per lock.

``locked_view`` follows Django's own view decorators (``django/views/decorators/cache.py``):
it branches once on whether the view is a coroutine function and wraps it with
``functools.wraps``, so sync and async views, function-based and class-based (through
``method_decorator`` or :class:`LockedViewMixin`) all work.

A busy lock answers **423 Locked**, an unreachable quorum **503 Service Unavailable**, both with
``Retry-After``; pass ``on_locked`` / ``on_unavailable`` to answer otherwise. The lease is
auto-extended while the view runs and released when the view returns. For a streaming
response that means the lock covers producing the response object, not sending its body.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseBase
from django.utils.log import log_response

from django_redlock.default_manager import get_async_manager, get_manager
from django_redlock.exceptions import (
    LeaseReleased,
    LockLost,
    LockNotAcquired,
    QuorumUnreachable,
)
from django_redlock.fencing import release_when_transaction_ends
from django_redlock.procedures.arguments import check_seconds, validate_name
from django_redlock.procedures.options import AcquireOptions
from django_redlock.redlock import Lease

__all__ = ["LockedViewMixin", "locked_view"]

logger = logging.getLogger("django_redlock")

ViewName = str | Callable[..., str] | None
Responder = Callable[[HttpRequest, LockNotAcquired], HttpResponseBase]
F = TypeVar("F", bound=Callable[..., Any])


def _retry_after(seconds: float | None) -> str:
    # Whole seconds, rounded up (RFC 9110), never 0: "retry now" would just spin.
    return str(max(1, math.ceil(seconds or 1)))


def default_on_locked(request: HttpRequest, error: LockNotAcquired) -> HttpResponseBase:
    """423 Locked, with Retry-After = seconds until the holder's lease ends (rounded up)."""
    response = HttpResponse(
        "Locked: another request is working on this; try again shortly.\n",
        status=423,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = _retry_after(error.retry_after)
    return response


def default_on_unavailable(request: HttpRequest, error: LockNotAcquired) -> HttpResponseBase:
    """503 Service Unavailable with Retry-After: the lock service has no quorum.

    Retry-After is the time until enough nodes vote again when they said so (a restart
    quarantine), else 1 s. With ``DEBUG`` the body says what the error says (quarantined,
    for how long, what to do); without it, only that the service is unavailable (the log
    has the rest: see :func:`locked_view`)."""
    if error.quarantined is not None:
        reason = "the lock nodes are quarantined since they started"
    else:
        reason = "the lock service cannot be reached"
    body = f"Service Unavailable: {reason}.\n"
    if settings.DEBUG:
        body += f"{error}\n"
    response = HttpResponse(body, status=503, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = _retry_after(error.retry_after)
    return response


def _resolve_name(
    name: ViewName,
    view: Callable[..., Any],
    request: HttpRequest,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str:
    if name is None:
        return f"{view.__module__}.{view.__qualname__}"
    if callable(name):
        resolved = name(request, *args, **kwargs)
        if not isinstance(resolved, str):
            raise TypeError(
                f"locked_view name callable must return a str, not {type(resolved).__name__}"
            )
    else:
        resolved = _format_name(name, kwargs)
    try:
        return validate_name(resolved)
    except ValueError as error:
        raise _RequestNameError(str(error)) from None


def _format_name(name: str, kwargs: dict[str, Any]) -> str:
    """``name`` formatted over a view's URL kwargs.

    Raises:
        ValueError: it refers to a kwarg the view was not given (a bug of the view's).
    """
    try:
        return name.format(**kwargs)
    except (KeyError, IndexError) as exc:
        raise ValueError(
            f"locked_view name {name!r} refers to {exc}, which is not among the view's keyword "
            f"arguments ({', '.join(kwargs) or 'none'})"
        ) from None


class _RequestNameError(ValueError):
    """The lock name built from a request's values is not a valid name (control characters,
    over 1024 bytes): the client's input, answered with 400, not a server error."""


def _bad_name(error: _RequestNameError) -> HttpResponseBase:
    return HttpResponseBadRequest(
        f"the lock name made from this request is not valid: {error}", content_type="text/plain"
    )


def _view_origin(view: Callable[..., Any]) -> str:
    return f"view:{view.__module__}.{view.__qualname__}"


def _open_transaction() -> str | None:
    """The alias of a database whose transaction is open around the view (with
    ``ATOMIC_REQUESTS``, Django's handler wraps the decorated view in ``atomic``), or None."""
    for alias in connections:
        if connections[alias].in_atomic_block:
            return alias
    return None


def _finish(lease: Lease) -> None:
    """Release after the view; a lease lost meanwhile is logged (and signalled), not raised:
    the response is already made, and turning it into a 500 would hide what was done.

    Inside a transaction (``ATOMIC_REQUESTS``) the view's writes commit only after it
    returns: the lock is kept until that transaction commits or rolls back, as a fenced
    ``lock_for`` does, or the next request would read what is not committed yet and its
    write would overwrite ours (a lost update).
    """
    alias = _open_transaction()
    if alias is not None and not lease.released and not lease.lost:
        release_when_transaction_ends(lease, alias)
        return
    lost, error = _lost_reason(lease), None
    try:
        lease.release()
    except (LockLost, LeaseReleased) as caught:
        error = caught
    _log_finish(lease.name, lost, error)


async def _afinish(lease: Any) -> None:
    """:func:`_finish` for an ``AsyncLease``."""
    lost, error = _lost_reason(lease), None
    try:
        await lease.release()
    except (LockLost, LeaseReleased) as caught:
        error = caught
    _log_finish(lease.name, lost, error)


def _lost_reason(lease: Any) -> str | None:
    """Why ``lease`` (a ``Lease`` or an ``AsyncLease``) was lost, or None: the reason of the
    ``LockLost`` its ``check()`` raises (a lease that has expired is marked lost by it, as
    the release would mark it next)."""
    try:
        lease.check()
    except LockLost as error:
        return error.reason
    except LeaseReleased:
        return None
    return None


def _log_finish(name: str, lost: str | None, error: Exception | None) -> None:
    """Log a lease that was lost while the view ran: found so by the release (``error`` is a
    LockLost), or earlier (``lost``, its reason) and released anyway. A lease already released
    (LeaseReleased) is no news."""
    if isinstance(error, LockLost):
        logger.error("lock %r was lost while the view ran: %s", name, error)
    elif error is None and lost is not None:
        logger.error("lock %r was lost while the view ran: %s", name, lost)


def locked_view(
    name: ViewName = None,
    *,
    ttl: float | None = None,
    timeout: float = 0,
    auto_extend: bool = True,
    on_locked: Responder | None = None,
    on_unavailable: Responder | None = None,
) -> Callable[[F], F]:
    """Let one request at a time run the decorated view (per lock name).

    Args:
        name: a format string over the view's keyword arguments (``"order:{pk}"``), a
            callable ``(request, *args, **kwargs) -> str``, or None for the view's dotted path.
        ttl: lease length in seconds (default ``REDLOCK["TTL"]``).
        timeout: seconds to wait for a busy lock before answering 423 (default 0: no wait).
        auto_extend: renew the lease while the view runs (default True).
        on_locked: ``(request, error) -> response`` for a busy lock (default: 423).
        on_unavailable: ``(request, error) -> response`` when no quorum (default: 503).

    Raises:
        TypeError, ValueError: bad arguments, at decoration time.
    """
    if name is not None and not isinstance(name, str) and not callable(name):
        raise TypeError(f"name must be a str, a callable or None, not {type(name).__name__}")
    check_seconds(timeout, "timeout", allow_zero=True)
    locked = on_locked or default_on_locked
    unavailable = on_unavailable or default_on_unavailable

    def refuse(request: HttpRequest, error: LockNotAcquired) -> HttpResponseBase:
        if isinstance(error, QuorumUnreachable):
            # Always logged, whatever the response says: the operator's cue.
            logger.warning("%s %s: %s", request.method, request.path, error)
            return unavailable(request, error)
        response = locked(request, error)
        if response.status_code == 423:
            # A busy lock is the decorator working as meant, not a client error to warn
            # about: logged here at INFO, so Django's request logger does not add a WARNING
            # line per 423 (178 for one burst, issue 40, item 9).
            log_response(
                "Locked (busy lock): %s",
                request.path,
                response=cast(HttpResponse, response),  # only its status code is read
                request=request,
                level="info",
            )
        return response

    def decorator(view: F) -> F:
        # The acquire's arguments, the same for the sync and the async view.
        options: AcquireOptions = {
            "ttl": ttl,
            "blocking": timeout > 0,
            "timeout": timeout if timeout > 0 else None,
            "auto_extend": auto_extend,
            "origin": _view_origin(view),
        }

        if iscoroutinefunction(view):

            async def _async_view_wrapper(
                request: HttpRequest, *args: Any, **kwargs: Any
            ) -> HttpResponseBase:
                try:
                    lock = _resolve_name(name, view, request, args, kwargs)
                except _RequestNameError as error:
                    return _bad_name(error)
                try:
                    lease = await get_async_manager().acquire(lock, **options)
                except LockNotAcquired as error:
                    return refuse(request, error)
                try:
                    return cast(HttpResponseBase, await view(request, *args, **kwargs))
                finally:
                    await _afinish(lease)

            return cast(F, wraps(view)(_async_view_wrapper))

        def _view_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            try:
                lock = _resolve_name(name, view, request, args, kwargs)
            except _RequestNameError as error:
                return _bad_name(error)
            try:
                lease = get_manager().acquire(lock, **options)
            except LockNotAcquired as error:
                return refuse(request, error)
            try:
                return cast(HttpResponseBase, view(request, *args, **kwargs))
            finally:
                _finish(lease)

        return cast(F, wraps(view)(_view_wrapper))

    return decorator


class LockedViewMixin:
    """Class-based views: one request at a time per :meth:`get_lock_name`.

    Attributes:
        lock_name: a format string over the URL kwargs, or None for the view's dotted path.
        lock_ttl, lock_timeout: as ``locked_view``'s ``ttl`` and ``timeout``.
    """

    lock_name: str | None = None
    lock_ttl: float | None = None
    lock_timeout: float = 0
    view_is_async: bool

    def get_lock_name(self, request: HttpRequest, *args: Any, **kwargs: Any) -> str:
        if self.lock_name is None:
            return f"{type(self).__module__}.{type(self).__qualname__}"
        return _format_name(self.lock_name, kwargs)

    def on_locked(self, request: HttpRequest, error: LockNotAcquired) -> HttpResponseBase:
        return default_on_locked(request, error)

    def on_unavailable(self, request: HttpRequest, error: LockNotAcquired) -> HttpResponseBase:
        return default_on_unavailable(request, error)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        parent = super().dispatch  # type: ignore[misc]
        decorator = locked_view(
            self.get_lock_name,
            ttl=self.lock_ttl,
            timeout=self.lock_timeout,
            on_locked=self.on_locked,
            on_unavailable=self.on_unavailable,
        )
        if getattr(type(self), "view_is_async", False):

            async def call(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                return await parent(request, *args, **kwargs)

        else:

            def call(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                return parent(request, *args, **kwargs)

        call.__module__ = type(self).__module__
        call.__qualname__ = type(self).__qualname__
        return decorator(call)(request, *args, **kwargs)
