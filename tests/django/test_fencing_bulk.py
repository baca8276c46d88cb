"""Bulk writes on a FencedModel honour the fence: update(), bulk_update(), delete().

Inside ``lock_for(row)`` they are fenced for the held rows (claimed with the token in the same
transaction) and a stale one writes nothing; where a write cannot be made conditional
(``bulk_create(update_conflicts=True)``) it is refused. Runs on SQLite, and on PostgreSQL
when DATABASE_URL is set.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, models
from django.db.models import F
from django.test.utils import isolate_apps

from django_redlock import LockLost, StaleFencingToken, UnfencedWrite, lock_for
from django_redlock.fencing import mint_for_row
from django_redlock.locks import lock_name
from django_redlock.models import FencedModel, FencedQuerySet
from tests.helpers import node_client
from tests.testapp.models import Account, Ledger, LedgerProxy, SavingsAccount, StrictSeat

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fencing]


def newer_holder_mints(instance) -> int:
    """What a newer holder does on entering lock_for: mint the row's next token, committed."""
    return mint_for_row(instance, lock_name(instance))


def values(*ledgers: Ledger) -> list[int]:
    return [Ledger.objects.get(pk=ledger.pk).value for ledger in ledgers]


def test_the_default_manager_returns_a_fenced_queryset():
    assert isinstance(Ledger.objects.all(), FencedQuerySet)
    assert isinstance(LedgerProxy.objects.all(), FencedQuerySet)
    assert isinstance(SavingsAccount.objects.all(), FencedQuerySet)


@pytest.mark.usefixtures("redlock_nodes")
def test_a_fenced_update_of_the_held_row_is_written():
    ledger = Ledger.objects.create()
    with lock_for(ledger) as lease:
        assert Ledger.objects.filter(pk=ledger.pk).update(value=F("value") + 5) == 1
    row = Ledger.objects.get(pk=ledger.pk)
    assert (row.value, row.fencing_token) == (5, lease.fencing_token)


@pytest.mark.parametrize("model", [Ledger, LedgerProxy], ids=["model", "proxy"])
@pytest.mark.usefixtures("redlock_nodes")
def test_a_stale_update_of_the_held_row_is_refused(model):
    ledger = Ledger.objects.create()
    with lock_for(ledger) as lease:
        newer_holder_mints(ledger)
        with pytest.raises(StaleFencingToken) as refused:
            model.objects.filter(pk=ledger.pk).update(value=5)
    assert refused.value.token == lease.fencing_token
    assert values(ledger) == [0]


@pytest.mark.usefixtures("redlock_nodes")
def test_a_stale_bulk_update_writes_nothing_at_all():
    held, other = Ledger.objects.create(), Ledger.objects.create()
    with lock_for(held):
        newer_holder_mints(held)
        held.value, other.value = 5, 6
        with pytest.raises(StaleFencingToken):
            Ledger.objects.bulk_update([other, held], ["value"])
    assert values(held, other) == [0, 0]  # the unheld row's part was rolled back too


@pytest.mark.usefixtures("redlock_nodes")
def test_a_bulk_update_of_held_and_unheld_rows_is_written_when_current():
    held, other = Ledger.objects.create(), Ledger.objects.create()
    with lock_for(held):
        held.value, other.value = 5, 6
        assert Ledger.objects.bulk_update([held, other], ["value"]) == 2
    assert values(held, other) == [5, 6]


@pytest.mark.usefixtures("redlock_nodes")
def test_a_held_row_that_moved_on_does_not_stop_an_update_it_is_not_part_of():
    held = Ledger.objects.create(value=1)
    Ledger.objects.create(value=2)
    with lock_for(held):
        newer_holder_mints(held)
        # Not matched, so not stale: the update of the other row goes ahead (the held row is
        # also left out of the statement itself, in case it starts to match meanwhile).
        assert Ledger.objects.filter(value=2).update(writer="x") == 1
    assert [row.writer for row in Ledger.objects.order_by("pk")] == ["", "x"]


def test_bulk_updating_the_token_from_instances_is_refused():
    ledger = Ledger.objects.create()
    with pytest.raises(ValueError, match="fields: 'fencing_token'"):
        Ledger.objects.bulk_update([ledger], ["value", "fencing_token"])


