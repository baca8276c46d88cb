"""Signals sent for every lease of the configured manager.

Every signal is sent with ``sender`` = the :class:`~django_redlock.LockManager` and:

- ``lock_acquired``: ``lease``, ``name``, ``origin``, ``waited`` (seconds spent acquiring);
- ``lock_released``: ``lease``, ``name``, ``origin``, ``held`` (seconds held);
- ``lock_lost``: ``lease``, ``name``, ``origin``, ``reason``; sent from the thread that
  found out (the auto-extension thread when a renewal fails);
- ``lock_busy``: ``name``, ``origin``, ``error`` (the ``LockNotAcquired``), ``waited``.

Receivers must be quick and must not raise: they run inside lock operations. A receiver that
raises is logged and ignored, so a broken metrics hook can never break locking.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.dispatch import Signal

from django_redlock.core import metrics
from django_redlock.exceptions import QuorumUnreachable

if TYPE_CHECKING:
    from django_redlock.exceptions import LockNotAcquired
    from django_redlock.redlock import BaseLease

__all__ = ["SignalObserver", "lock_acquired", "lock_busy", "lock_lost", "lock_released"]

logger = logging.getLogger("django_redlock")

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_busy = Signal()


def _send(signal: Signal, sender: object, **kwargs: object) -> None:
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error("signal receiver %r raised %r", receiver, result)


class SignalObserver:
    """The :class:`~django_redlock.redlock.LockObserver` the Django layer installs: sends the
    signals and records the metrics."""

    manager: object = None  # set once the manager exists: the sender of lock_busy
    label_mode = "prefix"

    def _label(self, name: str) -> str:
        return metrics.label_for(name, self.label_mode)

    def acquired(self, lease: BaseLease, waited: float) -> None:
        metrics.record("acquired", self._label(lease.name), seconds=waited)
        _send(
            lock_acquired,
            lease._manager,
            lease=lease,
            name=lease.name,
            origin=lease.origin,
            waited=waited,
        )

    def released(self, lease: BaseLease, held: float) -> None:
        metrics.record("released", self._label(lease.name), seconds=held)
        _send(
            lock_released,
            lease._manager,
            lease=lease,
            name=lease.name,
            origin=lease.origin,
            held=held,
        )

    def extended(self, lease: BaseLease, validity: float) -> None:
        metrics.record("extended", self._label(lease.name))

    def lost(self, lease: BaseLease, reason: str) -> None:
        metrics.record("lost", self._label(lease.name))
        _send(
            lock_lost,
            lease._manager,
            lease=lease,
            name=lease.name,
            origin=lease.origin,
            reason=reason,
        )

    def gave_up(self, error: LockNotAcquired, waited: float) -> None:
        outcome = "quorum_unreachable" if isinstance(error, QuorumUnreachable) else "contended"
        metrics.record(outcome, self._label(error.name), seconds=waited)
        for node in error.node_errors:
            metrics.record("node_error", "", node=node)
        _send(
            lock_busy,
            self.manager,
            name=error.name,
            origin=error.origin,
            error=error,
            waited=waited,
        )
