"""Fencing tokens minted and checked by the database.

Redlock alone cannot stop a holder whose lease silently expired (a GC pause, a stalled VM)
from writing after the next holder started: the pause can fall between any check and the
write (Kleppmann, "How to do distributed locking", 2016). The remedy is a fencing token that
the storage itself checks. Here the storage is your database:

1. **Claim.** Entering ``lock_for(instance)`` on a :class:`~django_redlock.models.FencedModel`
   bumps the row's ``fencing_token`` in one atomic statement, once the Redlock is held. From
   that moment every earlier holder is fenced off, even before the new holder writes.
2. **Conditional writes.** Inside the block, ``save()`` and ``delete()`` add
   ``AND fencing_token = <token>`` to their statement; zero rows means a newer holder exists
   and :class:`~django_redlock.StaleFencingToken` is raised, with nothing written.

Tokens must never be issued twice, so a mint is committed on its own: in autocommit it is its
own transaction; inside ``atomic()`` it runs on a separate connection to the same database,
so rolling back the caller's transaction does not hand the same number out again.

3. **Held until the writes commit.** A fenced block left inside ``atomic()`` (e.g. with
   ``ATOMIC_REQUESTS``) keeps its lock until that transaction commits or rolls back
   (:func:`release_when_transaction_ends`): the next holder then mints after our writes are
   committed (or gone), instead of waiting on the rows our transaction still locks.

The fence is keyed by the row that carries the token (:func:`fence_model`): a proxy, a
multi-table child and its fenced parent share it, and the lock name follows the same row.
That state (which rows this thread holds, how a row is keyed) lives in
:mod:`django_redlock.fences`, re-exported here: ``models.py`` imports it from there, so the
dependency goes one way (this module reads the ``FencingCounter`` model; the models never
import this module).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, IntegrityError, connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_redlock.exceptions import FencingUnavailable, LeaseReleased, LockLost
from django_redlock.fences import (
    FENCED_FIELD,
    active_token,
    canonical_pk,
    claim_row,
    fence_key,
    fence_model,
    fenced,
    held_rows,
)

if TYPE_CHECKING:
    from django.db.models.options import Options

    from django_redlock.redlock import Lease

__all__ = [
    "FencingUnavailable",
    "active_token",
    "canonical_pk",
    "claim_row",
    "fence_key",
    "fence_model",
    "fenced",
    "held_rows",
    "mint_for_name",
    "mint_for_row",
    "release_when_transaction_ends",
]

logger = logging.getLogger("django_redlock.fencing")

# Seconds a mint on its own connection waits for a row lock before giving up (PostgreSQL):
# the only holder of that lock can be the caller's own open transaction, which would wait
# for us in turn.
_MINT_LOCK_TIMEOUT_MS = 2000


def _column(meta: Options[Any], name: str) -> str:
    field = meta.get_field(name)
    assert isinstance(field, models.Field)
    return str(field.column)


def _durably(using: str, work: Any) -> int:
    """Run ``work(connection)`` in a transaction that commits on its own."""
    connection = connections[using]
    if not connection.in_atomic_block:
        with transaction.atomic(using=using):
            result: int = work(connection)
            return result
    # Inside the caller's transaction: a second connection to the same database commits the
    # mint independently of whatever the caller's transaction does later.
    own = connections.create_connection(using)
    try:
        own.ensure_connection()
        own.set_autocommit(False)
        try:
            with own.cursor() as cursor:
                if own.vendor == "postgresql":
                    cursor.execute(f"SET LOCAL lock_timeout = {_MINT_LOCK_TIMEOUT_MS}")
                elif own.vendor == "sqlite":
                    cursor.execute(f"PRAGMA busy_timeout = {_MINT_LOCK_TIMEOUT_MS}")
            result = work(own)
            own.commit()
            return result
        except BaseException:
            own.rollback()
            raise
    finally:
        own.close()


def mint_for_row(instance: models.Model, name: str) -> int:
    """Bump and return the fencing token of ``instance``'s row, committed on its own.

    Raises:
        FencingUnavailable: the row does not exist (or is not visible outside the caller's
            transaction, e.g. created in it, or inside a ``TestCase``), or it stayed locked.
    """
    # The row that carries the token: for a proxy its concrete model's, for a multi-table
    # child its fenced ancestor's (the child's own table has no such column).
    meta = fence_model(type(instance))._meta
    assert meta.pk is not None
    row_pk = fence_key(instance)[1]  # canonical, and a child made from its pk alone too
    using = instance._state.db or "default"

    def bump(connection: BaseDatabaseWrapper) -> int:
        quote = connection.ops.quote_name
        table = quote(meta.db_table)
        column = quote(_column(meta, FENCED_FIELD))
        assert meta.pk is not None
        pk_column = quote(str(meta.pk.column))
        pk_value = meta.pk.get_db_prep_value(row_pk, connection)
        with connection.cursor() as cursor:
            # First the row: the UPDATE takes its write lock, so mints of one row (ours, the
            # admin's force release) run one at a time from here to the commit.
            cursor.execute(
                f"UPDATE {table} SET {column} = {column} + 1 WHERE {pk_column} = %s",  # noqa: S608 - names quoted by the backend
                [pk_value],
            )
            if cursor.rowcount != 1:
                raise FencingUnavailable(
                    f"cannot mint a fencing token for {name!r}: no committed row "
                    f"{meta.label}(pk={row_pk!r}) is visible to a separate transaction "
                    "(deleted, or created in a transaction that has not committed, e.g. inside "
                    "atomic() or a TestCase; use TransactionTestCase or commit it first)"
                )
            cursor.execute(
                f"SELECT {column} FROM {table} WHERE {pk_column} = %s",  # noqa: S608
                [pk_value],
            )
            (in_row,) = cursor.fetchone()
            # Then the row's counter, which outlives the row: the token is above every token
            # ever minted for this row, even one minted before the row was deleted and
            # created again under the same pk (which starts its column at 0).
            token = _advance_counter(connection, cursor, row_counter_name(meta, row_pk), in_row)
            if token != in_row:
                cursor.execute(
                    f"UPDATE {table} SET {column} = %s WHERE {pk_column} = %s",  # noqa: S608
                    [token, pk_value],
                )
        return token

    last: DatabaseError | None = None
    for _ in range(3):
        try:
            return _durably(using, bump)
        except IntegrityError as exc:  # two first mints of one counter raced: try again
            last = exc
        except DatabaseError as exc:
            raise FencingUnavailable(
                f"cannot mint a fencing token for {name!r}: {exc} ({_locked_hint(using)})"
            ) from exc
    raise FencingUnavailable(f"cannot mint a fencing token for {name!r}: {last}") from last


def row_counter_name(meta: Options[Any], pk: Any) -> str:
    """The :class:`~django_redlock.models.FencingCounter` name of a fenced row (``meta`` of
    the model whose table holds the token, ``pk`` canonical): the row's lock name,
    ``"<app_label>.<model_name>:<pk>"``, cut to the counter's 1,024 characters. A string lock
    of that name (``lock_for(name, fencing=True)``) shares the sequence, and so does a row
    whose cut name collides: both only make tokens larger, never equal."""
    return f"{meta.label_lower}:{pk}"[:1024]


def _advance_counter(connection: BaseDatabaseWrapper, cursor: Any, name: str, at_least: int) -> int:
    """Set the fencing counter ``name`` to ``max(its value + 1, at_least)`` (created at
    ``at_least``) and return it, in the caller's transaction.

    One conditional UPDATE, atomic on every backend (a concurrent one waits for the row and
    re-reads it); the INSERT of a first use can lose a race to another first use, which
    raises ``IntegrityError`` (the caller tries again in a new transaction).
    """
    # Imported here, not at the top: this module is imported while Django loads its apps
    # (decorators.py), before a model can be. models.py imports fences.py, not this module.
    from django_redlock.models import FencingCounter

    meta = FencingCounter._meta
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    name_column = quote(_column(meta, "name"))
    value_column = quote(_column(meta, "value"))
    floor = int(at_least)
    cursor.execute(
        f"UPDATE {table} SET {value_column} = CASE WHEN {value_column} + 1 > %s "  # noqa: S608
        f"THEN {value_column} + 1 ELSE %s END WHERE {name_column} = %s",
        [floor, floor, name],
    )
    if cursor.rowcount == 0:
        cursor.execute(
            f"INSERT INTO {table} ({name_column}, {value_column}) VALUES (%s, %s)",  # noqa: S608
            [name, floor],
        )
    cursor.execute(
        f"SELECT {value_column} FROM {table} WHERE {name_column} = %s",  # noqa: S608
        [name],
    )
    (value,) = cursor.fetchone()
    return int(value)


def _locked_hint(using: str) -> str:
    """What to do when the mint found the row (or, on SQLite, the database) locked."""
    connection = connections[using]
    if connection.vendor == "sqlite" and connection.in_atomic_block:
        return (
            "on SQLite, inside atomic() or ATOMIC_REQUESTS, enter lock_for before the first "
            "query of the transaction: the token commits on a second connection, and SQLite's "
            "single writer cannot commit while your own transaction holds its read lock"
        )
    return "if your own open transaction already wrote this row, enter lock_for before writing it"


def mint_for_name(name: str, using: str = "default") -> int:
    """Bump and return the fencing counter of lock ``name`` (created at 1), committed alone.

    Raises:
        FencingUnavailable: the database refused (e.g. the counter row stayed locked).
    """

    def bump(connection: BaseDatabaseWrapper) -> int:
        with connection.cursor() as cursor:
            return _advance_counter(connection, cursor, name, 1)

    last: DatabaseError | None = None
    for _ in range(3):
        try:
            return _durably(using, bump)
        except DatabaseError as exc:  # IntegrityError on a lost creation race, or a lock
            last = exc
    raise FencingUnavailable(
        f"cannot mint a fencing token for {name!r}: {last} ({_locked_hint(using)})"
    ) from last


class _OnCommit:
    """The ``on_commit`` callback of :func:`release_when_transaction_ends`.

    Its own object so that a finalizer can watch it: Django drops it unrun when the
    transaction (or the savepoint it was registered in) rolls back, or the connection closes.
    """

    __slots__ = ("__weakref__", "release")

    def __init__(self, release: Callable[[], None]) -> None:
        self.release = release

    def __call__(self) -> None:
        self.release()


def release_when_transaction_ends(lease: Lease, using: str) -> None:
    """Release ``lease`` when the open transaction on ``using`` commits or rolls back.

    Writes made under a fenced lock inside ``atomic()`` are not visible, and their rows stay
    locked, until the transaction commits; releasing the lock before that would let the next
    holder in to wait on those rows (and time out) or read what is about to change. So the
    lease is kept, and renewed if auto-extended, until the end of the transaction: the commit
    runs the release as an ``on_commit`` callback; a rollback (or a closed connection) makes
    Django drop that callback unrun, and a finalizer on it releases instead (at once in
    CPython, where the callback is freed as soon as Django drops it).
    """
    done = False

    def release() -> None:
        nonlocal done
        if done:
            return
        done = True
        try:
            lease.release()
        except (LockLost, LeaseReleased) as error:
            # The writes are committed (or rolled back) already: nothing to raise into. A
            # newer holder's mint waited for this transaction, so it was not overtaken.
            logger.warning("releasing %r at the end of its transaction: %s", lease.name, error)

    callback = _OnCommit(release)
    weakref.finalize(callback, release)
    transaction.on_commit(callback, using=using, robust=True)
