"""A simulated client: the managers' glue around the real flow functions, as a generator.

Each step below is the one ``LockManager`` takes (``redlock.py``: ``_rounds``, ``_extend``,
``_release``; ``core/lease.py``: ``_settle_extend``, ``_expired_before_renewal``,
``renew_once``), in the same order; every decision is the library's own function. A client
yields a :class:`~tests.sim.world.Round` to send one command per node and wait for the
round's outcome, or a :class:`~tests.sim.world.Sleep`.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from types import SimpleNamespace
from typing import Any

from django_redlock.core import flow
from django_redlock.core.lease import BaseLease, held_on
from django_redlock.core.owner import owner_id
from django_redlock.core.shapes import Many, ReadWrite, Shape, Slots
from django_redlock.wire.scripts import GRANTED
from tests.sim.world import LeaseRecord, Round, SimClient, Sleep, Wait

Process = Generator[Any, Any, None]


def client_process(client: SimClient) -> Process:
    world = client.world
    config = world.config
    rng = world.rng
    quarantine_ms = math.ceil(config.max_ttl * 1000)
    lifetime_ms = math.ceil(max(1.0, 4 * config.retry_delay) * 1000)
    record = f'{{"host":"sim","pid":{client.index},"acquired_at":'
    owner = f"{owner_id(record)}rs {record}"  # as OwnerRecords.record makes it (at 1 s)
    while world.now < config.seconds and client.alive:
        name, shape, claims = choose(client)
        key = shape.key
        blocking = rng.random() < 0.7
        wait = rng.choice((0.0, 0.1, 0.5, 2.0)) if blocking else None
        ttl = config.ttl if rng.random() < 0.7 else config.max_ttl
        client.waiters += 1
        # A blocking acquire queues, except for a shape that never does (it polls).
        queues = blocking and shape.wake_key is not None
        waiter = f"c{client.index}.{client.waiters}" if queues else ""
        started = client.now()
        pauses = client.pauses
        attempt = flow.Acquire(
            world.flow_nodes,
            name,
            key,
            ttl,
            owner,
            blocking,
            started,
            None if (blocking and wait is None) else started + (wait or 0.0),
            waiter,
            int((client.now() + 1.7e9) * 1e6),
            lifetime_ms,
            uniform=rng.uniform,
            shape=shape,
        )
        client.log(f"acquire {name} blocking={blocking} timeout={wait} ttl={ttl}")
        granted: flow.Granted | None = None
        results: Sequence[Any] = ()
        listening = False
        while True:
            commands = attempt.next_round(quarantine_ms)
            start = client.now()
            exchange = yield Round(commands, attempt.decider, attempt.need, identify=True)
            end = client.now()
            results = exchange.results
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
            world.checker.failed_try(client, attempt.token, step.clean_up, results)
            if step.give_up:
                client.log(f"gave up {name} after {attempt.attempts} tries: {show(results)}")
                left = attempt.left_line()
                if left is not None:
                    world.clean_up(client, left)
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
                attempt.waited((yield Wait(step.delay, waiter)))
        if granted is None:
            yield Sleep(rng.uniform(0.0, 2 * config.retry_delay))
            continue
        yield from hold(client, attempt, granted, results, ttl, owner, claims)
        yield Sleep(rng.uniform(0.0, 2 * config.retry_delay))


def hold(
    client: SimClient,
    attempt: flow.Acquire,
    granted: flow.Granted,
    results: Sequence[Any],
    ttl: float,
    owner: str,
    claims: tuple[tuple[str, str], ...],
) -> Process:
    """Hold a granted lease for a while (renewed or not), then release it."""
    world = client.world
    config = world.config
    rng = world.rng
    nodes = world.flow_nodes
    shape: Shape = attempt.kind
    token = granted.token
    expires_at = granted.expires_at
    held = held_on(shape.granted_on(results))
    record = world.checker.granted(
        client, attempt.name, token, client.clock.when(expires_at), claims
    )
    client.log(
        f"holds {attempt.name} token {token[:8]} for "
        f"{granted.expires_at - granted.acquired_at:.4f} s ({show(results)})"
    )
    renew = rng.random() < config.auto_extend
    hold_for = rng.choice((0.1, 0.3, 0.8, 2.0, 4.0)) * ttl
    release_at = client.now() + hold_for
    lost = False
    next_due = client.now() + ttl / 3  # the extender's schedule (core/extender.py)
    while renew:
        yield Sleep(min(release_at, next_due) - client.now())
        if client.now() >= release_at:
            break
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
    if not renew:
        yield Sleep(release_at - client.now())
    # LockManager._release
    expired = expires_at <= client.now()
    world.checker.releasing(record)
    exchange = yield Round(
        flow.release_round(nodes.size, shape, token, attempt.waiter),
        shape.release_yes,
        nodes.quorum,
    )
    verdict = flow.judge_release(nodes, exchange.results, exchange.yes, expired)
    client.log(
        f"released {token[:8]}: {show(exchange.results)}"
        + (f"; lost: {verdict.lost}" if verdict.lost else "")
    )


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


__all__ = ["LeaseRecord", "choose", "client_process", "hold", "show"]
