"""The "Active locks" admin page: who may see it, what it shows, and force release."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_redlock import get_manager
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "admin:django_redlock_activelock_changelist"
RELEASE = "admin:django_redlock_activelock_release"


def staff(django_user_model, *perms: str) -> Client:
    user = django_user_model.objects.create_user(
        username="ops-" + "-".join(p.split("_")[0] for p in perms) or "ops", password="pw"
    )
    user.is_staff = True
    user.save()
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_anonymous_users_go_to_the_login_page(client: Client):
    response = client.get(reverse(PAGE))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_staff_without_the_view_permission_get_403(django_user_model):
    assert staff(django_user_model).get(reverse(PAGE)).status_code == 403


def test_the_page_shows_nodes_and_locks_without_tokens(django_user_model, redlock_nodes):
    lease = get_manager().acquire("<script>alert(1)</script>", ttl=30.0, origin="view:x.y")
    lease.extend()
    response = staff(django_user_model, "view_activelock").get(reverse(PAGE))
    assert response.status_code == 200
    page = response.content.decode()
    assert "3 of 3 nodes can vote" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # escaped, never executed
    assert "<script>alert(1)</script>" not in page
    assert "view:x.y" in page
    assert lease.token not in page
    assert "Force release" not in page  # viewing does not allow releasing
    lease.release()


def test_search_filters_by_name(admin_client: Client, redlock_nodes):
    manager = get_manager()
    leases = [manager.acquire(name, ttl=30.0) for name in ("orders:1", "reports:1")]
    page = admin_client.get(reverse(PAGE), {"q": "orders"}).content.decode()
    assert "orders:1" in page
    assert "reports:1" not in page
    refreshing = admin_client.get(reverse(PAGE), {"refresh": "5"}).content.decode()
    assert '<meta http-equiv="refresh" content="5">' in refreshing
    for lease in leases:
        lease.release()


def test_a_capped_page_says_how_many_it_shows_and_searches_beyond_the_cap(
    admin_client: Client, redlock_nodes
):
    manager = get_manager()
    names = [f"bulk:{index:04d}" for index in range(1100)]  # the page lists 1,000
    leases = [manager.lock_many(names[:550], ttl=60.0), manager.lock_many(names[550:], ttl=60.0)]
    needle = manager.acquire("zz:Café-needle", ttl=60.0)  # sorts after every bulk lock
    page = admin_client.get(reverse(PAGE)).content.decode()
    assert "Showing 1000 of about 1101 locks, the first by name: 101 not shown." in page
    assert "bulk:0999" in page
    assert "bulk:1000" not in page
    assert "(partial" not in page  # held on a quorum: never flagged because of the cap
    found = admin_client.get(reverse(PAGE), {"q": "CAFÉ-NEEDLE"}).content.decode()
    assert "zz:Café-needle" in found
    assert "bulk:0000" not in found
    assert 'id="rl-not-shown"' not in found  # every match is shown
    for lease in (*leases, needle):
        lease.release()


def test_the_page_names_a_node_the_locks_could_not_be_read_from(
    admin_client: Client, redlock_nodes
):
    manager = get_manager()
    lease = manager.acquire("report", ttl=30.0)
    lease.extend()
    redlock_nodes[0].kill()
    page = admin_client.get(reverse(PAGE)).content.decode()
    label = manager.addresses[0].label
    assert f"Locks not read from {label}: the node counts below leave it out." in page
    assert "<td>2 of 3</td>" in page  # the lock, read from the two nodes up
    lease.release()


def test_force_release_needs_its_own_permission(django_user_model, redlock_nodes):
    viewer = staff(django_user_model, "view_activelock")
    response = viewer.post(reverse(RELEASE), {"name": "x", "confirm": "yes"})
    assert response.status_code == 403


def test_force_release_confirms_then_releases_bumps_the_fence_and_logs(
    django_user_model, redlock_nodes
):
    ledger = Ledger.objects.create()
    name = f"testapp.ledger:{ledger.pk}"
    operator = staff(django_user_model, "view_activelock", "release_activelock")
    manager = get_manager()
    lease = manager.acquire(name, ttl=30.0)
    page = operator.get(reverse(PAGE)).content.decode()
    assert "Force release" in page
    confirm = operator.get(reverse(RELEASE), {"name": name})
    assert confirm.status_code == 200
    assert "Yes, force-release it" in confirm.content.decode()
    assert manager.holder(name) is not None  # a GET changes nothing
    # A POST without the CSRF token is refused.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(django_user_model.objects.get(username__startswith="ops-view-release"))
    assert strict.post(reverse(RELEASE), {"name": name, "confirm": "yes"}).status_code == 403
    done = operator.post(reverse(RELEASE), {"name": name, "confirm": "yes"})
    assert done.status_code == 302
    assert manager.holder(name) is None
    assert Ledger.objects.get(pk=ledger.pk).fencing_token == 1  # the evicted holder is fenced
    entry = LogEntry.objects.get(action_flag=DELETION)
    assert entry.object_repr == name
    assert "bumped to 1" in entry.change_message
    assert lease.token not in entry.change_message
    # The page's message keeps the lock name as it is (the admin capitalises a message's
    # first letter: it used to read "Testapp.ledger:1").
    shown = operator.get(done["Location"]).content.decode()
    assert f"Lock &#x27;{name}&#x27; force-released on" in shown


def test_semaphore_slots_and_readers_show_without_tokens_or_a_release_button(
    admin_client: Client, redlock_nodes
):
    manager = get_manager()
    slot = manager.semaphore("partner-api", 3).acquire(ttl=30.0, origin="tasks:sync")
    reader = manager.rwlock("price-table").read(ttl=30.0)
    page = admin_client.get(reverse(PAGE)).content.decode()
    assert "semaphore slot 0" in page
    assert "reader" in page
    assert "tasks:sync" in page
    assert slot.token not in page
    assert reader.token not in page
    # Force release deletes a lock's key: it is offered for locks only.
    assert "Force release" not in page
    lock = manager.acquire("plain", ttl=30.0)
    assert admin_client.get(reverse(PAGE)).content.decode().count("Force release") == 1
    for lease in (slot, reader, lock):
        lease.release()


def test_force_release_fences_the_evicted_holder_before_it_frees_the_lock(
    admin_client: Client, redlock_nodes, monkeypatch
):
    # Released first, a waiter woken by the release could mint before the admin's bump,
    # which would then fence off that new, legitimate holder (found by an adversarial test).
    import django_redlock.fencing as fencing
    from django_redlock.redlock import LockManager

    ledger = Ledger.objects.create()
    name = f"testapp.ledger:{ledger.pk}"
    get_manager().acquire(name, ttl=30.0)
    order: list[str] = []
    mint, force_release = fencing.mint_for_row, LockManager.force_release

    def record_mint(row, lock):
        order.append("mint")
        return mint(row, lock)

    def record_release(self, lock):
        order.append("release")
        return force_release(self, lock)

    monkeypatch.setattr(fencing, "mint_for_row", record_mint)
    monkeypatch.setattr(LockManager, "force_release", record_release)
    admin_client.post(reverse(RELEASE), {"name": name, "confirm": "yes"})
    assert order == ["mint", "release"]


def test_the_page_reads_fencing_tokens_in_one_query_per_model(admin_client: Client, redlock_nodes):
    # It refreshes every few seconds: one query per lock made 402 for 400 locks.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    manager = get_manager()

    def queries_with(count: int) -> int:
        ledgers = [Ledger.objects.create() for _ in range(count)]
        leases = [manager.acquire(f"testapp.ledger:{row.pk}", ttl=30.0) for row in ledgers]
        with CaptureQueriesContext(connection) as captured:
            page = admin_client.get(reverse(PAGE))
        assert page.status_code == 200
        for lease in leases:
            lease.release()
        return len(captured)

    assert queries_with(1) == queries_with(6)
