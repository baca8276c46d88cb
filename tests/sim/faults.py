"""The faults of a history, all drawn from its seed (Poisson arrivals over its seconds).

Within the model (the library must stay safe under any number of them): message delay and
reordering between connections (every message has its own delay; a connection stays FIFO),
late messages (up to 4 node timeouts), lost messages; node pauses (short, or longer than a
lease) and crashes with each persistence mode (AOF fsync always, AOF everysec losing up to
its last second, an RDB snapshot from earlier, empty); failovers (a replica up for long, up
to a second behind its master, promoted in its place, some crashing soon after: profile
'failovers'); client GC pauses (up to 2.5 ttl) and client crashes (it comes back later as a
new process); clock drift within the bound (set when the clocks are made, ``world.py``).

Outside the model, only when asked (the checker then reports violations as expected): node
clock jumps beyond the drift bound, and an operator's ``declare_fresh`` right after a lossy
restart (``world.World.restart_node``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

from tests.sim.world import World


def plan(world: World) -> list[tuple[float, Callable[[], None]]]:
    """The history's faults, in the order drawn: (virtual time, what happens). They come
    from a generator of their own (the seed's), so that dropping some of them (``shrink`` in
    run.py) leaves the others as they were."""
    config = world.config
    rng = random.Random(world.seed ^ 0xFA0175)
    out: list[tuple[float, Callable[[], None]]] = []
    t = 0.0
    if config.node_faults:
        while True:
            t += rng.expovariate(config.node_faults)
            if t >= config.seconds:
                break
            node = rng.choice(world.nodes)
            kind = rng.random()
            if kind < 0.4:
                seconds = rng.uniform(0.005, 3 * config.node_timeout)
                out.append((t, partial(world.pause_node, node, seconds)))
            elif kind < 0.55:
                seconds = rng.uniform(0.5, 2.0) * config.ttl
                out.append((t, partial(world.pause_node, node, seconds)))
            else:
                seconds = rng.uniform(0.02, 1.5) * config.max_ttl
                mode = rng.choice(config.persistence) if rng.random() < 0.3 else None
                out.append((t, partial(world.crash_node, node, seconds, mode)))
    t = 0.0
    if config.client_faults:
        while True:
            t += rng.expovariate(config.client_faults)
            if t >= config.seconds:
                break
            client = rng.choice(world.clients)
            if rng.random() < 0.7:
                seconds = rng.uniform(0.1, 2.5) * config.ttl
                out.append((t, partial(world.pause_client, client, seconds)))
            else:
                seconds = rng.uniform(0.2, 2.0)
                out.append((t, partial(world.crash_client, client, seconds)))
    t = 0.0
    if config.force_releases:
        while True:
            t += rng.expovariate(config.force_releases)
            if t >= config.seconds:
                break
            name = f"lock{rng.randrange(config.names)}"
            out.append((t, partial(world.force_release, name)))
    # SCRIPT FLUSH in some histories (drawn after the rest, so that those stay as they were).
    if config.node_faults and rng.random() < 0.3:
        for _ in range(rng.randint(1, 4)):
            node = rng.choice(world.nodes)
            out.append((rng.uniform(0, config.seconds), partial(world.flush_scripts, node)))
    if config.failovers:
        # A failover (drawn after the rest, with a generator of its own, so that those stay as
        # they were): the master dies, a replica up for long, some writes behind, takes its
        # place after the time a Sentinel or a managed service takes to promote it.
        failover_rng = random.Random(world.seed ^ 0xFA1107E5)
        # Some promoted replicas crash soon after (a cascade: whatever killed the master), and
        # restart from their own AOF (a generator of its own again, for the same reason).
        cascade_rng = random.Random(world.seed ^ 0xCA5CADE)
        t = 0.0
        while True:
            t += failover_rng.expovariate(config.failovers)
            if t >= config.seconds:
                break
            node = failover_rng.choice(world.nodes)
            seconds = failover_rng.uniform(0.01, 0.5) * config.ttl
            lag = failover_rng.uniform(0.0, 1.0)
            out.append((t, partial(world.fail_over, node, seconds, lag)))
            if cascade_rng.random() < 0.3:
                crash = t + seconds + cascade_rng.uniform(0.05, 1.0) * config.ttl
                down = cascade_rng.uniform(0.02, 0.3) * config.ttl
                out.append((crash, partial(world.crash_node, node, down, None)))
    if config.clock_jumps:
        for _ in range(rng.randint(1, 3)):
            node = rng.choice(world.nodes)
            jump = rng.uniform(0.2, 1.5) * config.ttl
            out.append((rng.uniform(0, config.seconds), partial(world.jump_clock, node, jump)))
    return out


def schedule(world: World) -> None:
    """Put the planned faults on the world's queue, but those ``world.dropped`` names."""
    for index, (when, action) in enumerate(plan(world)):
        if index not in world.dropped:
            world.faults += 1
            world.at(when, action)
