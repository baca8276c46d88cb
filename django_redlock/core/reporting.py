"""What a manager tells the world about its leases: log records and observer calls, in one
place for the sync and the asyncio manager, so one event reads the same whichever made it.

Log levels: DEBUG for attempts and renewals, INFO for acquired and released, WARNING for what
an operator should see (a grant or release despite node errors, a node that refuses to vote,
a lost lease). Warnings that a degraded cluster would repeat on every acquire are rate limited
per manager. The observer (the Django layer's ``SignalObserver`` sends signals and records
metrics through it) hears of every acquire, release, renewal, loss and give-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from django_redlock.exceptions import is_quarantined, is_restarted, quarantine_hint
from django_redlock.procedures.flow import Nodes, has_node_errors, summarise
from django_redlock.wire.errors import PENDING
from django_redlock.wire.scripts import GRANTED

if TYPE_CHECKING:
    from django_redlock.core.lease import BaseLease
    from django_redlock.exceptions import LeaseNotExtended, LockNotAcquired

__all__ = ["WARN_EVERY", "LockObserver", "Reporter", "logger"]

logger = logging.getLogger("django_redlock")

WARN_EVERY = 10.0
"""Seconds between two rate-limited warnings of one manager."""


class LockObserver(Protocol):
    """Hears about every lease of a manager (the Django layer sends signals and keeps metrics
    through one). Called synchronously in the thread that did the operation; the extender
    thread reports lost renewals. Must not raise; must be quick.

    An observer through which nothing can reach a lease (it keeps none, and holds nothing
    that code could hang one on: no ``__dict__``, its manager held weakly) may say so with a
    class attribute ``keeps_leases = False`` on its own class (the Django layer's
    ``SignalObserver`` does; a subclass must say it again): a thread holding many leases then
    has them untracked by the garbage collector while they are held (see
    ``core.lease._cycle_free``). Through any other observer a lease could close a reference
    cycle that, untracked, would never be freed, so their leases stay tracked."""

    def acquired(self, lease: BaseLease, waited: float) -> None:
        """A lease was taken after ``waited`` seconds."""

    def released(self, lease: BaseLease, held: float) -> None:
        """A lease was released after ``held`` seconds (also when release raised LockLost)."""

    def extended(self, lease: BaseLease, validity: float) -> None:
        """A lease was renewed (by its owner or the extender); ``validity`` seconds left."""

    def lost(self, lease: BaseLease, reason: str) -> None:
        """A lease was found lost (expired, renewal failed, or gone at release); once each."""

    def gave_up(self, error: LockNotAcquired, waited: float) -> None:
        """An acquire raised ``error`` after ``waited`` seconds."""


class Reporter:
    """Logs and observer calls of one manager (shared by its asyncio twin).

    Args:
        nodes: the manager's nodes (labels for the messages, the quorum).
        observer: told of every event, or None.
        now: the real monotonic clock of the rate limit (warnings are for people, so an
            injected test clock does not govern them).
    """

    def __init__(
        self,
        nodes: Nodes,
        observer: LockObserver | None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nodes = nodes
        self.observer = observer
        self._now = now
        self._last_warning = float("-inf")

    def _warn_now(self) -> bool:
        """Rate limit for warnings that a loaded or degraded cluster would repeat on every
        acquire (a stalled node): logging them all would cost more than the locks."""
        now = self._now()
        if now - self._last_warning < WARN_EVERY:
            return False
        self._last_warning = now
        return True

    def granted(self, name: str, results: Sequence[Any], votes: int, waited: float) -> None:
        """An attempt won lock ``name`` with ``votes`` yes votes, ``waited`` seconds after the
        acquire began.

        An acquire returns as soon as a quorum said yes, so ``votes`` is usually the quorum
        while the other nodes' answers are still on their way: the line says "quorum", and
        only nodes that really failed are reported (the warning below)."""
        # Asked first: when nobody listens (the default level is WARNING), this costs one call
        # per acquire instead of two and no formatting arguments.
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "acquired %r: quorum %d of %d nodes in %.1f ms",
                name,
                votes,
                self.nodes.size,
                waited * 1000,
            )
        # Grants and replies not waited for are no errors: counted in C before any scan.
        if (
            results.count(GRANTED) + results.count(PENDING) < len(results)
            and has_node_errors(results)
            and self._warn_now()
        ):
            logger.warning(
                "acquired %r despite node errors (at most one such warning per %g s): %s",
                name,
                WARN_EVERY,
                summarise(self.nodes, results),
            )

    def acquired(self, lease: BaseLease, waited: float) -> None:
        if self.observer is not None:
            self.observer.acquired(lease, waited)

    def attempt_failed(self, error: LockNotAcquired) -> None:
        """An attempt failed (the acquire may still retry)."""
        refusing = [
            (node, text) for node, text in error.node_errors.items() if is_quarantined(text)
        ]
        if refusing and self._warn_now():
            # The operator's cue, one line for all nodes: the sentence of the error (which
            # nodes, when a quorum votes again, the command safe to run as printed), then
            # each node's own refusal, as the status command and the admin show it.
            logger.warning(
                "%s (%s)",
                quarantine_hint(
                    [node for node, text in refusing if is_restarted(text)], error.quarantined
                ),
                "; ".join(f"{node}: {text}" for node, text in refusing),
            )
        logger.debug("attempt %d on %r failed: %s", error.attempts, error.name, error)

    def gave_up(self, error: LockNotAcquired, origin: str | None, waited: float) -> LockNotAcquired:
        """An acquire gives up after ``waited`` seconds. Returns ``error`` (with its origin),
        for the caller to raise."""
        logger.debug("gave up on %r: %s", error.name, error)
        error.origin = origin
        if self.observer is not None:
            self.observer.gave_up(error, waited)
        return error

    def extended(self, lease: BaseLease, validity: float, votes: int) -> None:
        logger.debug("extended %r on %d/%d nodes", lease.name, votes, self.nodes.size)
        if self.observer is not None:
            self.observer.extended(lease, validity)

    def renewal_failed(self, lease: BaseLease, error: Exception) -> None:
        logger.warning("auto-extension of %r failed: %s", lease.name, error)

    def renewal_missed(self, lease: BaseLease, error: LeaseNotExtended) -> None:
        """A renewal reached no quorum: the lease keeps its validity and is tried again."""
        logger.warning("auto-extension of %r: %s; trying again", lease.name, error)

    def renewal_stopped(self, lease: BaseLease) -> None:
        logger.info("max_hold reached for %r: renewal stops, the lease runs out", lease.name)

    def lost(self, lease: BaseLease, reason: str) -> None:
        logger.warning("lease on %r lost: %s", lease.name, reason)
        if self.observer is not None:
            self.observer.lost(lease, reason)

    def released(self, lease: BaseLease, held: float) -> None:
        """A release round ended after ``held`` seconds of holding (a lost lease is reported
        by :meth:`lost` after this, a kept one by :meth:`released_cleanly`)."""
        if self.observer is not None:
            self.observer.released(lease, held)

    def handed_off(self, lease: BaseLease, held: float) -> None:
        """This process gave the lease away (``lease.handle()``) after holding it ``held``
        seconds: its hold here ended as a release would end it (the observer hears
        ``released``)."""
        logger.info("handed off %r for another process to adopt", lease.name)
        if self.observer is not None:
            self.observer.released(lease, held)

    def adopted(self, lease: BaseLease) -> None:
        """A handed-off lease was adopted here (the observer hears ``acquired`` next)."""
        logger.info("adopted %r (handed off by another process)", lease.name)

    def released_cleanly(self, lease: BaseLease, deleted: int, partial: str | None) -> None:
        """Released on ``deleted`` nodes; ``partial`` names the nodes that did not answer
        when fewer than a quorum released it (their keys expire by ttl)."""
        if partial is not None:
            logger.warning(
                "released %r on %d/%d nodes; the rest did not answer (%s) and expire by ttl",
                lease.name,
                deleted,
                self.nodes.size,
                partial,
            )
        elif logger.isEnabledFor(logging.INFO):
            logger.info("released %r", lease.name)

    def force_released(self, name: str, deleted: int) -> None:
        logger.warning("force-released %r on %d/%d nodes", name, deleted, self.nodes.size)

    def left_inherited(self, lease: BaseLease, child: int, owner: int) -> None:
        logger.warning(
            "process %d left the with block of lease %r inherited through fork(): the "
            "lease stays with process %d, nothing was released",
            child,
            lease.name,
            owner,
        )

    def release_failed_after_error(self, lease: BaseLease, error: Exception) -> None:
        # Never hide the block's own exception behind the release's.
        logger.warning("releasing %r after an error: %s", lease.name, error)