@pytest.mark.usefixtures("redlock_nodes")
def test_a_stale_queryset_delete_of_the_held_row_is_refused():
    held, other = Ledger.objects.create(), Ledger.objects.create()
    with lock_for(held):
        newer_holder_mints(held)
        with pytest.raises(StaleFencingToken):
            Ledger.objects.filter(pk__in=[held.pk, other.pk]).delete()
    assert Ledger.objects.count() == 2
    with lock_for(held):
        assert Ledger.objects.filter(pk=held.pk).delete()[0] == 1


@pytest.mark.usefixtures("redlock_nodes")
def test_a_stale_update_through_a_multi_table_child_queryset_is_refused():
    savings = SavingsAccount.objects.create(balance=1, rate=1)
    with lock_for(savings):
        newer_holder_mints(savings)
        with pytest.raises(StaleFencingToken):
            SavingsAccount.objects.filter(pk=savings.pk).update(balance=9)  # parent's table
        with pytest.raises(StaleFencingToken):
            SavingsAccount.objects.filter(pk=savings.pk).update(rate=9)  # child's table
        with pytest.raises(StaleFencingToken):
            Account.objects.filter(pk=savings.pk).update(balance=9)
    row = SavingsAccount.objects.get(pk=savings.pk)
    assert (row.balance, row.rate) == (1, 1)


@pytest.mark.usefixtures("redlock_nodes")
def test_fencing_required_refuses_unfenced_bulk_writes():
    seat, other = StrictSeat.objects.create(), StrictSeat.objects.create()
    with pytest.raises(UnfencedWrite, match="requires fencing"):
        StrictSeat.objects.filter(pk=seat.pk).update(holder="x")
    with pytest.raises(UnfencedWrite):
        StrictSeat.objects.all().delete()
    with lock_for(seat):
        assert StrictSeat.objects.filter(pk=seat.pk).update(holder="x") == 1
        with pytest.raises(UnfencedWrite, match="not held"):
            StrictSeat.objects.all().update(holder="y")
    assert [row.holder for row in StrictSeat.objects.order_by("pk")] == ["x", ""]
    assert other.pk


@pytest.mark.usefixtures("redlock_nodes")
def test_an_upsert_cannot_be_fenced_and_is_refused_inside_a_fenced_block():
    ledger = Ledger.objects.create()
    with lock_for(ledger), pytest.raises(UnfencedWrite, match="update_conflicts"):
        Ledger.objects.bulk_create(
            [Ledger(pk=ledger.pk, value=5)],
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=["value"],
        )
    assert values(ledger) == [0]


def test_a_paused_holders_bulk_update_is_refused_after_a_newer_holder(redlock_nodes):
    ledger = Ledger.objects.create()
    paused, resumed = threading.Event(), threading.Event()
    outcome: list[object] = []

    def stale_holder() -> None:
        try:
            with lock_for(Ledger.objects.get(pk=ledger.pk), auto_extend=False) as lease:
                for node in redlock_nodes:  # its lease runs out while it "pauses"
                    with node_client(node) as client:
                        client.delete(lease.key)
                paused.set()
                assert resumed.wait(10)
                try:
                    Ledger.objects.filter(pk=ledger.pk).update(value=F("value") + 100)
                except StaleFencingToken as error:
                    outcome.append(error)
        except LockLost:
            pass
        finally:
            connection.close()

    thread = threading.Thread(target=stale_holder)
    thread.start()
    assert paused.wait(10)
    with lock_for(ledger, timeout=5):
        Ledger.objects.filter(pk=ledger.pk).update(value=F("value") + 1)
    resumed.set()
    thread.join(10)
    assert [type(error) for error in outcome] == [StaleFencingToken]
    assert values(ledger) == [1]


@isolate_apps("tests.testapp")
def test_a_fenced_model_with_an_unfenced_default_manager_is_warned_about():
    class PlainlyManaged(FencedModel):
        objects = models.Manager()  # type: ignore[assignment]  # the point of the test

        class Meta:
            app_label = "testapp"

    class FencedByQuerySet(FencedModel):
        objects = FencedQuerySet.as_manager()  # type: ignore[assignment]  # not a FencedManager

        class Meta:
            app_label = "testapp"

    (warning,) = [m for m in PlainlyManaged.check() if m.id == "django_redlock.W010"]
    assert "bulk writes" in warning.msg
    assert not [m for m in FencedByQuerySet.check() if m.id == "django_redlock.W010"]
    assert not [m for m in Ledger.check() if m.id == "django_redlock.W010"]
