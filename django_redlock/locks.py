"""``lock_for`` and ``alock_for``: take the lock of a model instance or a name.

    with lock_for(invoice) as lease:        # name "billing.invoice:42"
        ...
    async with alock_for("reports:daily") as lease:
        ...

The lease is auto-extended by default (renewed every ttl/3 in the background); if a renewal
fails the lease is marked lost, ``lock_lost`` is sent, and leaving the block raises
``LockLost`` (unless the block itself raised), because the work in it may have overlapped
another holder.

A fenced block (a ``FencedModel`` target, or ``fencing=True``) left inside ``atomic()`` keeps
its lock until that transaction commits or rolls back, and taking the same lock again in the
same thread meanwhile re-enters it with the same token.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypedDict

from asgiref.sync import sync_to_async
from django.db import connections, models

from django_redlock.conf import get_settings
from django_redlock.default_manager import get_async_manager, get_manager
from django_redlock.procedures.options import MANAGER_DEFAULT, ManagerDefault
from django_redlock.redlock import BaseLease, Lease

if TYPE_CHECKING:
    from django_redlock.aredlock import AsyncLease

__all__ = ["alock_for", "lock_for", "lock_name"]


def lock_name(target: object) -> str:
    """The lock name for a model instance (``"<app_label>.<model_name>:<pk>"``) or a string.

    The model is the concrete one (a proxy locks the same name as its concrete model); for a
    :class:`~django_redlock.models.FencedModel` it is the model whose row carries the fencing
    token (a multi-table child locks its fenced parent's row).

    Raises:
        ValueError: an unsaved instance (no primary key yet), or a pk its field refuses.
        TypeError: neither a model instance nor a string.
    """
    if isinstance(target, str):
        return target
    if isinstance(target, models.Model):
        if target.pk is None:
            raise ValueError(
                f"target: cannot lock an unsaved {type(target).__name__} (its pk is None); "
                "save it first or lock a name"
            )
        from django_redlock.fencing import canonical_pk, fence_key, fence_model
        from django_redlock.models import FencedModel

        # The pk as its field makes it ("7" and "07" are 7): one row, one lock name.
        if isinstance(target, FencedModel):
            # One row, one lock: a proxy, a multi-table child and the parent all name the
            # row that carries the fencing token, as the fence itself does.
            meta = fence_model(type(target))._meta
            return f"{meta.app_label}.{meta.model_name}:{fence_key(target)[1]}"
        concrete = target._meta.concrete_model
        assert concrete is not None
        meta = concrete._meta  # a proxy locks the same name as its concrete model
        return f"{meta.app_label}.{meta.model_name}:{canonical_pk(concrete, target.pk)}"
    raise TypeError(f"target must be a model instance or a str, not {type(target).__name__}")


def _caller_origin(depth: int) -> str:
    frame = sys._getframe(depth)
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_name}"


class _Options(TypedDict):
    """The acquire arguments a block passes on (as the managers' ``acquire`` takes them)."""

    ttl: float | None
    timeout: float | None
    blocking: bool
    auto_extend: bool
    max_hold: float | None
    origin: str


def _options(
    ttl: float | None,
    timeout: float | ManagerDefault | None,
    blocking: bool,
    auto_extend: bool,
    max_hold: float | None,
    origin: str,
) -> _Options:
    # Not given: REDLOCK["DEFAULT_TIMEOUT"]. None, given: wait for as long as it takes (what
    # the settings page and the outage error's "timeout=None waits for them" promise; it was
    # read as "not given", and a caller who asked to wait gave up with the rest).
    if isinstance(timeout, ManagerDefault):
        timeout = get_settings().timeout
    return {
        "ttl": ttl,
        "timeout": timeout if blocking else None,
        "blocking": blocking,
        "auto_extend": auto_extend,
        "max_hold": max_hold,
        "origin": origin,
    }


def _shared(shared: object, fencing: bool | None) -> bool:
    """Whether a block takes a read lease (``shared``).

    Raises:
        TypeError: ``shared`` is not a bool.
        ValueError: ``shared=True`` with ``fencing=True``: a read lease fences no writes.
    """
    if not isinstance(shared, bool):
        raise TypeError(f"shared must be a bool, not {type(shared).__name__}")
    if shared and fencing:
        raise ValueError("fencing=True needs an exclusive lock: a shared (read) lease mints none")
    return shared


def _mint(
    target: object, name: str, fencing: bool | None, lease: BaseLease
) -> tuple[models.Model | None, str | None]:
    """Mint the fencing token the block runs under, if any.

    Returns the fenced instance (or None) and the database the token lives in (None when
    the block is not fenced).
    """
    from django_redlock.fencing import mint_for_name, mint_for_row
    from django_redlock.models import FencedModel

    if fencing is False:
        return None, None
    # Re-entry by the same owner: the lock was held all along, so its token still fences the
    # row. A new mint would fence off the outer block, and wait on the row lock our own
    # transaction took when it wrote under the outer block.
    token = lease.fencing_token if lease.depth > 1 else None
    if isinstance(target, FencedModel):
        if token is None:
            token = lease.fencing_token = mint_for_row(target, name)
        target.fencing_token = token
        return target, target._state.db or "default"
    if fencing:
        using = target._state.db or "default" if isinstance(target, models.Model) else "default"
        if token is None:
            lease.fencing_token = mint_for_name(name, using)
        return None, using
    return None, None


def _leave(lease: Lease, using: str | None, exc_info: tuple[Any, Any, Any]) -> None:
    """End a ``lock_for`` block: release the lease now, or, when the block was fenced inside
    an open transaction, when that transaction commits or rolls back (its writes are not
    visible, and their rows stay locked, until then)."""
    from django_redlock.fencing import release_when_transaction_ends

    if (
        using is not None
        and connections[using].in_atomic_block
        and not lease.released
        and not lease.lost  # a lost lease raises LockLost now, as outside a transaction
    ):
        release_when_transaction_ends(lease, using)
        return
    lease.__exit__(*exc_info)


@contextmanager
def lock_for(
    target: object,
    *,
    ttl: float | None = None,
    timeout: float | ManagerDefault | None = MANAGER_DEFAULT,
    blocking: bool = True,
    auto_extend: bool = True,
    max_hold: float | None = None,
    fencing: bool | None = None,
    origin: str | None = None,
    shared: bool = False,
) -> Iterator[Lease]:
    """Hold the lock of ``target`` for the ``with`` block; yields the :class:`Lease`.

    A fenced block left inside ``atomic()`` (``ATOMIC_REQUESTS`` included) holds the lock on
    until that transaction commits or rolls back, so the next holder sees our writes
    committed; on SQLite, enter it before the transaction's first query.

    Args:
        target: a saved model instance or a lock name.
        ttl: lease length in seconds (default ``REDLOCK["TTL"]``).
        timeout: seconds to wait for the lock (default ``REDLOCK["DEFAULT_TIMEOUT"]``);
            None waits for as long as it takes (a quorum that is down included).
        blocking: False makes one attempt only.
        auto_extend: renew in the background while the block runs (default True).
        max_hold: with auto_extend, seconds after which renewal stops.
        fencing: None (default) fences a :class:`~django_redlock.models.FencedModel` target
            by its row; True also mints ``lease.fencing_token`` for a name from a per-name
            counter; False never mints.
        origin: where it was taken, for operators (default: the calling ``module:function``).
        shared: take a read lease of the target's read-write lock instead (see
            ``manager.rwlock``): many shared blocks at once, none while an exclusive block
            (``shared=False``, the default) holds the lock, and a waiting exclusive block
            holds back new shared ones. A shared block reads: it mints no fencing token
            (``fencing=True`` is refused).

    Raises:
        LockContended, QuorumUnreachable: the lock could not be taken.
        FencingUnavailable: no fencing token could be minted (the lock is released again).
        LockLost: on leaving the block, when the lease was lost meanwhile.
        ValueError, TypeError: a bad target or argument.
        ImproperlyConfigured: ``REDLOCK`` is invalid.
    """
    from django_redlock.fencing import fenced

    name = lock_name(target)
    options = _options(ttl, timeout, blocking, auto_extend, max_hold, origin or _caller_origin(3))
    if _shared(shared, fencing):
        with get_manager().rwlock(name).read(**options) as lease:
            yield lease
        return
    lease = get_manager().acquire(name, **options)
    try:
        instance, using = _mint(target, name, fencing, lease)
    except BaseException:
        lease.__exit__(*sys.exc_info())
        raise
    try:
        if instance is None:
            yield lease
        else:
            assert lease.fencing_token is not None
            with fenced(instance, lease.fencing_token, name):
                yield lease
    except BaseException:
        _leave(lease, using, sys.exc_info())
        raise
    _leave(lease, using, (None, None, None))


@asynccontextmanager
async def alock_for(
    target: object,
    *,
    ttl: float | None = None,
    timeout: float | ManagerDefault | None = MANAGER_DEFAULT,
    blocking: bool = True,
    auto_extend: bool = True,
    max_hold: float | None = None,
    fencing: bool | None = None,
    origin: str | None = None,
    shared: bool = False,
) -> AsyncIterator[AsyncLease]:
    """The ``async with`` twin of :func:`lock_for` (same arguments, same errors)."""
    from django_redlock.fencing import fenced

    name = lock_name(target)
    options = _options(ttl, timeout, blocking, auto_extend, max_hold, origin or _caller_origin(3))
    if _shared(shared, fencing):
        async with await get_async_manager().rwlock(name).read(**options) as lease:
            yield lease
        return
    # Native asyncio: no thread hop for the lock itself (the database mint, when there is
    # one, runs in Django's sync thread as any ORM call from async code does).
    lease = await get_async_manager().acquire(name, **options)
    try:
        instance, _ = await sync_to_async(_mint, thread_sensitive=True)(
            target, name, fencing, lease
        )
        if instance is None:
            yield lease
        else:
            assert lease.fencing_token is not None
            with fenced(instance, lease.fencing_token, name):
                yield lease
    except BaseException:
        await lease.__aexit__(*sys.exc_info())
        raise
    await lease.__aexit__(None, None, None)
