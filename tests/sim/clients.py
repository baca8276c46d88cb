"""A simulated client: the managers' glue around the real flow functions, as a generator.

Each step below is the one ``LockManager`` takes (``core/manager.py``: ``_rounds``;
``core/engine.py``: ``renew``, ``release``; ``core/lease.py``: the settling of rounds and
``renew_once``), in the same order; every decision is the library's own function. A client
yields a :class:`~tests.sim.world.Round` to send one command per node and wait for the
round's outcome, or a :class:`~tests.sim.world.Sleep`.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from django_redlock.core import flow
from django_redlock.core.handle import LeaseHandle
from django_redlock.core.lease import BaseLease, held_on
from django_redlock.core.owner import owner_id
from django_redlock.core.shapes import Many, ReadWrite, Shape, Slots
from django_redlock.exceptions import QuorumUnreachable
from django_redlock.wire.scripts import GRANTED, PING
from tests.sim.world import Db, LeaseRecord, Round, SimClient, Sleep, Wait

Process = Generator[Any, Any, None]


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
    while world.now < config.seconds and client.alive:
        if len(client.heard) < world.flow_nodes.quorum:
            yield Round([PING] * world.flow_nodes.size, b"PONG", world.flow_nodes.quorum)
            if len(client.heard) < world.flow_nodes.quorum:
                yield Sleep(config.retry_delay)  # too few nodes up: try again later
            continue
        if world.handles and rng.random() < 0.5:  # a handle left by lease.handle()
            handle = world.handles.pop(rng.randrange(len(world.handles)))
            yield from adopt(client, handle, owner)
            yield Sleep(rng.uniform(0.0, 2 * config.retry_delay))
            continue
        name, shape, claims = choose(client)
        key = shape.key
        blocking = rng.random() < 0.7
        wait = rng.choice((0.0, 0.1, 0.5, 2.0)) if blocking else None
        ttl = max_ttl if rng.random() < config.longest else config.ttl
        client.waiters += 1
        # A blocking acquire queues, except for a shape that never does (it polls).
        queues = blocking and shape.wake_key is not None
        waiter = f"c{client.index}.{client.waiters}" if queues else ""
        started = client.now()
        pauses = client.pauses
        # The managers' first try (LockManager._take): the first round without the flow,
        # which takes over (Engine.resume) only when that round did not win.
        first = flow.FirstTry(
            world.flow_nodes,
            name,
            key,
            shape,
            ttl,
            owner,
            blocking,
            started,
            waiter,
            int((client.now() + 1.7e9) * 1e6),
            lifetime_ms,
            client.quarantine_ms,
        )
        deadline = None if (blocking and wait is None) else started + (wait or 0.0)
        attempt = flow.Acquire.after_first(first, deadline, True, rng.uniform)
        client.log(f"acquire {name} blocking={blocking} timeout={wait} ttl={ttl}")
        granted: flow.Granted | None = None
        results: Sequence[Any] = ()
        listening = False
        first_round = True
        while True:
            if first_round:
                round_ = Round(first.commands, first.decider, first.need, identify=True)
            else:
                commands = attempt.next_round(client.quarantine_ms)
                round_ = Round(commands, attempt.decider, attempt.need, identify=True)
            began = world.now
            start = client.now()
            exchange = yield round_
            end = client.now()
            results = exchange.results
            if first_round:
                first_round = False
                valid = first.judge(results, exchange.yes, start, end)
                if valid:
                    # Won at the first try: the lease without the flow's judge (the
                    # checker still hears of the try and of its end, as for any other).
                    world.checker.tried(client, attempt, results)
                    strays = shape.won(first.token, results)
                    if strays is not None:
                        world.clean_up(client, strays)
                    world.checker.ended(client, attempt, end, client.pauses != pauses)
                    granted = flow.Granted(first.token, end, end + valid)
                    break
            step = attempt.judge(results, exchange.yes, start, end)
            world.checker.tried(client, attempt, results)
            if isinstance(step, flow.Granted):
                strays = attempt.strays(results)
                if strays is not None:
                    world.clean_up(client, strays)
                world.checker.ended(client, attempt, end, client.pauses != pauses)
                granted = step
                break
            world.clean_up(client, step.clean_up)
            if not attempt.hand:
                # A waiter taking grants keeps its token's keys while it waits (flow.judge):
                # checked once it left, below.
                world.checker.failed_try(client, attempt.token, step.clean_up, results)
            # Engine.failed: a node that has seen a longer quarantine refused with it.
            for ms in flow.longer_quarantines(step.error.node_errors).values():
                client.quarantine_ms = max(client.quarantine_ms, ms)
            if step.give_up:
                client.log(f"gave up {name} after {attempt.attempts} tries: {show(results)}")
                left = attempt.left_line()
                if left is not None:
                    world.clean_up(client, left)
                if attempt.hand:
                    world.checker.failed_try(client, attempt.token, step.clean_up, results)
                world.checker.gave_up(client, attempt, end, client.pauses != pauses)
                break
            # LockManager._rounds: a client given a sleep function sleeps the delay; otherwise
            # a try that never queues polls, and a waiter in line hears its turn (pub/sub),
            # right after its first try as a listener, then waits up to the delay.
            if not client.listens or not waiter:
                yield Sleep(step.delay)
                if client.listens:
                    attempt.waited(False)
            elif not listening:
                listening = True  # subscribed: the next try covers a release meanwhile
            else:
                # A waiter taking hand-off grants also ends its wait at a quorum of them, and
                # may then hold without a round (LockManager._wait).
                need = world.flow_nodes.quorum if attempt.hand else 0
                attempt.waited((yield Wait(step.delay, waiter, need)))
                if need:
                    held = attempt.hear_grants(client.grants.pop(waiter, {}), client.now())
                    if held is not None:
                        client.log(f"handed {name} ({attempt.votes} grants)")
                        results = attempt.granted_results()
                        # Its keys date from the rounds the grants name, not from the last
                        # try: a quorum of them was set no earlier than the quorum-th latest
                        # of those rounds' sends (the validity's base). A force release that
                        # landed after that send may have deleted them before this waiter
                        # heard its grants, so the checker must see that time.
                        since = sorted(attempt.held_since.values(), reverse=True)
                        began = client.clock.when(since[world.flow_nodes.quorum - 1])
                        world.checker.ended(client, attempt, client.now(), client.pauses != pauses)
                        granted = held
                        break
        if granted is None:
            yield Sleep(rng.uniform(0.0, 2 * config.retry_delay))
            continue
        lease = Held(
            name,
            shape,
            waiter,
            granted.token,
            granted.expires_at,
            held_on(shape.granted_on(results)),
            ttl,
            claims,
            began,
        )
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


def hold(client: SimClient, lease: Held, owner: str) -> Process:
    """Hold a granted lease for a while (renewed or not; writing to its fenced row, for a
    lock), then release it, or hand it off to be adopted (``lease.handle()``)."""
    world = client.world
    config = world.config
    rng = world.rng
    nodes = world.flow_nodes
    shape = lease.shape
    token = lease.token
    ttl = lease.ttl
    expires_at = lease.expires_at
    held = lease.held
    record = world.checker.granted(
        client, lease.name, token, client.clock.when(expires_at), lease.claims, lease.began
    )
    client.log(f"holds {lease.name} token {token[:8]} until {expires_at:.4f} (its clock)")
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
        # BaseLease.renew_once -> LockManager._extend
        if expires_at <= client.now():  # _expired_before_renewal
            world.clean_up(client, shape.clean_up(token, None, nodes.size))
            client.log(f"lease {token[:8]} expired before its renewal")
            lost = True
            break
        commands = flow.extend_round(nodes.size, shape, token, ttl, owner)
        start = client.now()
        exchange = yield Round(commands, 1, nodes.quorum, nodes.size)
        now = client.now()
        outcome = flow.judge_extend(nodes, ttl, expires_at, start, now, exchange.results, held)
        if isinstance(outcome, flow.Lost):
            world.clean_up(
                client, flow.lost_clean_up(shape, token, outcome.cause, exchange.results)
            )
            client.log(f"lease {token[:8]} lost ({outcome.cause}): {show(exchange.results)}")
            world.checker.lost(record, outcome.cause)
            lost = True
            break
        if isinstance(outcome, flow.Missed):
            client.log(f"renewal of {token[:8]} missed: {show(exchange.results)}")
            left = max(0.0, expires_at - now)
            next_due = now + BaseLease._retry_in(SimpleNamespace(ttl=ttl), left)  # type: ignore[arg-type]
            continue
        expires_at = now + outcome
        previous = held
        held = held_on(
            reply in (1, 2) if type(reply) is int else previous[i]
            for i, reply in enumerate(exchange.results)
        )
        next_due = now + ttl / 3
        world.checker.renewed(record, client.clock.when(expires_at))
        client.log(f"renewed {token[:8]}: {outcome:.4f} s ({show(exchange.results)})")
    if lost:
        return
    expired = expires_at <= client.now()
    world.checker.releasing(record)
    if plain and not expired and rng.random() < config.handoffs:
        hand_off(client, lease, owner)
        return
    # LockManager._release (lease.release_round: a lock's release names its connection's
    # server process, so a hand-off grant needs no INFO call)
    exchange = yield Round(
        [shape.held_release(token, lease.waiter)] * nodes.size,
        shape.release_yes,
        nodes.quorum,
        identify=shape.release_identified,
    )
    verdict = flow.judge_release(nodes, exchange.results, exchange.yes, expired)
    client.log(
        f"released {token[:8]}: {show(exchange.results)}"
        + (f"; lost: {verdict.lost}" if verdict.lost else "")
    )


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
    """``LockManager.adopt``: one hand-off round that must hear every node, judged by
    ``flow.judge_adopt``; a failed adopt frees the new token (the lease is gone) or hands the
    keys back (too few answers), as ``_Adoption.undo`` does. Then the lease is held."""
    world = client.world
    nodes = world.flow_nodes
    size = nodes.size
    token = vars(flow)["secrets"].token_hex(20)
    quarantine_ms = client.quarantine_ms
    shape = Shape(handle.key)
    client.log(f"adopts {handle.name} from token {handle.token[:8]}")
    began = world.now
    start = client.now()
    exchange = yield Round(
        flow.handoff_round(size, handle.key, handle.token, token, owner, quarantine_ms),
        flow.NEVER_YES,
        size,
        size - 1,
        identify=True,
    )
    end = client.now()
    results = exchange.results
    outcome = flow.judge_adopt(nodes, handle.name, handle.ttl, results, end - start)
    if isinstance(outcome, str):  # LockLost
        world.clean_up(client, flow.release_round(size, shape, token))
        client.log(f"adopt of {handle.name} failed: {outcome[:40]} {show(results)}")
        return
    if isinstance(outcome, QuorumUnreachable):
        world.clean_up(
            client, flow.handback_round(size, handle.key, token, handle.token, quarantine_ms)
        )
        client.log(f"adopt of {handle.name} unreachable: handed back {show(results)}")
        return
    world.checker.handed_off(handle.token, token)
    lease = Held(
        handle.name,
        shape,
        "",
        token,
        end + outcome,
        held_on(type(reply) is int and reply > 0 for reply in results),
        handle.ttl,
        ((handle.name, "x"),),
        began,
        handle.fencing_token,
    )
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
