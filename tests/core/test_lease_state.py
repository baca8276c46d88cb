"""A lease's state by name: the index names of ``core.lease`` and its one replace helper."""

from __future__ import annotations

import gc
import typing

import pytest

from django_redlock.core import lease as lease_module
from django_redlock.core.lease import EXPIRES_AT, HELD, MISSED, NAME, TAKER_PID, replaced

STATE = ("n", "k", "t", 10.0, 1.0, None, "", 11.0, "late", "", 7, None, None, None, None)


def test_every_index_has_one_name_and_the_names_cover_the_state():
    fields = typing.get_args(lease_module._State)
    indexes = sorted(vars(lease_module)["_FIELDS"].values())
    assert indexes == list(range(len(fields)))
    assert (NAME, TAKER_PID, HELD) == (0, 10, 13)


def test_replaced_sets_the_named_fields_and_nothing_else():
    held = (True, False, True)
    new = replaced(STATE, expires_at=12.5, missed=None, held=held)
    assert new[EXPIRES_AT] == 12.5
    assert new[MISSED] is None
    assert new[HELD] is held
    untouched = [i for i in range(len(STATE)) if i not in (EXPIRES_AT, MISSED, HELD)]
    assert [new[i] for i in untouched] == [STATE[i] for i in untouched]
    assert STATE[EXPIRES_AT] == 11.0  # a new tuple: the old one is never changed


def test_a_replaced_state_is_a_plain_tuple_the_collector_untracks():
    new = replaced(STATE, owner="record")
    assert type(new) is tuple
    gc.collect()
    assert not gc.is_tracked(new)


def test_replaced_refuses_a_name_that_is_no_field():
    with pytest.raises(KeyError):
        replaced(STATE, expiry=1.0)
