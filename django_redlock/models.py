"""``FencedModel``: rows whose writes are fenced by a database-minted token.

    class Seat(FencedModel):
        ...

    with lock_for(seat) as lease:      # mints seat's next fencing token, in the database
        seat.holder = customer
        seat.save()                    # UPDATE ... WHERE id = %s AND fencing_token = <token>

Outside any ``lock_for`` block, saves and deletes are plain Django ones (they never change
the token); set ``fencing_required = True`` on the model to refuse them instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, TypeVar

from django.core.checks import CheckMessage, Warning
from django.db import models, transaction
from django.db.models.functions import Greatest

from django_redlock.exceptions import StaleFencingToken, UnfencedWrite
from django_redlock.fences import active_token, claim_row, fence_key, fence_model, held_rows

__all__ = ["ActiveLock", "FencedManager", "FencedModel", "FencedQuerySet", "FencingCounter"]

_TOKEN = "fencing_token"

_M = TypeVar("_M", bound=models.Model)


def _stale(name: str, token: int, model: type[models.Model], pk: Any) -> StaleFencingToken:
    detail = f"{model._meta.label}(pk={pk!r}) now has a newer fencing token or is gone"
    return StaleFencingToken(name, token, detail)


class FencedQuerySet(models.QuerySet[_M]):
    """The queryset of a :class:`FencedModel`: bulk writes honour the fence too.

    Inside ``lock_for(row)``, ``update()``, ``bulk_update()`` and ``delete()`` first claim
    every row this thread or task holds (one conditional ``UPDATE`` each, which also locks the
    row until the write commits), in the same transaction as the write:

    - a held row the queryset matches whose token moved on raises
      :class:`~django_redlock.StaleFencingToken`, and nothing at all is written;
    - a held row that moved on and is not matched is left out of the write, so a stale holder
      can never touch it;
    - rows not held here are written as outside any lock: plainly, or refused with
      :class:`~django_redlock.UnfencedWrite` when the model sets ``fencing_required``.

    Outside any ``lock_for`` of the model they are plain Django (refused when
    ``fencing_required``). ``bulk_create(update_conflicts=True)`` overwrites existing rows
    without any condition, so it is refused inside a fenced block and for
    ``fencing_required`` models.
    """

    def update(self, **kwargs: Any) -> int:
        if _TOKEN in kwargs:
            # Never lowered: that would hand a token out twice (the next mint repeating an
            # old one lets that old holder's writes match again). Raising it is a mint.
            value = kwargs[_TOKEN]
            if not hasattr(value, "resolve_expression"):
                value = models.Value(value)
            kwargs[_TOKEN] = Greatest(models.F(_TOKEN), value)
        # Django's own update()/delete() on the chosen rows: never this class's again.
        count: int = self._fenced_write(
            "update", lambda rows: models.QuerySet.update(rows, **kwargs)
        )
        return count

    def delete(self) -> tuple[int, dict[str, int]]:
        deleted: tuple[int, dict[str, int]] = self._fenced_write("delete", models.QuerySet.delete)
        return deleted

    def bulk_update(
        self, objs: Iterable[_M], fields: Iterable[str], batch_size: int | None = None
    ) -> int:
        # Goes through update() above, once per batch, inside one transaction.
        fields = list(fields)
        if _TOKEN in fields:
            raise ValueError(
                f"fields: {_TOKEN!r} is minted by lock_for and cannot be bulk-updated from "
                "instances (an old in-memory value would undo a newer holder's mint)"
            )
        return super().bulk_update(objs, fields, batch_size=batch_size)

    def bulk_create(self, objs: Iterable[_M], *args: Any, **kwargs: Any) -> list[_M]:
        if kwargs.get("update_conflicts"):
            label = self.model._meta.label
            if held_rows(self.model):
                raise UnfencedWrite(
                    f"bulk_create(update_conflicts=True) on {label} inside lock_for: an upsert "
                    "cannot be made conditional on the fencing token; save() the held rows"
                )
            self._refuse_unfenced("bulk_create(update_conflicts=True)")
        return super().bulk_create(objs, *args, **kwargs)

    def _refuse_unfenced(self, operation: str) -> None:
        if getattr(self.model, "fencing_required", False):
            raise UnfencedWrite(
                f"{self.model._meta.label} requires fencing: {operation} outside "
                "lock_for(instance) is refused"
            )

    def _fenced_write(self, operation: str, write: Any) -> Any:
        held = held_rows(self.model)
        if not held:
            self._refuse_unfenced(operation)
            return write(self)
        lookup = f"{_token_pk_name(self.model)}__in"
        with transaction.atomic(using=self.db, savepoint=False):
            lost = self._claim(held)
            if getattr(self.model, "fencing_required", False) and (
                self.exclude(**{lookup: list(held)}).exists()
            ):
                raise UnfencedWrite(
                    f"{self.model._meta.label} requires fencing: this {operation} also matches "
                    "rows not held by this lock_for block"
                )
            rows = self.exclude(**{lookup: lost}) if lost else self
            return write(rows)

    def _claim(self, held: dict[Any, tuple[int, str]]) -> list[Any]:
        """Claim the held rows (pk order, so two claimers cannot deadlock); return those
        that moved on and that this queryset does not match. Raises StaleFencingToken for
        one it does match."""
        lost = []
        pk_name = _token_pk_name(self.model)
        for pk in sorted(held):
            token, name = held[pk]
            if claim_row(self.model, pk, token, self.db):
                continue
            if self.filter(**{pk_name: pk}).exists():
                raise _stale(name, token, self.model, pk)
            lost.append(pk)
        return lost


def _token_pk_name(model: type[models.Model]) -> str:
    """The lookup on ``model`` that reaches the pk of its token row (``"pk"``, or the token
    model's pk field name for a multi-table child)."""
    owner = fence_model(model)
    if owner is model._meta.concrete_model:
        return "pk"
    assert owner._meta.pk is not None
    return owner._meta.pk.name


class FencedManager(models.Manager[_M]):
    """The default manager of a :class:`FencedModel`; returns :class:`FencedQuerySet`.

    A custom manager keeps bulk writes fenced when it derives from this class, or is made
    with ``FencedQuerySet.as_manager()`` / ``Manager.from_queryset(FencedQuerySet)``.
    """

    def get_queryset(self) -> FencedQuerySet[_M]:
        return FencedQuerySet(self.model, using=self._db, hints=getattr(self, "_hints", None))


class FencedModel(models.Model):
    """Abstract base: adds ``fencing_token`` and makes writes under ``lock_for`` conditional.

    The token lives in the row of the model that inherits from this class; proxies of that
    model and its multi-table children share it (and the lock name), so a write through any
    of them is fenced alike.

    Attributes:
        fencing_required: when True, a save or delete outside ``lock_for(instance)`` raises
            :class:`~django_redlock.UnfencedWrite` (creating new rows is always allowed).
    """

    fencing_token = models.BigIntegerField(
        default=0,
        editable=False,
        help_text="Bumped in the database each time lock_for() takes this row.",
    )

    fencing_required: ClassVar[bool] = False

    objects = FencedManager()

    class Meta:
        abstract = True

    @classmethod
    def check(cls, **kwargs: Any) -> list[CheckMessage]:
        """Django's model checks, plus W010: the default manager must be a fenced one, or
        ``update()``/``bulk_update()``/``delete()`` on its querysets bypass the fence."""
        messages = super().check(**kwargs)
        if cls._meta.abstract or cls._meta.swapped:
            return messages
        queryset: object = cls._default_manager.get_queryset()
        if not isinstance(queryset, FencedQuerySet):
            messages.append(
                Warning(
                    f"{cls._meta.label}'s default manager returns {type(queryset).__name__}, "
                    "so its bulk writes (update, bulk_update, delete) are not fenced",
                    hint="Derive the manager from django_redlock.models.FencedManager, or make "
                    "it with FencedQuerySet.as_manager() / Manager.from_queryset(FencedQuerySet).",
                    obj=cls,
                    id="django_redlock.W010",
                )
            )
        return messages

    def _do_update(  # type: ignore[override]  # Django's signature varies between versions
        self,
        base_qs: models.QuerySet[Any],
        using: str,
        pk_val: Any,
        values: list[tuple[Any, Any, Any]],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        # Django's answer is passed on as it is: a bool up to 5.2, the list of the updated
        # rows' returned values from 6.0 (empty when no row matched), which save() indexes.
        fence = active_token(self)
        if fence is None:
            if self.fencing_required:
                raise UnfencedWrite(
                    f"{self._meta.label}(pk={pk_val!r}) requires fencing: save it inside "
                    "lock_for(instance)"
                )
            # Never write the token outside a lock: a stale in-memory value must not undo a
            # mint (that would let an evicted holder's token match again).
            values = [value for value in values if value[0].attname != _TOKEN]
            return super()._do_update(base_qs, using, pk_val, values, *args, **kwargs)
        token, name = fence
        self.fencing_token = token
        owner = fence_model(type(self))
        if base_qs.model._meta.concrete_model is owner:
            # The table that carries the token: one conditional UPDATE, which always sets the
            # token (even when update_fields names none of this table's fields), so the check
            # is never skipped and the row stays locked until the save commits.
            field = owner._meta.get_field(_TOKEN)
            values = [(f, m, v) for f, m, v in values if f.attname != _TOKEN]
            values.append((field, None, token))
            updated = super()._do_update(
                base_qs.filter(fencing_token=token), using, pk_val, values, *args, **kwargs
            )
            if not updated:
                raise _stale(name, token, owner, pk_val)
            return updated
        # Another table of a multi-table model (Django saves ancestors first, but the token
        # may sit below a plain ancestor): claim the token row in the same transaction first.
        row_pk = fence_key(self)[1]
        with transaction.atomic(using=using, savepoint=False):
            if not claim_row(owner, row_pk, token, using):
                raise _stale(name, token, owner, row_pk)
            return super()._do_update(base_qs, using, pk_val, values, *args, **kwargs)

    def _do_insert(self, manager: Any, using: str, *args: Any, **kwargs: Any) -> Any:
        fence = active_token(self)
        owner = fence_model(type(self))
        if fence is not None and manager.model._meta.concrete_model is owner:
            # Held rows exist when the lock is taken (the mint needs the row), so an INSERT
            # of one into the table that carries the token (update_or_create, get_or_create)
            # means it was deleted meanwhile, by a newer holder or by this one: a fenced
            # holder never re-creates it (docs/guide/fencing.md: a row deleted meanwhile is never
            # re-created). A child's own table is another matter: making a held row a
            # multi-table child inserts only there, after its fenced parent's update.
            token, name = fence
            raise _stale(name, token, owner, fence_key(self)[1])
        return super()._do_insert(manager, using, *args, **kwargs)  # type: ignore[misc]

    def delete(self, using: Any = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        fence = active_token(self)
        if fence is None:
            if self.fencing_required:
                raise UnfencedWrite(
                    f"{self._meta.label}(pk={self.pk!r}) requires fencing: delete it inside "
                    "lock_for(instance)"
                )
            return super().delete(using=using, keep_parents=keep_parents)
        token, name = fence
        db = using or self._state.db or "default"
        owner = fence_model(type(self))
        row_pk = fence_key(self)[1]
        with transaction.atomic(using=db):
            # Claim the token row first (one conditional UPDATE on its own table: it also
            # locks the row until commit), so no mint can slip in between check and DELETE.
            if not claim_row(owner, row_pk, token, db):
                raise _stale(name, token, owner, row_pk)
            return super().delete(using=using, keep_parents=keep_parents)


class FencingCounter(models.Model):
    """The fencing counter of a lock name, for ``lock_for(name, fencing=True)``."""

    name = models.CharField(max_length=1024, unique=True)
    value = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "fencing counter"

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


class ActiveLock(models.Model):
    """No table: it only gives the admin a slot for the "Active locks" page
    (``admin:django_redlock_activelock_changelist``), and permissions to guard it:
    ``view_activelock`` to see the page, ``release_activelock`` to force-release."""

    name = models.CharField(max_length=1024, primary_key=True)

    class Meta:
        managed = False
        verbose_name = "active lock"
        verbose_name_plural = "active locks"
        default_permissions = ("view",)
        permissions = (("release_activelock", "Can force-release an active lock"),)

    def __str__(self) -> str:
        return self.name
