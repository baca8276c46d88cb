"""The procedures of a held lease: extend (renew), owned, and adopt (take over a lease another
process handed off). Each is one round; what to post around it, and when, is decided here
once, for the sync and asyncio managers, the extender and the simulator.

A release is one round with nothing to post around it: its round and its judgement are
``core.lease``'s ``release_round`` and ``settle_release``, which the drivers' callers carry
out directly (``Engine.release``, ``AsyncLockManager._release``, the simulator's ``hold``).
As a procedure it cost 1.5 % of an acquire + release pair's client instructions in calls
alone (the benchmarks page), and decided nothing those two functions do not.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django_redlock.exceptions import LockLost, QuorumUnreachable
from django_redlock.procedures import flow
from django_redlock.procedures.acquire import learn_quarantines
from django_redlock.procedures.effects import Effect, Post, Round

if TYPE_CHECKING:
    from django_redlock.core.handle import LeaseHandle
    from django_redlock.wire.scripts import Command

__all__ = [
    "AdoptHost",
    "Adopting",
    "LeaseHost",
    "adopt",
    "extend",
    "owned",
]

_L = TypeVar("_L")
_L_contra = TypeVar("_L_contra", contravariant=True)


class LeaseHost(Protocol[_L_contra]):
    """What a lease's rounds ask of its host (the engine; the simulator's client): the
    nodes, the clock, and the lease's side of each round: its commands on ``size`` nodes,
    what a renewal is judged against, and the recording of each verdict in its state, which
    ``core.lease`` keeps (the engine gives those functions themselves, with no call of its
    own in between). The verdicts are decided here, not by the host."""

    @property
    def nodes(self) -> flow.Nodes: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def expired_before_renewal(
        self, lease: _L_contra, size: int
    ) -> Sequence[Command | None] | None: ...

    def lost_error(self, lease: _L_contra) -> LockLost: ...

    def extend_round(self, lease: _L_contra) -> Sequence[Command]: ...

    def renewal_basis(self, lease: _L_contra) -> tuple[float, float, Sequence[bool] | None]: ...

    def renewal_missed(self, lease: _L_contra, missed: flow.Missed, now: float) -> Exception: ...

    def renewal_lost(self, lease: _L_contra, lost: flow.Lost, now: float) -> LockLost: ...

    def renewed(
        self, lease: _L_contra, validity: float, now: float, results: Sequence[Any]
    ) -> float: ...

    def lost_clean_up(
        self, lease: _L_contra, results: Sequence[Any]
    ) -> Sequence[Command | None]: ...

    def owns_round(self, lease: _L_contra, size: int) -> Sequence[Command]: ...

    def validity(self, lease: _L_contra) -> float: ...


def extend(host: LeaseHost[_L], lease: _L) -> Generator[Effect, Any, float]:
    """One renewal round of ``lease`` (``Lease.extend``, the extender's renewals); returns the
    new validity in seconds.

    Raises:
        LockLost: the lease ended (its validity ran out before the round could start, or a
            quorum no longer holds it); its keys are freed, best effort (compare-and-delete:
            only ours), as ``flow.lost_clean_up`` says.
        LeaseNotExtended: no quorum either way; nothing is freed: the lease keeps its
            validity, and its keys keep others out until it runs out.
    """
    nodes = host.nodes
    expired = host.expired_before_renewal(lease, nodes.size)
    if expired is not None:
        # No round for a lease already ended: it would only set keys that the clean-up
        # must delete again.
        yield Post(expired)
        raise host.lost_error(lease)
    commands = host.extend_round(lease)
    start = host.clock()
    # Never given up early on refusals: a node that never held the lease may answer "set
    # again" (2) without any loss, so only every answer (or the deadline) decides.
    exchange = yield Round(commands, 1, nodes.quorum, nodes.size)
    now = host.clock()
    results = exchange.results
    ttl, expires_at, held = host.renewal_basis(lease)
    outcome = flow.judge_extend(nodes, ttl, expires_at, start, now, results, held)
    if isinstance(outcome, flow.Missed):
        # Nothing is freed: the keys keep others out until the validity runs out.
        raise host.renewal_missed(lease, outcome, now)
    if isinstance(outcome, flow.Lost):
        error = host.renewal_lost(lease, outcome, now)
        # The lease has ended: free what keys of ours only keep the next holder waiting.
        yield Post(host.lost_clean_up(lease, results))
        raise error
    return host.renewed(lease, outcome, now, results)


def owned(host: LeaseHost[_L], lease: _L) -> Generator[Effect, Any, bool]:
    """Whether a quorum still holds ``lease``'s token and its validity has not run out."""
    nodes = host.nodes
    exchange = yield Round(host.owns_round(lease, nodes.size), 1, nodes.quorum)
    return flow.owned(nodes, exchange.yes, host.validity(lease))


class Adopting(Protocol):
    """An adopt in progress (``core.engine.Adoption``): the handle, the hand-off round, and
    the clean-up of a failed one."""

    @property
    def handle(self) -> LeaseHandle: ...

    @property
    def commands(self) -> Sequence[Command]: ...

    def undo(self, error: BaseException) -> Sequence[Command]: ...


_A_contra = TypeVar("_A_contra", bound=Adopting, contravariant=True)


class AdoptHost(Protocol[_A_contra, _L]):
    """What an adopt asks of its host: the nodes, the clock, the first contact, the
    quarantines learnt from refusals, and the lease it makes of a hand-off that held."""

    @property
    def nodes(self) -> flow.Nodes: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def contact(self) -> flow.Contact | None: ...

    def learn_quarantine(self, node: str, ms: int) -> None: ...

    def adopted(
        self,
        make: Callable[..., _L],
        adoption: _A_contra,
        results: Sequence[Any],
        start: float,
        end: float,
        validity: float,
    ) -> _L: ...


def adopt(
    host: AdoptHost[_A_contra, _L], make: Callable[..., _L], adoption: _A_contra
) -> Generator[Effect, Any, _L]:
    """Take over the lease ``adoption`` names: one hand-off round that must hear every node
    (the keys move to a new token on a quorum, keeping their expiry); the lease made by
    ``make`` through ``host.adopted``.

    Raises:
        LockLost: refused by a quorum, or nothing left of the lease's validity; whatever the
            new token took is freed.
        QuorumUnreachable: too few nodes answered to tell; the keys are handed back, so the
            same handle can be adopted again while its lease lasts.
    """
    contact = host.contact()
    if contact is not None:
        yield Round(contact.commands, b"PONG", contact.need)
    nodes = host.nodes
    size = nodes.size
    start = host.clock()
    try:
        exchange = yield Round(adoption.commands, flow.NEVER_YES, size, size - 1, True)
        end = host.clock()
        handle = adoption.handle
        results = exchange.results
        outcome = flow.judge_adopt(nodes, handle.name, handle.ttl, results, end - start)
        if isinstance(outcome, str):
            raise LockLost(handle.name, outcome)
        if isinstance(outcome, QuorumUnreachable):
            learn_quarantines(host, outcome.node_errors)
            raise outcome
        return host.adopted(make, adoption, results, start, end, outcome)
    except GeneratorExit:  # closed unfinished: nothing can be posted any more
        raise
    except BaseException as error:
        # Refused, unanswered or interrupted: nobody holds the new token.
        yield Post(adoption.undo(error))
        raise
