"""Fenced locks inside an outer transaction (``ATOMIC_REQUESTS = True``, ``atomic()``).

The token is minted and committed on its own; the lock is held until the outer transaction
commits or rolls back, so the next holder neither waits on rows this transaction still holds
nor reads what it is about to change. Two concurrent requests run in real threads against
the real nodes. Runs on SQLite, and on PostgreSQL when DATABASE_URL is set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from django_redlock import FencingUnavailable, StaleFencingToken, get_manager, lock_for
from django_redlock.locks import lock_name
from django_redlock.signals import lock_acquired
from tests.helpers import node_client
from tests.testapp.models import Ledger, WriteLog

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.fencing,
    pytest.mark.urls(__name__),
]

# Per-test hooks into the view: "<who>:<point>" -> callable.
HOOKS: dict[str, Callable[..., None]] = {}
ORDER: list[str] = []


def _hook(who: str, point: str, *args: Any) -> None:
    hook = HOOKS.get(f"{who}:{point}")
    if hook is not None:
        hook(*args)


def increment(request: HttpRequest, pk: int) -> HttpResponse:
    """Add one to a ledger under its fenced lock, inside the request's transaction."""
    who = request.GET["who"]
    transaction.on_commit(lambda: ORDER.append(f"{who} committed"))
    # Lock before the transaction's first query: on SQLite (one writer for the whole
    # database) a read would hold a lock that keeps the token's own commit waiting.
    ledger = Ledger(pk=pk)
    _hook(who, "before_lock")
    try:
        with lock_for(ledger, timeout=10) as lease:
            _hook(who, "locked", lease)
            ledger.refresh_from_db()
            ledger.value += 1
            ledger.writer = who
            ledger.save()
            assert lease.fencing_token is not None
            WriteLog.objects.create(
                ledger=ledger, token=lease.fencing_token, value=ledger.value, writer=who
            )
    except StaleFencingToken:
        return HttpResponse("stale", status=409)
    _hook(who, "after_block")
    return HttpResponse(str(lease.fencing_token))


urlpatterns = [path("increment/<int:pk>/", increment)]


@pytest.fixture(autouse=True)
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    HOOKS.clear()
    ORDER.clear()
    yield
    HOOKS.clear()


def request_in_thread(pk: int, who: str, responses: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        try:
            responses[who] = Client().get(f"/increment/{pk}/", {"who": who})
        except Exception as error:  # the client re-raises the view's exception
            responses[who] = error
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=who)
    thread.start()
    return thread


def outcome(response: Any) -> tuple[int, str] | Exception:
    if isinstance(response, Exception):
        return response
    return (response.status_code, response.content.decode())


@pytest.mark.usefixtures("redlock_nodes")
def test_two_requests_that_meet_both_succeed_in_order():
    ledger = Ledger.objects.create()
    name = lock_name(ledger)
    a_done, b_coming, b_acquired = threading.Event(), threading.Event(), threading.Event()

    def on_acquired(sender: object, name: str, **kwargs: object) -> None:
        if name == lock_name(ledger) and threading.current_thread().name == "B":
            ORDER.append("B acquired")
            b_acquired.set()

    def a_after_block() -> None:
        # A's block is over but its transaction is not committed yet: B arrives now.
        a_done.set()
        assert b_coming.wait(10)
        if b_acquired.wait(1.0):
            time.sleep(2.5)  # A's view still has work to do (rendering, more queries...)

    HOOKS["A:after_block"] = a_after_block
    HOOKS["B:before_lock"] = lambda: b_coming.set()
    lock_acquired.connect(on_acquired, weak=False)
    responses: dict[str, Any] = {}
    try:
        a = request_in_thread(ledger.pk, "A", responses)
        assert a_done.wait(10)
        b = request_in_thread(ledger.pk, "B", responses)
        a.join(30)
        b.join(30)
    finally:
        lock_acquired.disconnect(on_acquired)
    assert outcome(responses["A"]) == (200, "1")
    assert outcome(responses["B"]) == (200, "2")
    # B took the lock only once A's writes were committed, and so read them.
    assert ORDER == ["A committed", "B acquired", "B committed"]
    assert [(w.writer, w.token, w.value) for w in WriteLog.objects.order_by("pk")] == [
        ("A", 1, 1),
        ("B", 2, 2),
    ]
    assert get_manager().holder(name) is None


