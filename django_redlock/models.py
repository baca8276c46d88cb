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
from django_redlock.fencing import active_token

__all__ = ["ActiveLock", "FencedModel", "FencingCounter"]

_TOKEN = "fencing_token"


class FencedModel(models.Model):
    """Abstract base: adds ``fencing_token`` and makes writes under ``lock_for`` conditional.

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
        values = [
            (field, model, token if field.attname == _TOKEN else value)
            for field, model, value in values
        ]
        updated = super()._do_update(
            base_qs.filter(fencing_token=token), using, pk_val, values, *args, **kwargs
        )
        if not updated:
            raise StaleFencingToken(
                name,
                token,
                f"{self._meta.label}(pk={pk_val!r}) now has a newer fencing token or is gone",
            )
        return True

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
        with transaction.atomic(using=db):
            # Claim the row with our token first (one conditional UPDATE: it also locks the
            # row until commit), so no mint can slip in between the check and the DELETE.
            claimed = (
                type(self)
                ._base_manager.using(db)
                .filter(pk=self.pk, fencing_token=token)
                .update(fencing_token=token)
            )
            if not claimed:
                raise StaleFencingToken(
                    name,
                    token,
                    f"{self._meta.label}(pk={self.pk!r}) now has a newer fencing token or is gone",
                )
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
