"""FencedModel on the edges an adversarial test found: a pk given as text or in another
spelling, a multi-table child made from its pk, a held row deleted and re-created by
``update_or_create``, and a token lowered by ``update()``.

Runs on SQLite, and on PostgreSQL when DATABASE_URL is set (CI sets it).
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_redlock import StaleFencingToken, lock_for
from django_redlock.admin import fenced_row
from django_redlock.locks import lock_name
from tests.testapp.models import Ledger, SavingsAccount

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fencing]


@pytest.mark.usefixtures("redlock_nodes")
def test_a_pk_given_as_text_locks_and_fences_the_same_row():
    ledger = Ledger.objects.create()
    # A pk from a URL or a form: "7" is row 7, so saves of row 7 inside are fenced.
    with lock_for(Ledger(pk=str(ledger.pk))) as lease:
        assert lease.name == f"testapp.ledger:{ledger.pk}"
        row = Ledger.objects.get(pk=ledger.pk)
        Ledger.objects.filter(pk=ledger.pk).update(fencing_token=99)  # a newer holder minted
        row.value = 5
        with pytest.raises(StaleFencingToken):
            row.save()
    assert Ledger.objects.get(pk=ledger.pk).value == 0  # nothing written


def test_another_spelling_of_a_pk_is_the_same_lock_and_not_another_row():
    ledger = Ledger.objects.create()
    assert lock_name(Ledger(pk=f"0{ledger.pk}")) == lock_name(ledger)
    # The admin bumps a token only for the name lock_for gives that row.
    assert fenced_row(f"testapp.ledger:0{ledger.pk}") is None
    assert fenced_row(f"testapp.ledger:{ledger.pk}") == ledger
    with pytest.raises(ValueError, match="not a valid primary key"):
        lock_name(Ledger(pk="seven"))


@pytest.mark.usefixtures("redlock_nodes")
def test_a_multi_table_child_made_from_its_pk_locks_its_row():
    first = SavingsAccount.objects.create(owner="a")
    second = SavingsAccount.objects.create(owner="b")
    assert lock_name(SavingsAccount(pk=first.pk)) == f"testapp.account:{first.pk}"
    assert lock_name(SavingsAccount(pk=second.pk)) == f"testapp.account:{second.pk}"
    with lock_for(SavingsAccount(pk=first.pk)) as lease:
        assert lease.fencing_token == 1


@pytest.mark.usefixtures("redlock_nodes")
def test_a_held_row_deleted_meanwhile_is_not_re_created():
    ledger = Ledger.objects.create()
    table = connection.ops.quote_name(Ledger._meta.db_table)
    with lock_for(ledger):
        with connection.cursor() as cursor:  # a newer holder deleted it
            cursor.execute(f"DELETE FROM {table} WHERE id = %s", [ledger.pk])  # noqa: S608
        with pytest.raises(StaleFencingToken):
            Ledger.objects.update_or_create(pk=ledger.pk, defaults={"value": 99})
        with pytest.raises(StaleFencingToken):
            Ledger.objects.get_or_create(pk=ledger.pk, defaults={"value": 99})
    assert not Ledger.objects.filter(pk=ledger.pk).exists()


@pytest.mark.usefixtures("redlock_nodes")
def test_update_never_lowers_a_token():
    ledger = Ledger.objects.create()
    with lock_for(ledger) as lease:
        assert lease.fencing_token == 1
    Ledger.objects.filter(pk=ledger.pk).update(fencing_token=0)
    assert Ledger.objects.get(pk=ledger.pk).fencing_token == 1
    with lock_for(ledger) as lease:
        assert lease.fencing_token == 2  # never 1 again


@pytest.mark.usefixtures("redlock_nodes")
def test_a_held_row_can_become_a_multi_table_child():
    # Only the token's own table refuses an insert of a held row: the child's table gets
    # its first row after the parent's fenced update.
    from tests.testapp.models import Account

    account = Account.objects.create(owner="a")
    with lock_for(account) as lease:
        child = SavingsAccount(account_ptr=account, rate=2)
        child.owner, child.balance = account.owner, account.balance
        child.save()
    assert SavingsAccount.objects.get(pk=account.pk).rate == 2
    assert Account.objects.get(pk=account.pk).fencing_token == lease.fencing_token