def test_a_stale_request_is_refused_and_the_newer_one_kept(redlock_nodes):
    ledger = Ledger.objects.create()
    a_paused, b_done = threading.Event(), threading.Event()

    def a_locked(lease: Any) -> None:
        for node in redlock_nodes:  # A's lease runs out while A "pauses"
            with node_client(node) as client:
                client.delete(lease.key)
        a_paused.set()
        assert b_done.wait(20)

    HOOKS["A:locked"] = a_locked
    responses: dict[str, Any] = {}
    a = request_in_thread(ledger.pk, "A", responses)
    assert a_paused.wait(10)
    b = request_in_thread(ledger.pk, "B", responses)
    b.join(30)
    b_done.set()
    a.join(30)
    assert outcome(responses["B"]) == (200, "2")
    assert outcome(responses["A"]) == (409, "stale")
    row = Ledger.objects.get(pk=ledger.pk)
    assert (row.value, row.writer, row.fencing_token) == (1, "B", 2)
    assert [(w.writer, w.token) for w in WriteLog.objects.all()] == [("B", 2)]


@pytest.mark.usefixtures("redlock_nodes")
def test_the_lock_is_held_until_the_outer_transaction_commits():
    ledger = Ledger.objects.create()
    name = lock_name(ledger)
    with transaction.atomic():
        with lock_for(ledger):
            ledger.value = 1
            ledger.save()
        assert get_manager().holder(name) is not None  # the write is not committed yet
    assert get_manager().holder(name) is None
    assert Ledger.objects.get(pk=ledger.pk).value == 1


@pytest.mark.parametrize("savepoint", [False, True], ids=["transaction", "savepoint"])
@pytest.mark.usefixtures("redlock_nodes")
def test_a_rollback_releases_the_lock_and_keeps_the_fence(savepoint):
    ledger = Ledger.objects.create()
    name = lock_name(ledger)
    with transaction.atomic():
        try:
            with transaction.atomic(savepoint=savepoint):
                with lock_for(ledger) as lease:
                    ledger.value = 1
                    ledger.save()
                raise RuntimeError("roll it back")
        except RuntimeError:
            pass
        if savepoint:  # the outer transaction goes on, without the rolled-back writes
            assert get_manager().holder(name) is None
    assert get_manager().holder(name) is None
    assert lease.fencing_token is not None
    with lock_for(ledger, blocking=False) as again:
        assert again.fencing_token == lease.fencing_token + 1  # never issued twice
    assert Ledger.objects.get(pk=ledger.pk).value == 0


@pytest.mark.usefixtures("redlock_nodes")
def test_a_rolled_back_request_releases_the_lock():
    ledger = Ledger.objects.create()

    def fail() -> None:
        raise RuntimeError("the view fails after its fenced write")

    HOOKS["A:after_block"] = fail
    responses: dict[str, Any] = {}
    request_in_thread(ledger.pk, "A", responses).join(30)
    assert isinstance(responses["A"], RuntimeError)
    assert get_manager().holder(lock_name(ledger)) is None
    row = Ledger.objects.get(pk=ledger.pk)
    assert (row.value, row.fencing_token) == (0, 1)


@pytest.mark.usefixtures("redlock_nodes")
def test_locking_the_same_row_again_in_one_transaction_keeps_its_token():
    ledger = Ledger.objects.create()
    with transaction.atomic():
        with lock_for(ledger) as first:
            ledger.value = 1
            ledger.save()
        with lock_for(ledger) as second:  # re-entry: the lock was never let go
            ledger.value = 2
            ledger.save()
            with lock_for(ledger) as third:
                assert third.fencing_token == first.fencing_token
            ledger.value = 3
            ledger.save()  # the outer block is still fenced by the same token
    assert second.fencing_token == first.fencing_token == 1
    assert get_manager().holder(lock_name(ledger)) is None
    assert Ledger.objects.get(pk=ledger.pk).value == 3


@pytest.mark.skipif(
    "connection.vendor != 'sqlite'", reason="SQLite only: one writer for the whole database"
)
@pytest.mark.usefixtures("redlock_nodes")
def test_on_sqlite_a_read_before_the_lock_is_refused_with_a_clear_message():
    ledger = Ledger.objects.create()
    with transaction.atomic():
        read = Ledger.objects.get(pk=ledger.pk)
        with (
            pytest.raises(FencingUnavailable, match="before the first query"),
            lock_for(read),
        ):
            pass
    assert get_manager().holder(lock_name(ledger)) is None


@pytest.mark.usefixtures("redlock_nodes")
def test_a_nested_lock_of_the_same_row_does_not_fence_off_the_outer_block():
    ledger = Ledger.objects.create()
    with lock_for(ledger) as outer:
        with lock_for(ledger) as inner:
            assert inner.fencing_token == outer.fencing_token
            ledger.value = 1
            ledger.save()
        ledger.value = 2
        ledger.save()  # still our token: the inner block did not mint a newer one
    row = Ledger.objects.get(pk=ledger.pk)
    assert (row.value, row.fencing_token) == (2, 1)
