"""Signals sent for every lease of the configured manager.

Every signal is sent with ``sender`` = the :class:`~django_redlock.LockManager` and:

- ``lock_acquired``: ``lease``, ``name``, ``origin``, ``waited`` (seconds spent acquiring);
- ``lock_released``: ``lease``, ``name``, ``origin``, ``held`` (seconds held);
- ``lock_lost``: ``lease``, ``name``, ``origin``, ``reason``, ``cause`` (``"expired"``: its
  validity ran out; ``"taken"``: a quorum holds it for another token; ``"gone"``: a quorum
  no longer holds it) and ``at`` (when it ended, on the manager's monotonic clock); sent
  from the thread that found out (the auto-extension thread when the validity of a lease
  it could not renew runs out);
- ``lock_busy``: ``name``, ``origin``, ``error`` (the ``LockNotAcquired``), ``waited``.

The lease signals also carry ``kind``: ``"lock"``, ``"semaphore"``, ``"read"``, ``"write"``
or ``"many"`` (see ``lease.kind``).

Receivers must be quick and must not raise: they run inside lock operations. A receiver that
raises is logged and ignored, so a broken metrics hook can never break locking.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING

from django.dispatch import Signal

from django_redlock.core import metrics
from django_redlock.default_manager import build_manager
from django_redlock.exceptions import QuorumUnreachable

if TYPE_CHECKING:
    from django_redlock.conf import RedlockSettings
    from django_redlock.exceptions import LockNotAcquired
    from django_redlock.redlock import BaseLease, LockManager

__all__ = [
    "SignalObserver",
    "lock_acquired",
    "lock_busy",
    "lock_lost",
    "lock_released",
    "observed_manager",
]

logger = logging.getLogger("django_redlock")

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_busy = Signal()


def _send(signal: Signal, sender: object, **kwargs: object) -> None:
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error("signal receiver %r raised %r", receiver, result)


def _send_for(signal: Signal, sender: object, lease: BaseLease, **kwargs: object) -> None:
    """Send ``signal`` about ``lease`` from ``sender`` (the manager), with its name and
    origin."""
    _send(
        signal,
        sender,
        lease=lease,
        name=lease.name,
        origin=lease.origin,
        kind=lease.kind,
        **kwargs,
    )


class SignalObserver:
    """The :class:`~django_redlock.redlock.LockObserver` the Django layer installs: sends the
    signals and records the metrics.

    Args:
        manager: the manager observed, the sender of every signal (of a lease's signals,
            whether a sync or asyncio manager sharing its engine took it; when not set, or
            once that manager is gone, the lease's engine); may be set after the manager is
            built, which needs its observer first. Held weakly (see below).
        label_mode: the ``lock`` label of the metrics, ``REDLOCK["METRICS_LABEL"]``.
    """

    # Keeps no lease, and lets nothing reach one through it: each lease is passed on to the
    # signals' receivers and its name to the metrics; the manager (the signals' sender, where
    # receivers may hang anything) is held weakly, and there is no __dict__. So nothing a
    # lease reaches through its engine's observer can refer back to it, and a thread holding
    # many leases may have them untracked by the garbage collector (core.lease._cycle_free,
    # which trusts this declaration on this exact class only, not on a subclass).
    keeps_leases = False
    __slots__ = ("_manager", "label_mode")

    def __init__(self, manager: object = None, *, label_mode: str = "prefix") -> None:
        self._manager: weakref.ref[object] | None = None
        self.manager = manager
        self.label_mode = label_mode

    @property
    def manager(self) -> object:
        """The manager observed, or None (not set, or gone)."""
        ref = self._manager
        return None if ref is None else ref()

    @manager.setter
    def manager(self, manager: object) -> None:
        if manager is None:
            self._manager = None
            return
        try:
            self._manager = weakref.ref(manager)
        except TypeError:
            raise TypeError(
                f"manager must be a lock manager (held weakly), not {type(manager).__name__}"
            ) from None

    def _sender(self, lease: BaseLease) -> object:
        manager = self.manager
        return lease.host if manager is None else manager

    def _label(self, name: str) -> str:
        return metrics.label_for(name, self.label_mode)

    def acquired(self, lease: BaseLease, waited: float) -> None:
        metrics.record("acquired", self._label(lease.name), seconds=waited)
        _send_for(lock_acquired, self._sender(lease), lease, waited=waited)

    def released(self, lease: BaseLease, held: float) -> None:
        metrics.record("released", self._label(lease.name), seconds=held)
        _send_for(lock_released, self._sender(lease), lease, held=held)

    def extended(self, lease: BaseLease, validity: float) -> None:
        metrics.record("extended", self._label(lease.name))

    def lost(self, lease: BaseLease, reason: str) -> None:
        metrics.record("lost", self._label(lease.name))
        _send_for(
            lock_lost,
            self._sender(lease),
            lease,
            reason=reason,
            cause=lease.lost_cause,
            at=lease.lost_at,
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


def observed_manager(config: RedlockSettings) -> LockManager:
    """The manager :func:`~django_redlock.get_manager` serves once the app is ready: built
    from the settings, its leases send these signals and count the metrics.

    Raises:
        TypeError, ValueError: as :class:`~django_redlock.LockManager`.
    """
    observer = SignalObserver(label_mode=config.metrics_label)
    manager = build_manager(config, observer=observer)
    observer.manager = manager
    return manager
