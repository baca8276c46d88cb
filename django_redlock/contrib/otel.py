"""OpenTelemetry spans for every lease (``pip install django_redlock[otel]``).

:class:`OtelObserver` implements the :class:`~django_redlock.redlock.LockObserver` protocol
and records one span per event, on the tracer of the given provider (the global one by
default), as a child of whatever span is current in the thread that did the operation:

- ``redlock.acquire``: from the start of the acquire to the grant, so the span's duration is
  the wait (an explicit start time: the observer hears of the acquire once it is over); a
  give-up is the same span with an error status and the outcome ``contended`` or
  ``quorum_unreachable``: one operation, one span name, the outcome as an attribute;
- ``redlock.release`` (with the seconds held), ``redlock.extend`` (with the validity left)
  and ``redlock.lost`` (error status, with the reason): instants, at the event.

Attributes (``redlock.*``): the lock name and origin, the wait or hold in seconds, the nodes
(their labels: ``NodeAddress.label``, never a password), the quorum, the votes when known,
the nodes that failed, the outcome. Never the lease token, never a password or a URL with
credentials: only names the library itself shows to operators.

To keep the Django signals and metrics while adding spans, compose observers::

    from django_redlock.contrib.otel import OtelObserver, compose_observers
    manager = LockManager(nodes, observer=compose_observers(signal_observer, OtelObserver()))

This module imports OpenTelemetry's API only (not the SDK) and no Django.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from django_redlock import __version__
from django_redlock.exceptions import QuorumUnreachable

if TYPE_CHECKING:
    from django_redlock.core.lease import BaseLease
    from django_redlock.core.reporting import LockObserver
    from django_redlock.exceptions import LockNotAcquired

__all__ = ["ObserverChain", "OtelObserver", "compose_observers"]

logger = logging.getLogger("django_redlock")

TRACER_NAME = "django_redlock"

_Attributes = dict[str, str | bool | int | float | Sequence[str]]


def _seconds_ago_ns(seconds: float) -> int:
    """The wall-clock instant ``seconds`` ago, in ns since the epoch (OpenTelemetry's time)."""
    return time.time_ns() - max(0, round(seconds * 1e9))


class OtelObserver:
    """A :class:`~django_redlock.redlock.LockObserver` that records OpenTelemetry spans.

    Args:
        tracer_provider: where the spans go; the global provider when None.
        tracer: a ready tracer instead (then ``tracer_provider`` is ignored).

    Never raises into the lock operation: a failing exporter or SDK is logged once per call.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.tracer = tracer or trace.get_tracer(
            TRACER_NAME, __version__, tracer_provider=tracer_provider
        )

    # -- attributes ----------------------------------------------------------------------

    @staticmethod
    def _lease_attributes(lease: BaseLease) -> _Attributes:
        attributes: _Attributes = {
            "redlock.lock.name": lease.name,
            "redlock.lock.kind": lease.kind,
            "redlock.ttl_s": lease.ttl,
        }
        if lease.origin:
            attributes["redlock.origin"] = lease.origin
        nodes = lease.host.nodes
        attributes["redlock.nodes"] = list(nodes.labels)
        attributes["redlock.quorum"] = nodes.quorum
        # The votes of the winning attempt, once leases carry them (see the module notes).
        votes = getattr(lease, "votes", None)
        if isinstance(votes, int):
            attributes["redlock.votes"] = votes
        return attributes

    def _record(
        self,
        name: str,
        attributes: _Attributes,
        *,
        start_ns: int | None = None,
        error: str | None = None,
    ) -> None:
        try:
            span = self.tracer.start_span(
                name, kind=SpanKind.INTERNAL, attributes=attributes, start_time=start_ns
            )
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
            span.end()
        except Exception:  # an observer must not break locking (LockObserver)
            logger.exception("recording the OpenTelemetry span %s failed", name)

    # -- LockObserver --------------------------------------------------------------------

    def acquired(self, lease: BaseLease, waited: float) -> None:
        attributes = self._lease_attributes(lease)
        attributes["redlock.wait_s"] = waited
        attributes["redlock.outcome"] = "acquired"
        self._record("redlock.acquire", attributes, start_ns=_seconds_ago_ns(waited))

    def released(self, lease: BaseLease, held: float) -> None:
        attributes = self._lease_attributes(lease)
        attributes["redlock.held_s"] = held
        attributes["redlock.outcome"] = "released"
        self._record("redlock.release", attributes)

    def extended(self, lease: BaseLease, validity: float) -> None:
        attributes = self._lease_attributes(lease)
        attributes["redlock.validity_s"] = validity
        attributes["redlock.outcome"] = "extended"
        self._record("redlock.extend", attributes)

    def lost(self, lease: BaseLease, reason: str) -> None:
        attributes = self._lease_attributes(lease)
        attributes["redlock.outcome"] = "lost"
        attributes["redlock.reason"] = reason
        attributes["redlock.lost_cause"] = lease.lost_cause or ""
        self._record("redlock.lost", attributes, error=reason)

    def gave_up(self, error: LockNotAcquired, waited: float) -> None:
        outcome = "quorum_unreachable" if isinstance(error, QuorumUnreachable) else "contended"
        attributes: _Attributes = {
            "redlock.lock.name": error.name,
            "redlock.wait_s": waited,
            "redlock.outcome": outcome,
            "redlock.votes": error.votes,
            "redlock.quorum": error.quorum,
            "redlock.attempts": error.attempts,
            # Keyed by the redacted labels (exceptions.py): never a password.
            "redlock.nodes.failed": sorted(error.node_errors),
        }
        if error.origin:
            attributes["redlock.origin"] = error.origin
        if error.retry_after is not None:
            attributes["redlock.retry_after_s"] = error.retry_after
        self._record("redlock.acquire", attributes, start_ns=_seconds_ago_ns(waited), error=outcome)


class ObserverChain:
    """Several observers heard as one, in order (the Django signals observer and
    :class:`OtelObserver`, say). An observer that raises is logged and the next one still
    hears the event: no observer can break locking or silence another.
    """

    def __init__(self, *observers: LockObserver) -> None:
        self.observers = tuple(observers)

    def _each(self, event: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, event)(*args)
            except Exception:
                logger.exception("lock observer %r failed on %s", observer, event)

    def acquired(self, lease: BaseLease, waited: float) -> None:
        self._each("acquired", lease, waited)

    def released(self, lease: BaseLease, held: float) -> None:
        self._each("released", lease, held)

    def extended(self, lease: BaseLease, validity: float) -> None:
        self._each("extended", lease, validity)

    def lost(self, lease: BaseLease, reason: str) -> None:
        self._each("lost", lease, reason)

    def gave_up(self, error: LockNotAcquired, waited: float) -> None:
        self._each("gave_up", error, waited)


def compose_observers(*observers: LockObserver | None) -> LockObserver | None:
    """One observer that tells each of ``observers`` (``None`` ones skipped) in turn; the
    observer itself when there is one, None when there is none.

    Raises:
        TypeError: an argument lacks one of the observer's methods.
    """
    present = [observer for observer in observers if observer is not None]
    for observer in present:
        missing = [
            event
            for event in ("acquired", "released", "extended", "lost", "gave_up")
            if not callable(getattr(observer, event, None))
        ]
        if missing:
            raise TypeError(
                f"observers: {observer!r} is not a LockObserver (no {', '.join(missing)})"
            )
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    return ObserverChain(*present)
