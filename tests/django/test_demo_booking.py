"""The demo's booking service, view and command, as any app's would be tested.

The story the demo tells is made deterministic here: buyer A is "paused" inside its checkout
(its ``pay`` step), its lease runs out (the keys vanish from every node) and buyer B buys the
same seat; then A goes on. With fencing A's write is refused; without, the seat is sold twice.
"""

from __future__ import annotations

import datetime
import io
import threading

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from demo_site.models import Event, Rejection, Sale, Seat
from demo_site.services import Outcome, Result, book_seat, clear_expired_holds
from django_redlock.locks import lock_name
from tests.helpers import node_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fencing]


def a_seat(fenced: bool = True, **fields) -> Seat:
    event = Event.objects.create(name="test", fenced=fenced)
    return Seat.objects.create(event=event, label="A1", **fields)


def race(cluster, seat: Seat):
    """Buyer A's lease and hold run out mid-checkout and buyer B buys the seat; returns both
    results."""
    results: dict[str, Result] = {}

    def lease_runs_out_and_b_buys() -> None:
        key = "redlock:" + lock_name(seat)
        for node in cluster:
            with node_client(node) as client:
                client.delete(key)
        other = Seat.objects.select_related("event").get(pk=seat.pk)

        def buyer_b() -> None:
            try:
                results["b"] = book_seat(other, "B", worker="b")
            finally:
                connections.close_all()  # this thread's own database connection

        thread = threading.Thread(target=buyer_b)
        thread.start()
        thread.join(30)

    # A's hold lapses at once, as it would during a pause longer than the hold.
    results["a"] = book_seat(
        seat, "A", worker="a", pay=lease_runs_out_and_b_buys, ttl=10.0, hold_seconds=0.0
    )
    return results["a"], results["b"]


def test_with_fencing_the_stale_buyer_is_refused_and_the_seat_sold_once(redlock_nodes):
    seat = a_seat(fenced=True)
    a, b = race(redlock_nodes, seat)
    assert (a.outcome, b.outcome) == (Outcome.REFUSED, Outcome.SOLD)
    assert list(Sale.objects.values_list("customer", flat=True)) == ["B"]
    rejection = Rejection.objects.get()
    assert (rejection.customer, rejection.fencing_token) == ("A", 1)
    row = Seat.objects.get(pk=seat.pk)
    assert (row.sold_to, row.fencing_token) == ("B", 2)


def test_without_fencing_the_same_race_sells_the_seat_twice(redlock_nodes):
    seat = a_seat(fenced=False)
    a, b = race(redlock_nodes, seat)
    assert (a.outcome, b.outcome) == (Outcome.SOLD, Outcome.SOLD)
    assert a.lease_lost  # A only learns at release that its lease had run out
    assert sorted(Sale.objects.values_list("customer", flat=True)) == ["A", "B"]
    assert Seat.objects.get(pk=seat.pk).sold_to == "A"  # B's sale silently overwritten


def test_a_seat_sold_or_on_hold_is_taken(redlock_nodes):
    seat = a_seat(sold_to="C")
    assert book_seat(seat, "A").outcome is Outcome.TAKEN
    held = a_seat(held_by="D", held_until=timezone.now() + datetime.timedelta(minutes=1))
    assert book_seat(held, "A").outcome is Outcome.TAKEN
    assert not Sale.objects.exists()


def test_clear_expired_holds_skips_live_holds_and_seats_being_bought(redlock_nodes, held_elsewhere):
    past = timezone.now() - datetime.timedelta(seconds=5)
    expired = a_seat(held_by="dead checkout", held_until=past)
    live = a_seat(held_by="live", held_until=timezone.now() + datetime.timedelta(minutes=1))
    busy = a_seat(held_by="being bought", held_until=past)
    with held_elsewhere(lock_name(busy)):
        assert clear_expired_holds() == 1
    assert Seat.objects.get(pk=expired.pk).held_by == ""
    assert Seat.objects.get(pk=live.pk).held_by == "live"
    assert Seat.objects.get(pk=busy.pk).held_by == "being bought"
    assert Seat.objects.get(pk=expired.pk).fencing_token == 1  # cleared under a fenced lock


def test_the_command_runs_once_at_a_time(redlock_nodes, held_elsewhere):
    a_seat(held_by="dead", held_until=timezone.now() - datetime.timedelta(seconds=5))
    out, err = io.StringIO(), io.StringIO()
    with held_elsewhere("clear_expired_holds"):
        call_command("clear_expired_holds", stdout=out, stderr=err)
    assert out.getvalue() == ""  # skipped: another run holds the command's lock
    assert "clear_expired_holds" in err.getvalue()
    call_command("clear_expired_holds", stdout=out)
    assert "cleared 1 expired hold" in out.getvalue()


@override_settings(ROOT_URLCONF="demo_site.urls")
def test_the_booking_view_sells_and_answers_423_while_the_seat_is_being_bought(
    redlock_nodes, held_elsewhere, client
):
    seat = a_seat()
    with held_elsewhere(lock_name(seat)):
        assert client.post(f"/seats/{seat.pk}/book/", {"customer": "E"}).status_code == 423
    response = client.post(f"/seats/{seat.pk}/book/", {"customer": "E"}, follow=True)
    assert response.status_code == 200
    assert "Sold test A1 to E" in response.content.decode()
    assert Seat.objects.get(pk=seat.pk).sold_to == "E"
    page = client.get("/").content.decode()
    assert "No seat sold twice" in page
    assert "1 of 1 seats sold" in page
