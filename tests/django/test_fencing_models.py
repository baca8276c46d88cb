"""The fence follows the row that carries the token: proxies and multi-table inheritance.

A proxy of a FencedModel and a multi-table child of a fenced parent write the same token row
as the model itself, so they share its fence and its lock name. Runs on SQLite, and on
PostgreSQL when DATABASE_URL is set.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from django_redlock import LockContended, LockLost, StaleFencingToken, lock_for
from django_redlock.fencing import mint_for_row
from django_redlock.locks import lock_name
from tests.helpers import node_client
from tests.testapp.models import (
    Account,
    FencedInvoice,
    Invoice,
    Ledger,
    LedgerProxy,
    SavingsAccount,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fencing]


def newer_holder_mints(instance) -> int:
    """What a newer holder does on entering lock_for: mint the row's next token, committed."""
    return mint_for_row(instance, lock_name(instance))


def hold_in_thread(target, held: threading.Event, done: threading.Event) -> threading.Thread:
    def run() -> None:
        try:
            with lock_for(target, timeout=5):
                held.set()
                assert done.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert held.wait(10)
    return thread


# -- proxies ---------------------------------------------------------------------------------


def test_a_proxy_and_its_concrete_model_share_one_lock_name():
    ledger = Ledger.objects.create()
    proxy = LedgerProxy.objects.get(pk=ledger.pk)
    assert lock_name(proxy) == lock_name(ledger) == f"testapp.ledger:{ledger.pk}"


@pytest.mark.usefixtures("redlock_nodes")
def test_a_proxy_and_its_concrete_model_exclude_each_other():
    ledger = Ledger.objects.create()
    held, done = threading.Event(), threading.Event()
    thread = hold_in_thread(LedgerProxy.objects.get(pk=ledger.pk), held, done)
    try:
        with pytest.raises(LockContended), lock_for(ledger, blocking=False):
            pass
    finally:
        done.set()
        thread.join(10)


@pytest.mark.usefixtures("redlock_nodes")
def test_a_stale_write_through_a_proxy_is_refused():
    ledger = Ledger.objects.create()
    with lock_for(ledger) as lease:
        through_proxy = LedgerProxy.objects.get(pk=ledger.pk)
        through_proxy.value = 1
        through_proxy.save()  # fenced under the held token: accepted
        newer_holder_mints(ledger)
        through_proxy.value = 2
        with pytest.raises(StaleFencingToken) as refused:
            through_proxy.save()
    assert refused.value.token == lease.fencing_token
    assert Ledger.objects.get(pk=ledger.pk).value == 1


def test_a_lock_taken_through_a_proxy_fences_the_concrete_model(redlock_nodes):
    ledger = Ledger.objects.create()
    tokens: list[int | None] = []

    def newer_holder() -> None:
        try:
            with lock_for(Ledger.objects.get(pk=ledger.pk), timeout=5) as newer:
                tokens.append(newer.fencing_token)
        finally:
            connection.close()

    outcome: list[BaseException] = []
    try:
        with lock_for(LedgerProxy.objects.get(pk=ledger.pk), auto_extend=False) as lease:
            for node in redlock_nodes:  # the lease runs out while its holder "pauses"
                with node_client(node) as client:
                    client.delete(lease.key)
            thread = threading.Thread(target=newer_holder)
            thread.start()
            thread.join(10)
            ledger.value = 7
            try:
                ledger.save()
            except StaleFencingToken as error:
                outcome.append(error)
    except LockLost:
        pass
    assert lease.fencing_token is not None
    assert tokens == [lease.fencing_token + 1]
    assert [type(error) for error in outcome] == [StaleFencingToken]
    assert Ledger.objects.get(pk=ledger.pk).value == 0


# -- multi-table inheritance: a child of a fenced parent -----------------------------------


@pytest.mark.usefixtures("redlock_nodes")
def test_a_child_of_a_fenced_parent_is_minted_on_the_parents_row():
    savings = SavingsAccount.objects.create(owner="ann", rate=2)
    with lock_for(savings) as lease:
        assert lease.fencing_token == 1
        assert Account.objects.get(pk=savings.pk).fencing_token == 1
        savings.balance, savings.rate = 10, 3
        savings.save()
    row = SavingsAccount.objects.get(pk=savings.pk)
    assert (row.balance, row.rate, row.fencing_token) == (10, 3, 1)


@pytest.mark.usefixtures("redlock_nodes")
def test_a_child_and_its_parent_share_one_lock_name_and_exclude_each_other():
    savings = SavingsAccount.objects.create()
    parent = Account.objects.get(pk=savings.pk)
    assert lock_name(savings) == lock_name(parent) == f"testapp.account:{savings.pk}"
    held, done = threading.Event(), threading.Event()
    thread = hold_in_thread(savings, held, done)
    try:
        with pytest.raises(LockContended), lock_for(parent, blocking=False):
            pass
    finally:
        done.set()
        thread.join(10)


@pytest.mark.parametrize(
    "fields",
    [None, ["rate"], ["balance"]],
    ids=["whole-row", "child-field-only", "parent-field-only"],
)
@pytest.mark.usefixtures("redlock_nodes")
def test_a_stale_write_through_the_child_is_refused_in_both_tables(fields):
    savings = SavingsAccount.objects.create(balance=1, rate=1)
    with lock_for(savings) as lease:
        newer_holder_mints(Account.objects.get(pk=savings.pk))
        savings.balance, savings.rate = 99, 99
        with pytest.raises(StaleFencingToken) as refused:
            savings.save(update_fields=fields)
    assert refused.value.token == lease.fencing_token
    row = SavingsAccount.objects.get(pk=savings.pk)
    assert (row.balance, row.rate, row.fencing_token) == (1, 1, lease.fencing_token + 1)


@pytest.mark.usefixtures("redlock_nodes")
def test_a_write_through_the_parent_is_fenced_by_the_childs_lock():
    savings = SavingsAccount.objects.create()
    with lock_for(savings):
        parent = Account.objects.get(pk=savings.pk)
        parent.balance = 5
        parent.save()
        newer_holder_mints(savings)
        parent.balance = 6
        with pytest.raises(StaleFencingToken):
            parent.save()
    assert Account.objects.get(pk=savings.pk).balance == 5


@pytest.mark.usefixtures("redlock_nodes")
def test_a_stale_delete_of_a_child_removes_neither_row():
    savings = SavingsAccount.objects.create()
    with lock_for(savings):
        newer_holder_mints(savings)
        with pytest.raises(StaleFencingToken):
            savings.delete()
    assert SavingsAccount.objects.filter(pk=savings.pk).exists()
    assert Account.objects.filter(pk=savings.pk).exists()
    with lock_for(savings):
        savings.delete()
    assert not Account.objects.filter(pk=savings.pk).exists()


# -- multi-table inheritance: fenced below a plain parent ----------------------------------


@pytest.mark.usefixtures("redlock_nodes")
def test_fenced_below_a_plain_parent_guards_the_parents_fields_too():
    fenced = FencedInvoice.objects.create(number="A-1", total=1, note="x")
    assert lock_name(fenced) == f"testapp.fencedinvoice:{fenced.pk}"
    with lock_for(fenced) as lease:
        fenced.total = 2
        fenced.save()
        newer_holder_mints(fenced)
        fenced.total, fenced.note = 3, "stale"
        with pytest.raises(StaleFencingToken):
            fenced.save()
    assert lease.fencing_token == 1
    assert Invoice.objects.get(pk=fenced.pk).total == 2
    assert FencedInvoice.objects.get(pk=fenced.pk).note == "x"
