"""Which rows this thread or task holds fenced, and how a fenced row is keyed: the state
that :class:`~django_redlock.models.FencedModel`'s writes check.

Its own module so that the dependency goes one way: ``models.py`` needs this state,
``fencing.py`` (the mint, which writes the ``FencingCounter`` table) needs it and the models;
nothing here needs either.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

__all__ = [
    "FENCED_FIELD",
    "active_token",
    "canonical_pk",
    "claim_row",
    "fence_key",
    "fence_model",
    "fenced",
    "held_rows",
]

#: The field of a fenced model that carries its row's fencing token.
FENCED_FIELD = "fencing_token"

# (label of the model whose table holds the token, that table's pk) -> (token, lock name),
# for the fenced blocks of this thread or task.
_ACTIVE: contextvars.ContextVar[Mapping[tuple[str, Any], tuple[int, str]]] = contextvars.ContextVar(
    "django_redlock_fences", default=MappingProxyType({})
)


def fence_model(model: type[models.Model]) -> type[models.Model]:
    """The concrete model whose table holds ``model``'s ``fencing_token`` column.

    That is ``model`` itself, its concrete model for a proxy, or, with multi-table
    inheritance, the ancestor that declares the field. The fence, the lock name and the mint
    all follow this model, so a proxy, a child and the parent of one row share one fence.
    """
    field = model._meta.get_field(FENCED_FIELD)
    owner = getattr(field, "model", None)
    assert owner is not None
    concrete: type[models.Model] = owner._meta.concrete_model
    return concrete


def canonical_pk(model: type[models.Model], value: Any) -> Any:
    """``value`` as ``model``'s pk field makes it (``"7"`` and ``"07"`` are ``7``): one row,
    one fence, one lock name, whatever type the pk came in (a URL, a form).

    Raises:
        ValueError: not a valid pk for ``model`` (its message names the argument ``target``).
    """
    field = model._meta.pk
    assert field is not None
    if value is None:
        return None
    try:
        return field.to_python(value)
    except ValidationError:
        raise ValueError(
            f"target: {value!r} is not a valid primary key of {model._meta.label}"
        ) from None


def fence_key(instance: models.Model) -> tuple[str, Any]:
    """(label of :func:`fence_model`, the pk of the row that carries the token, canonical).

    Raises:
        ValueError: the instance's pk is not valid for that model.
    """
    owner = fence_model(type(instance))
    assert owner._meta.pk is not None
    # A child's pk is its parent link, so with several parents it need not be the token
    # row's pk: read the token model's own pk attribute, which every subclass inherits.
    value = getattr(instance, owner._meta.pk.attname)
    if value is None:
        # A multi-table child made from its pk alone (Child(pk=1)): the parent's attribute is
        # only filled by a load from the database, and the parent link is the child's pk.
        value = instance.pk
    return (owner._meta.label_lower, canonical_pk(owner, value))


def active_token(instance: models.Model) -> tuple[int, str] | None:
    """The (token, lock name) under which ``instance``'s row is held here, or None."""
    fences = _ACTIVE.get()
    if not fences:
        return None
    return fences.get(fence_key(instance))


def held_rows(model: type[models.Model]) -> dict[Any, tuple[int, str]]:
    """pk of the token row -> (token, lock name), for the rows of ``model``'s fence held here."""
    fences = _ACTIVE.get()
    if not fences:
        return {}
    label = fence_model(model)._meta.label_lower
    return {pk: fence for (owner, pk), fence in fences.items() if owner == label}


def claim_row(model: type[models.Model], pk: Any, token: int, using: str) -> bool:
    """Check that the token row of ``pk`` still carries ``token``, and lock it.

    One ``UPDATE … SET fencing_token = <token> WHERE pk = … AND fencing_token = <token>``: a
    no-op write, but it takes the row's write lock until the caller's transaction ends, so no
    newer mint can commit between this check and the caller's next statements. Call it inside
    ``atomic()``. Returns False when the row has a newer token or is gone.
    """
    owner = fence_model(model)
    # A plain QuerySet, not the model's manager: a FencedQuerySet would fence this again.
    rows: models.QuerySet[models.Model] = models.QuerySet(owner, using=using).filter(
        pk=pk, fencing_token=token
    )
    return bool(rows.update(fencing_token=token))


@contextmanager
def fenced(instance: models.Model, token: int, name: str) -> Iterator[None]:
    """Make writes to ``instance``'s row in this thread or task conditional on ``token``."""
    fences = dict(_ACTIVE.get())
    fences[fence_key(instance)] = (token, name)
    reset = _ACTIVE.set(fences)
    try:
        yield
    finally:
        _ACTIVE.reset(reset)
