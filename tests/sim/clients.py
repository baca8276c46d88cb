"""A simulated client: the library's own procedures (``django_redlock.procedures``), driven by
the simulated world (``tests/sim/world.py``: the third driver, beside the sync and asyncio
ones), around the bookkeeping an application does (what to take, how long to hold it).

Each acquire is :func:`django_redlock.procedures.acquire.acquire`, the very generator the
managers run: every step of it is the shipped one. :class:`SimHost` stands where the engine
stands (the clock, the quarantine, the reporting), and tells the checker what the engine
would tell the observer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from django_redlock.core.engine import Adoption
from django_redlock.core.handle import LeaseHandle
from django_redlock.core.lease import BaseLease, held_on
from django_redlock.core.owner import owner_id
from django_redlock.exceptions import (
    LeaseNotExtended,
    LockLost,
    LockNotAcquired,
    QuorumUnreachable,
)
from django_redlock.procedures import acquire as acquire_procedure
from django_redlock.procedures import flow
from django_redlock.procedures import lease as lease_procedures
from django_redlock.procedures.options import Checked
from django_redlock.procedures.shapes import Many, ReadWrite, Shape, Slots
from django_redlock.wire.scripts import GRANTED, PING, Command
from tests.sim.world import Db, LeaseRecord, Round, SimClient, Sleep

Process = Generator[Any, Any, None]


class SimHost:
    """What the acquire procedure asks of the engine (``procedures.acquire.AcquireHost``),
    for one simulated client: its clock, its first contact, the quarantine its tries send
    (its max_ttl, raised by what nodes report), the first try (its owner record, its place in
    line from its clock), the reports (to the checker) and the lease (a :class:`Held`)."""

    def __init__(self, client: SimClient, owner: str, lifetime_ms: int) -> None:
        self.client = client
        self.world = client.world
        self.clock = client.now
        self.quarantine = self
        self.owner = owner
        self.lifetime_ms = lifetime_ms
        self.deadline: float | None = None
        self.pauses = 0
        self.attempt: flow.Acquire | None = None

    @property
    def ms(self) -> int:
        return self.client.quarantine_ms

    def contact(self) -> flow.Contact | None:
        nodes = self.world.flow_nodes
        if len(self.client.heard) < nodes.quorum:
            return flow.Contact([PING] * nodes.size, nodes.quorum)
        return None

    def first_try(self, name: str, checked: Checked, waiter: str, shape: Shape) -> flow.FirstTry:
        client = self.client
        started = client.now()
        self.pauses = client.pauses
        self.attempt = None
        # The checker's reading of the documented timeout (the deadline the acquire must end
        # by), not the procedure's (procedures.acquire.resume): so a wrong one is caught.
        wait = checked.wait
        self.deadline = None if (checked.blocking and wait is None) else started + (wait or 0.0)
        return flow.FirstTry(
            self.world.flow_nodes,
            name,
            shape.key,
            shape,
            checked.ttl,
            self.owner,
            checked.blocking,
            started,
            waiter,
            int((started + 1.7e9) * 1e6),
            self.lifetime_ms,
            client.quarantine_ms,
        )

    def uniform(self, low: float, high: float) -> float:
        return self.world.rng.uniform(low, high)

    def round_failed(self, attempt: flow.Acquire, step: flow.Failed) -> None:
        self.attempt = attempt
        if not attempt.hand:
            # A waiter taking grants keeps its token's keys while it waits (flow.judge):
            # checked once it left (acquire_ended).
            self.world.checker.failed_try(self.client, attempt.token)

    def gave_up(self, step: flow.Failed, origin: str | None) -> None:
        client = self.client
        attempt = self.attempt
        assert attempt is not None
        tries = attempt.attempts
        client.log(f"gave up {attempt.name} after {tries} tries: {show(client.last_results)}")

    @property
    def nodes(self) -> flow.Nodes:
        return self.world.flow_nodes

    def learn_quarantine(self, node: str, ms: int) -> None:
        client = self.client
        client.quarantine_ms = max(client.quarantine_ms, ms)

    def adopted(
        self,
        make: Callable[..., Held],
        adoption: Adoption,
        results: Sequence[Any],
        start: float,
        end: float,
        validity: float,
    ) -> Held:
        handle = adoption.handle
        self.world.checker.handed_off(handle.token, adoption.token)
        return make(
            handle.name,
            Shape(handle.key),
            "",
            adoption.token,
            end + validity,
            held_on(type(reply) is int and reply > 0 for reply in results),
            handle.ttl,
            ((handle.name, "x"),),
            self.client.round_began,
            handle.fencing_token,
        )

    # -- a held lease's side of its rounds (procedures.lease.LeaseHost, and core.lease's
    # release_round and settle_release), on a Held

    def expired_before_renewal(self, lease: Held, size: int) -> list[Command | None] | None:
        if lease.expires_at > self.client.now():
            return None
        lease.cause = flow.EXPIRED
        self.client.log(f"lease {lease.token[:8]} expired before its renewal")
        return lease.shape.clean_up(lease.token, None, size)

    def lost_error(self, lease: Held) -> LockLost:
        return LockLost(lease.name, "expired", lease.cause)

    def extend_round(self, lease: Held) -> list[Command]:
        return flow.extend_round(self.nodes.size, lease.shape, lease.token, lease.ttl, self.owner)

    def renewal_basis(self, lease: Held) -> tuple[float, float, tuple[bool, ...]]:
        return lease.ttl, lease.expires_at, lease.held

    def renewal_missed(self, lease: Held, missed: flow.Missed, now: float) -> LeaseNotExtended:
        self.client.log(f"renewal of {lease.token[:8]} missed: {show(self.client.last_results)}")
        return LeaseNotExtended(lease.name, missed.renewed, self.nodes.quorum)

    def renewal_lost(self, lease: Held, lost: flow.Lost, now: float) -> LockLost:
        lease.cause = lost.cause
        self.client.log(
            f"lease {lease.token[:8]} lost ({lost.cause}): {show(self.client.last_results)}"
        )
        assert lease.record is not None
        self.world.checker.lost(lease.record, lost.cause)
        return LockLost(lease.name, lost.reason, lost.cause)

    def renewed(self, lease: Held, validity: float, now: float, results: Sequence[Any]) -> float:
        client = self.client
        lease.expires_at = now + validity
        lease.held = held_on(flow.held_after_renewal(lease.held, results))
        assert lease.record is not None
        self.world.checker.renewed(lease.record, client.clock.when(lease.expires_at))
        client.log(f"renewed {lease.token[:8]}: {validity:.4f} s ({show(results)})")
        return validity

    def lost_clean_up(self, lease: Held, results: Sequence[Any]) -> list[Command | None]:
        return flow.lost_clean_up(lease.shape, lease.token, lease.cause, results)

    def release_round(self, lease: Held, size: int) -> tuple[list[Command], object, bool, bool]:
        shape = lease.shape
        command = shape.held_release(lease.token, lease.waiter)
        expired = lease.expires_at <= self.client.now()
        return [command] * size, shape.release_yes, expired, shape.release_identified

    def settle_release(
        self, lease: Held, results: Sequence[Any], deleted: int, expired: bool
    ) -> None:
        verdict = flow.judge_release(self.nodes, results, deleted, expired)
        self.client.log(
            f"released {lease.token[:8]}: {show(results)}"
            + (f"; lost: {verdict.lost}" if verdict.lost else "")
        )

    def owns_round(self, lease: Held, size: int) -> list[Command]:
        return flow.owns_round(size, lease.shape, lease.token)

    def validity(self, lease: Held) -> float:
        return max(0.0, lease.expires_at - self.client.now())

    def acquire_ended(self) -> None:
        """The procedure raised (gave up): its clean-ups are out; the checker judges them."""
        attempt = self.attempt
        client = self.client
        if attempt is None:
            return
        if attempt.hand:
            self.world.checker.failed_try(client, attempt.token)
        paused = client.pauses != self.pauses
        self.world.checker.gave_up(client, attempt.name, self.deadline, client.now(), paused)

    def grant(
        self,
        make: Callable[..., Held],
        attempt: flow.Acquire | flow.FirstTry,
        acquired_at: float,
        expires_at: float,
        results: Sequence[Any],
        scope: tuple[object, ...],
        checked: Checked,
    ) -> Held:
        client = self.client
        world = self.world
        began = client.round_began
        if results is not client.last_results:
            # Held from hand-off grants (Acquire.granted_results builds a new list): its keys
            # date from the rounds the grants name, not from the last try. A quorum of them
            # was set no earlier than the quorum-th latest of those rounds' sends (the
            # validity's base); a force release that landed after that send may have deleted
            # them before this waiter heard its grants, so the checker must see that time.
            assert isinstance(attempt, flow.Acquire)
            client.log(f"handed {attempt.name} ({attempt.votes} grants)")
            since = sorted(attempt.held_since.values(), reverse=True)
            began = client.clock.when(since[world.flow_nodes.quorum - 1])
        paused = client.pauses != self.pauses
        world.checker.ended(client, attempt.name, self.deadline, acquired_at, paused)
        shape = attempt.shape
        assert shape is not None
        return make(
            attempt.name,
            shape,
            attempt.waiter,
            attempt.token,
            expires_at,
            held_on(shape.granted_on(results)),
            checked.ttl,
            (),
            began,
        )


def client_process(client: SimClient) -> Process:
    world = client.world
    config = world.config
    rng = world.rng
    # A new process: its own max_ttl, raised as its connections hear the nodes' (core/engine.py
    # Quarantine), the first of them before its first acquire (the flow's Contact).
    max_ttl = config.client_max_ttl(client.index)
    client.quarantine_ms = math.ceil(max_ttl * 1000)
    client.heard = set()
    lifetime_ms = math.ceil(max(1.0, 4 * config.retry_delay) * 1000)
    record = f'{{"host":"sim","pid":{client.index},"acquired_at":'
    owner = f"{owner_id(record)}rs {record}"  # as OwnerRecords.record makes it (at 1 s)
    host = client.host = SimHost(client, owner, lifetime_ms)
    while world.now < config.seconds and client.alive:
        if world.handles and rng.random() < 0.5:  # a handle left by lease.handle()
            handle = world.handles.pop(rng.randrange(len(world.handles)))
            yield from adopt(client, handle, owner)
            yield Sleep(rng.uniform(0.0, 2 * config.retry_delay))
            continue
        name, shape, claims = choose(client)
        blocking = rng.random() < 0.7
        wait = rng.choice((0.0, 0.1, 0.5, 2.0)) if blocking else None
        ttl = max_ttl if rng.random() < config.longest else config.ttl
        checked = Checked(ttl, blocking, wait, False, None, None)
        client.log(f"acquire {name} blocking={blocking} timeout={wait} ttl={ttl}")
        try:
            # Through the module, where a mutant (tests/sim/mutants.py) may stand in for it.
            lease = yield from acquire_procedure.acquire(
                host, Held, name, shape, (), checked, client.listens
            )
        except LockNotAcquired:
            host.acquire_ended()
            yield Sleep(rng.uniform(0.0, 2 * config.retry_delay))
            continue
        lease.claims = claims
        yield from hold(client, lease, owner)
        yield Sleep(rng.uniform(0.0, 2 * config.retry_delay))


@dataclass
class Held:
    """A lease a client holds: what ``hold`` needs of it, from an acquire or an adopt."""

    name: str
    shape: Shape
    waiter: str
    token: str
    expires_at: float  # on the client's clock
    held: tuple[bool, ...]  # the nodes that hold it (core/lease.py: held_on)
    ttl: float
    claims: tuple[tuple[str, str], ...]
    began: float  # virtual time its granting round (an acquire's last, an adopt's) was sent
    fencing: int | None = None  # the fencing token (a handle carries the giver's)
    record: LeaseRecord | None = None  # what the checker watches of it, once held
    cause: str = ""  # why it was lost (flow.EXPIRED, TAKEN, GONE), once lost


def hold(client: SimClient, lease: Held, owner: str) -> Process:
    """Hold a granted lease for a while (renewed or not; writing to its fenced row, for a
    lock), then release it, or hand it off to be adopted (``lease.handle()``)."""
    world = client.world
    config = world.config
    rng = world.rng
    host = client.host
    assert isinstance(host, SimHost)
    shape = lease.shape
    token = lease.token
    ttl = lease.ttl
    record = lease.record = world.checker.granted(
        client, lease.name, token, client.clock.when(lease.expires_at), lease.claims, lease.began
    )
    client.log(f"holds {lease.name} token {token[:8]} until {lease.expires_at:.4f} (its clock)")
    plain = type(shape) is Shape
    # lock_for(instance) on a FencedModel: the row's token is minted once the lock is held
    # (an adopter writes under the giver's token, which its handle carries).
    if plain and lease.fencing is None and rng.random() < config.fenced:
        lease.fencing = yield Db("mint", lease.name)
    gap = config.writes * ttl
    next_write = client.now() + rng.expovariate(1.0 / gap) if lease.fencing else math.inf
    renew = rng.random() < config.auto_extend
    hold_for = rng.choice((0.1, 0.3, 0.8, 2.0, 4.0)) * ttl
    release_at = client.now() + hold_for
    lost = False
    next_due = client.now() + ttl / 3 if renew else math.inf  # the extender (core/extender.py)
    while True:
        yield Sleep(min(release_at, next_due, next_write) - client.now())
        if client.now() >= release_at:
            break
        if client.now() >= next_write:
            # A save() in the block, whenever the application gets to it: a GC pause may
            # have let the lease run out meanwhile, which only the fence can catch.
            assert lease.fencing is not None
            if not (yield Db("write", lease.name, lease.fencing)):
                client.log(f"stale fencing token {lease.fencing}: leaves the block")
                break  # StaleFencingToken: the block ends, the lock is released
            next_write = client.now() + rng.expovariate(1.0 / gap)
            continue
        # BaseLease.renew_once -> the extend procedure (procedures.lease.extend)
        try:
            yield from lease_procedures.extend(host, lease)
        except LeaseNotExtended:
            left = max(0.0, lease.expires_at - client.now())
            next_due = client.now() + BaseLease._retry_in(SimpleNamespace(ttl=ttl), left)  # type: ignore[arg-type]
            continue
        except LockLost:
            lost = True
            break
        next_due = client.now() + ttl / 3
    if lost:
        return
    expired = lease.expires_at <= client.now()
    world.checker.releasing(record)
    if plain and not expired and rng.random() < config.handoffs:
        hand_off(client, lease, owner)
        return
    # The release (core.lease's release_round and settle_release, as Engine.release carries
    # them out: a lock's release names its connection's server process, so a hand-off grant
    # needs no INFO call).
    nodes = world.flow_nodes
    commands, yes, expired, identify = host.release_round(lease, nodes.size)
    exchange = yield Round(commands, yes, nodes.quorum, None, identify, True)
    host.settle_release(lease, exchange.results, exchange.yes, expired)


def hand_off(client: SimClient, lease: Held, owner: str) -> None:
    """``lease.handle()``: let go at once, with no I/O, and leave the handle for another
    process to adopt. A renewal may still be in flight, and this sim's giver, unlike the
    library's, later sends a stray release of its token too: once adopted, the nodes must
    refuse both (the hand-off invariant)."""
    world = client.world
    size = world.flow_nodes.size
    handle = LeaseHandle(
        name=lease.name,
        key=lease.shape.key,
        token=lease.token,
        ttl=lease.ttl,
        fencing_token=lease.fencing,
    )
    world.handles.append(handle)
    client.log(f"handed off {lease.name} token {lease.token[:8]}")
    rng = world.rng
    if rng.random() < 0.5:
        world.clean_up(client, flow.extend_round(size, lease.shape, lease.token, lease.ttl, owner))
    if rng.random() < 0.5:
        stray = flow.release_round(size, lease.shape, lease.token)
        world.at(
            world.now + rng.uniform(0.2, 2.0) * lease.ttl,
            lambda: world.clean_up(client, stray) if client.alive else None,
        )


def adopt(client: SimClient, handle: LeaseHandle, owner: str) -> Process:
    """``LockManager.adopt``: the shipped adopt procedure (``procedures.lease.adopt``: one
    hand-off round that must hear every node, judged by ``flow.judge_adopt``; a failed adopt
    frees the new token or hands the keys back, as ``Adoption.undo`` picks). Then the lease
    is held."""
    world = client.world
    size = world.flow_nodes.size
    token = vars(flow)["secrets"].token_hex(20)
    quarantine_ms = client.quarantine_ms
    adoption = Adoption(
        handle,
        token,
        flow.handoff_round(size, handle.key, handle.token, token, owner, quarantine_ms),
        flow.release_round(size, Shape(handle.key), token),
        flow.handback_round(size, handle.key, token, handle.token, quarantine_ms),
        (),
        False,
        None,
        None,
    )
    client.log(f"adopts {handle.name} from token {handle.token[:8]}")
    host = client.host
    assert isinstance(host, SimHost)
    try:
        lease = yield from lease_procedures.adopt(host, Held, adoption)
    except LockLost as error:
        client.log(f"adopt of {handle.name} failed: {str(error)[:60]}")
        return
    except QuorumUnreachable:
        client.log(f"adopt of {handle.name} unreachable: handed back")
        return
    yield from hold(client, lease, owner)


def choose(client: SimClient) -> tuple[str, Shape, tuple[tuple[str, str], ...]]:
    """What the next acquire takes: (its name in the history, its shape, what it claims)."""
    world = client.world
    config = world.config
    rng = world.rng
    kind = rng.choice(config.kinds)
    name = f"lock{rng.randrange(config.names)}"
    key = "redlock:" + name
    if kind == "semaphore":
        name = f"sem(limit {config.limit})"
        return name, Slots("redlock:sem", config.limit, config.nodes), (("sem", "s"),)
    if kind in ("read", "write"):
        claim = "r" if kind == "read" else "x"
        return f"{kind} {name}", ReadWrite(key, "r" if kind == "read" else "w"), ((name, claim),)
    if kind == "many" and config.names > 1:
        names = sorted(rng.sample([f"lock{i}" for i in range(config.names)], 2))
        shape = Many(["redlock:" + n for n in names])
        return " + ".join(names), shape, tuple((n, "x") for n in names)
    return name, Shape(key), ((name, "x"),)


def show(results: Sequence[Any]) -> str:
    """A round's replies, short."""
    parts = []
    for reply in results:
        if reply == GRANTED:
            parts.append("OK")
        elif isinstance(reply, Exception):
            text = str(reply)
            parts.append(text.split(" ", 1)[0] if text.startswith("QUARANTINED") else text[:24])
        else:
            parts.append(repr(reply))
    return "[" + ", ".join(parts) + "]"


__all__ = ["Held", "LeaseRecord", "adopt", "choose", "client_process", "hand_off", "hold", "show"]
