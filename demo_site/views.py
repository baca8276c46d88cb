"""The demo's pages: the bookings of each run, and a booking endpoint guarded per seat."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from demo_site.models import Event, Rejection, Sale, Seat
from demo_site.services import Outcome, book_seat
from django_redlock import QuorumUnreachable, get_manager, locked_view
from django_redlock.core.health import status


def event_report(event: Event) -> dict[str, Any]:
    """What happened to one event's seats: sales, double sales, fence rejections."""
    seats = list(
        event.seats.annotate(
            sale_count=Count("sales", distinct=True),
            rejection_count=Count("rejections", distinct=True),
        )
    )
    doubles = [seat for seat in seats if seat.sale_count > 1]
    rejections = Rejection.objects.filter(seat__event=event).select_related("seat")
    return {
        "event": event,
        "seats": seats,
        "sold": sum(1 for seat in seats if seat.sold_to),
        "sales": sum(seat.sale_count for seat in seats),
        "lost_leases": Sale.objects.filter(seat__event=event, lease_lost=True).count(),
        "doubles": [
            {"seat": seat, "customers": [sale.customer for sale in seat.sales.all()]}
            for seat in doubles
        ],
        "rejections": rejections[:20],
        "rejection_count": sum(seat.rejection_count for seat in seats),
    }


def home(request: HttpRequest) -> HttpResponse:
    manager = get_manager()
    report = status(manager)
    nodes = report.nodes
    reachable = sum(1 for node in nodes if node.reachable)
    events = Event.objects.order_by("id")
    return render(
        request,
        "demo/home.html",
        {
            "manager": manager,
            "nodes": nodes,
            "reachable": reachable,
            "quorum_ok": report.healthy,
            "reports": [event_report(event) for event in events],
            "free_seats": Seat.objects.filter(
                Q(sold_to="") & Q(event__fenced=True), held_by=""
            ).select_related("event")[:12],
            "result": request.session.pop("result", None),
            "refresh": 2 if "live" in request.GET else None,
        },
    )


@require_POST
@locked_view("demo_site.seat:{pk}", ttl=10.0)
def book(request: HttpRequest, pk: int) -> HttpResponse:
    """Buy a seat from the page. While a worker is buying the same seat the view answers
    423 Locked at once (``@locked_view``); ``book_seat`` re-enters the same lock."""
    seat = get_object_or_404(Seat.objects.select_related("event"), pk=pk)
    customer = request.POST.get("customer", "").strip()[:100] or "a visitor"
    try:
        result = book_seat(seat, customer, worker="web", timeout=1.0)
    except QuorumUnreachable as error:
        request.session["result"] = {"ok": False, "text": f"QuorumUnreachable: {error}"}
        return redirect("home")
    text = {
        Outcome.SOLD: f"Sold {seat} to {customer} (fencing token {seat.fencing_token}).",
        Outcome.TAKEN: f"{seat} is taken: {result.detail}.",
        Outcome.BUSY: f"{seat} is being bought by someone else.",
        Outcome.REFUSED: f"The database refused the sale: {result.detail}",
    }[result.outcome]
    request.session["result"] = {"ok": result.outcome is Outcome.SOLD, "text": text}
    return redirect("home")
