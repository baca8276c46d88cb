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

from typing import Any, ClassVar

from django.db import models, transaction

from django_redlock.exceptions import StaleFencingToken, UnfencedWrite
from django_redlock.fencing import active_token, claim_row, fence_model

__all__ = ["ActiveLock", "FencedModel", "FencingCounter"]

_TOKEN = "fencing_token"


def _stale(name: str, token: int, model: type[models.Model], pk: Any) -> StaleFencingToken:
    detail = f"{model._meta.label}(pk={pk!r}) now has a newer fencing token or is gone"
    return StaleFencingToken(name, token, detail)


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

    class Meta:
        abstract = True

    def _do_update(  # type: ignore[override]  # Django's signature varies between versions
        self,
        base_qs: models.QuerySet[Any],
        using: str,
        pk_val: Any,
        values: list[tuple[Any, Any, Any]],
        *args: Any,
        **kwargs: Any,
    ) -> bool:
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
            return bool(super()._do_update(base_qs, using, pk_val, values, *args, **kwargs))
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
            return True
        # Another table of a multi-table model (Django saves ancestors first, but the token
        # may sit below a plain ancestor): claim the token row in the same transaction first.
        assert owner._meta.pk is not None
        row_pk = getattr(self, owner._meta.pk.attname)
        with transaction.atomic(using=using, savepoint=False):
            if not claim_row(owner, row_pk, token, using):
                raise _stale(name, token, owner, row_pk)
            return bool(super()._do_update(base_qs, using, pk_val, values, *args, **kwargs))

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
        assert owner._meta.pk is not None
        row_pk = getattr(self, owner._meta.pk.attname)
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
