"""The booking service: what a web request or a worker calls to buy a seat.

``book_seat`` takes the seat's lock with ``lock_for(seat)``, which also mints the seat's next
fencing token in the database. Every write inside the block is then conditional on that
token, so a buyer whose lease ran out while it was paused (a GC pause, a SIGSTOP) cannot
overwrite the sale of the buyer who came after it: its write raises ``StaleFencingToken``
and nothing is written. With ``fencing=False`` the same code writes blindly, which is how
other lock libraries behave, and the demo counts the double sales that follow.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from demo_site.models import Rejection, Sale, Seat
from django_redlock import LockContended, LockLost, LockNotAcquired, StaleFencingToken, lock_for


class Outcome(enum.Enum):
    SOLD = "sold"
    TAKEN = "taken"  # sold (or on hold) already
    BUSY = "busy"  # another buyer holds the seat's lock
    REFUSED = "refused"  # the database refused a stale holder's write (fencing)


@dataclass
class Result:
    outcome: Outcome
    seat: Seat
    detail: str = ""
    lease_lost: bool = False


def book_seat(
    seat: Seat,
    customer: str,
    *,
    worker: str = "web",
    pay: Callable[[], None] = lambda: None,
    ttl: float | None = None,
    timeout: float | None = None,
    hold_seconds: float = 30.0,
) -> Result:
    """Hold ``seat`` for ``customer``, take the payment (``pay``), then sell it.

    Args:
        seat: the seat to buy (its event says whether writes are fenced).
        customer: who buys it.
        worker: which process sells it, for the log.
        pay: the slow step between hold and sale (a payment provider call).
        ttl: the lease length in seconds (default ``REDLOCK["TTL"]``).
        timeout: seconds to wait for the seat's lock (default ``REDLOCK["DEFAULT_TIMEOUT"]``).
        hold_seconds: how long the hold lasts if the checkout dies before selling.

    Returns a :class:`Result`; raises ``QuorumUnreachable`` when the lock service is down.
    """
    fencing = seat.event.fenced
    token: int | None = None
    try:
        with lock_for(seat, ttl=ttl, timeout=timeout, fencing=fencing) as lease:
            token = lease.fencing_token
            seat.refresh_from_db()  # read under the lock: the state others left behind
            now = timezone.now()
            if seat.sold_to or (seat.held_by and seat.held_until and seat.held_until > now):
                return Result(Outcome.TAKEN, seat, seat.sold_to or f"on hold for {seat.held_by}")
            seat.held_by, seat.held_until = customer, now + datetime.timedelta(seconds=hold_seconds)
            seat.save(update_fields=["held_by", "held_until"])
            pay()  # a pause here can outlast the lease: the next buyer may take the seat
            lost = lease.lost
            with transaction.atomic():
                seat.sold_to, seat.held_by, seat.held_until = customer, "", None
                seat.save(update_fields=["sold_to", "held_by", "held_until"])
                Sale.objects.create(
                    seat=seat,
                    customer=customer,
                    worker=worker,
                    fencing_token=token,
                    lease_lost=lost,
                )
    except StaleFencingToken as error:
        Rejection.objects.create(
            seat=seat,
            customer=customer,
            worker=worker,
            fencing_token=error.token,
            reason=str(error),
        )
        return Result(Outcome.REFUSED, seat, str(error))
    except LockLost as error:
        # Left the block after the lease ran out: the sale above is committed. With fencing
        # it was accepted because nobody took the seat meanwhile; without, it may be a double.
        Sale.objects.filter(seat=seat, customer=customer, fencing_token=token).update(
            lease_lost=True
        )
        return Result(Outcome.SOLD, seat, str(error), lease_lost=True)
    except LockContended as error:
        return Result(Outcome.BUSY, seat, str(error))
    return Result(Outcome.SOLD, seat)


def clear_expired_holds(now: datetime.datetime | None = None) -> int:
    """Drop the holds of checkouts that died before selling; returns how many were cleared.

    Each seat is cleared under its own lock (one try: a seat being bought right now is
    skipped, its buyer decides), so the clean-up never races a live checkout.
    """
    now = now or timezone.now()
    cleared = 0
    for seat in Seat.objects.filter(sold_to="", held_until__lt=now).exclude(held_by=""):
        try:
            with lock_for(seat, blocking=False, fencing=seat.event.fenced):
                seat.refresh_from_db()
                if seat.sold_to or not seat.held_until or seat.held_until >= now:
                    continue
                seat.held_by, seat.held_until = "", None
                seat.save(update_fields=["held_by", "held_until"])
                cleared += 1
        except (LockNotAcquired, StaleFencingToken, LockLost):
            continue
    return cleared
