"""The simulated world: virtual time, a seeded event queue, nodes, connections and clients.

One seed makes one history. The configuration, message delays, the clients' choices and
their retry jitter come from ``random.Random(seed)``; the planned faults (``faults.plan``)
and the lease tokens (``run.seeded_tokens``) from generators of their own, derived from the
seed. Nothing reads the real clock, so the same seed gives the same history, step for step.

The clients run the managers' real decision code (``procedures/flow.py``,
``procedures/shapes.py``): the commands of each round are the ``Command`` bytes the library
builds, sent to the simulated nodes, which run the real Lua scripts
(``tests/sim/lua_node.py``); the replies are judged by the library's functions
(``Acquire.judge``, ``judge_extend``, ``lost_clean_up``, ``judge_release``). What the sim
writes itself is only the glue the managers add around those functions (``core/manager.py``:
``_rounds``; ``core/engine.py``: ``renew``, ``release``), step by step in the same order,
and the transport's round semantics (``wire/rounds.py``: ``Round``).
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django_redlock.procedures import flow
from django_redlock.procedures.effects import Grants, Listen, Post, Round, Sleep, Subscribe, Wait
from django_redlock.wire import primitives, rounds, scripts
from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError, NotSent
from django_redlock.wire.stall import stall_limits
from tests.sim.fence import Table
from tests.sim.invariants import Checker
from tests.sim.lua_node import Hash, Keyspace, LuaEngine, Server

# The scripts the fair-line invariant watches (a lock's line: acquire.lua grants to its head;
# these free the lock or move the head, and must wake the new head: wake_next.lua).
_ACQUIRE = scripts.ACQUIRE.sha
_WAKERS = frozenset(
    (
        scripts.RELEASE.sha,
        scripts.FORCE_RELEASE.sha,
        scripts.LEAVE.sha,
        scripts.HAND_YIELD.sha,
        scripts.HAND_UNDO.sha,
    )
)
_HANDOFF = primitives.HANDOFF.sha
# A lock waiter's acquire is over on a node once its leave or release ran there (the phantom
# holder invariant: Checker.granted_after_end).
_LEAVE = scripts.LEAVE.sha
_RELEASE = scripts.RELEASE.sha
_ACQUIRE_MANY = primitives.ACQUIRE_MANY.sha
_NODE_KEY = scripts.NODE_KEY.encode()
# What a new connection loads with SCRIPT LOAD before anything else (wire.setup).
_PRELOADED = frozenset(script.sha for script in primitives.PRELOAD)
_NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."

# -- configuration ---------------------------------------------------------------------------

KINDS = ("lock", "lock", "lock", "semaphore", "read", "write", "many")
"""What a client takes, one drawn per acquire: a lock, a slot of a semaphore, a read or a write
lease of the read-write lock of a lock's name (the writer is the lock's own key), or several
locks at once (the very keys of the locks)."""

PERSISTENCE = ("always", "everysec", "rdb", "empty")
"""How a crashed node comes back: AOF with fsync always (nothing lost), AOF everysec (its
last second lost), an RDB snapshot from earlier, or empty."""


@dataclass
class Config:
    """One history's parameters (drawn from the seed by :func:`draw_config`)."""

    nodes: int = 3
    clients: int = 3
    names: int = 1
    seconds: float = 8.0  # simulated seconds of load
    ttl: float = 1.0
    max_ttl: float = 1.0
    node_timeout: float = 0.05
    retry_delay: float = 0.05
    drift_factor: float = 0.01
    latency: float = 0.002  # mean one-way delay, seconds
    late: float = 0.01  # chance a message is late (up to 4 node timeouts)
    loss: float = 0.002  # chance a message is lost
    node_faults: float = 0.3  # node faults (pause, crash) per simulated second
    client_faults: float = 0.1  # client GC pauses and crashes per simulated second
    persistence: tuple[str, ...] = PERSISTENCE
    clock_jumps: bool = False  # node clock jumps beyond the drift bound: violations expected
    operator_errors: bool = False  # declare_fresh right after a lossy restart: expected too
    auto_extend: float = 0.5  # chance a lease is renewed while held
    kinds: tuple[str, ...] = KINDS  # what the clients take (one drawn per acquire)
    limit: int = 2  # the semaphore's slots
    listen: float = 0.5  # chance a client hears wake-ups (pub/sub) instead of sleeping
    clock_edges: bool = False  # clocks at the edges of the drift bound, not within it
    fenced: float = 0.5  # chance a lock's holder writes to its fenced row (tests/sim/fence.py)
    writes: float = 0.2  # mean seconds between a fenced holder's writes, as a share of ttl
    handoffs: float = 0.15  # chance a lock's holder hands it off (lease.handle()) to adopt
    force_releases: float = 0.0  # operator force releases (admin) per simulated second
    long_max_ttl: float = 0.0  # >0: the odd clients' max_ttl (a larger quarantine than the rest)
    longest: float = 0.3  # chance an acquire takes its client's max_ttl rather than the ttl
    failovers: float = 0.0  # promotions of a lagging replica per simulated second (faults.py)

    @property
    def quorum(self) -> int:
        return self.nodes // 2 + 1

    def client_max_ttl(self, index: int) -> float:
        """Client ``index``'s ``max_ttl``: its longest lease, and its own quarantine."""
        return self.long_max_ttl if self.long_max_ttl and index % 2 else self.max_ttl

    @property
    def longest_ttl(self) -> float:
        return max(self.max_ttl, self.long_max_ttl)


def draw_config(
    rng: random.Random,
    *,
    clock_jumps: bool = False,
    operator_errors: bool = False,
    profile: str = "mix",
) -> Config:
    """A history's parameters, by ``profile`` (see PROFILES)."""
    nodes = rng.choice((3, 3, 5))
    ttl = rng.choice((0.5, 1.0, 2.0))
    config = Config(
        nodes=nodes,
        clients=rng.randint(2, 5),
        names=rng.choice((1, 2, 2, 3)),
        seconds=rng.uniform(4.0, 10.0),
        ttl=ttl,
        max_ttl=ttl * rng.choice((1, 1, 2)),
        node_timeout=rng.choice((0.02, 0.05, 0.1)),
        retry_delay=rng.choice((0.02, 0.05, 0.1)),
        drift_factor=rng.choice((0.01, 0.01, 0.05)),
        latency=rng.choice((0.0005, 0.002, 0.01)),
        late=rng.choice((0.0, 0.01, 0.05)),
        loss=rng.choice((0.0, 0.002, 0.02)),
        node_faults=rng.choice((0.0, 0.3, 1.0, 2.0)),
        client_faults=rng.choice((0.0, 0.1, 0.5)),
        clock_jumps=clock_jumps,
        operator_errors=operator_errors,
        auto_extend=rng.choice((0.0, 0.5, 1.0)),
        limit=rng.choice((1, 2, 3)),
        clock_edges=rng.random() < 0.3,
        force_releases=rng.choice((0.0, 0.0, 0.2)),
    )
    if profile == "storm":
        config.kinds = ("lock",)
        config.auto_extend = 1.0
        config.node_faults = rng.choice((0.3, 1.0, 2.0))
    elif profile == "drift":
        config.kinds = ("lock",)
        config.auto_extend = 0.0
        config.drift_factor = 0.05
        config.clock_edges = True
        config.listen = 0.0
        config.retry_delay = 0.02
        config.node_faults = 0.0
        config.client_faults = 0.5
    elif profile == "restarts":
        config.kinds = ("lock",)
        config.auto_extend = 0.0
        config.persistence = ("everysec", "rdb", "empty")
        config.node_faults = rng.choice((1.0, 2.0, 4.0))
    elif profile == "slots":
        config.kinds = ("semaphore",)
        config.limit = rng.choice((2, 3))
        config.clients = rng.randint(config.limit + 1, 6)
        config.node_faults = rng.choice((1.0, 2.0))
    elif profile == "fence":
        config.kinds = ("lock",)
        config.fenced = 1.0
        config.client_faults = rng.choice((0.5, 1.0))
        config.force_releases = rng.choice((0.0, 0.3))
    elif profile == "quarantines":
        config.kinds = ("lock",)
        config.auto_extend = 0.0
        config.persistence = ("empty",)
        config.node_faults = rng.choice((2.0, 4.0))
        config.client_faults = 0.0
        config.max_ttl = config.ttl
        config.long_max_ttl = config.ttl * rng.choice((3, 4))
        config.longest = 0.8
    elif profile == "failovers":
        config.kinds = ("lock",)
        config.auto_extend = 0.0
        config.persistence = ("always", "everysec")  # restarts lose little: failovers lose
        config.node_faults = 0.3
        config.failovers = rng.choice((0.5, 1.0, 2.0))
    elif profile != "mix":
        raise ValueError(f"no profile {profile!r}: one of {', '.join(PROFILES)}")
    return config


PROFILES = {
    "mix": "every kind of lease, every fault (the default)",
    "storm": "plain locks only, always renewed, many node faults",
    "drift": "plain locks, clocks at the edges of a 5 % drift bound, polling contenders",
    "restarts": "plain locks, never renewed, nodes that lose data when they crash",
    "slots": "semaphores only, more clients than slots, many node faults",
    "fence": "plain locks, every holder writing to its fenced row, many client pauses",
    "quarantines": "plain locks, half the clients with a longer max_ttl, nodes restarting empty",
    "failovers": "plain locks, never renewed, masters replaced by lagging replicas",
}


def drift_rate(rng: random.Random, config: Config) -> float:
    """A clock's rate: within the bound, or at one of its edges (the difference between any
    two clocks stays under ``drift_factor``, which the validity's drift term covers)."""
    bound = config.drift_factor * 0.45
    if config.clock_edges:
        return rng.choice((-bound, bound))
    return rng.uniform(-bound, bound)


# -- clocks ----------------------------------------------------------------------------------


@dataclass
class Clock:
    """A clock of the world: ``offset + t * (1 + rate)`` seconds at virtual time ``t``, plus
    the steps it jumped (a node's wall clock stepped by NTP or an operator)."""

    rate: float
    offset: float
    jumped: float = 0.0

    def at(self, t: float) -> float:
        return self.offset + t * (1.0 + self.rate) + self.jumped

    def when(self, local: float) -> float:
        """The virtual time at which this clock reads ``local`` (no jumps after now)."""
        return (local - self.offset - self.jumped) / (1.0 + self.rate)


# -- nodes -----------------------------------------------------------------------------------


class SimNode:
    """One simulated node: its keyspace, its server process, its clock and persistence."""

    def __init__(self, world: World, index: int, persistence: str) -> None:
        self.world = world
        self.index = index
        self.label = f"n{index}"
        rng = world.rng
        self.clock = Clock(drift_rate(rng, world.config), 1_700_000_000.0 + rng.uniform(0, 100))
        self.persistence = persistence
        self.space = Keyspace()
        self.server = Server()
        self.state = "up"  # up, paused, down
        self.incarnation = 0
        self.inbox: list[Callable[[], None]] = []  # deliveries held while paused
        self.snapshots: list[tuple[float, Keyspace]] = []
        self.last_snapshot = 0.0
        self.start_process()
        # A node in service from the start: up longer than any quarantine (its marker is set
        # by its first acquire, as on a node that has been running for a while).
        self.server.started_ms -= int(world.config.longest_ttl * 1000) + 2000

    def now_us(self) -> int:
        return int(self.clock.at(self.world.now) * 1_000_000)

    def start_process(self) -> None:
        self.incarnation += 1
        self.server = Server()
        self.server.run_id = (
            hashlib.sha1(b"%d" % self.world.rng.getrandbits(64), usedforsecurity=False)
            .hexdigest()
            .encode()
        )
        # A new process has a new replication id (derived, so the seed's draws stay as they were).
        replid = hashlib.sha1(b"replid " + self.server.run_id, usedforsecurity=False)
        self.server.replid = replid.hexdigest().encode()
        self.server.started_ms = self.now_us() // 1000
        self.server.aof_enabled = self.persistence in ("always", "everysec")
        self.loaded: set[bytes] = set()  # the process's script cache: empty when it starts

    @property
    def hint(self) -> bytes:
        """What a connection's ``CONFIG GET append*`` makes of this node (wire.setup)."""
        return {"always": b"always", "everysec": b"appendfsync everysec"}.get(
            self.persistence, b"appendonly no"
        )

    def snapshot(self) -> None:
        """Keep the keyspace as it is now (what an everysec AOF or an RDB save would hold)."""
        self.snapshots.append((self.world.now, self.space.copy()))
        if len(self.snapshots) > 64:
            del self.snapshots[:16]

    def run(self, sha: bytes, keys: Sequence[bytes], args: Sequence[bytes]) -> object:
        world = self.world
        now_us = self.now_us()
        checker = world.checker
        space = self.space
        # The fair line and the hand-off are judged on what a script changed: read before.
        before: Any = None
        held_before = None
        if sha == _ACQUIRE:
            before = checker.line_state(space, keys[0], now_us // 1000)
            held_before = lock_token(space.data.get(keys[0]))
        elif sha in _WAKERS:
            before = checker.line_state(space, keys[0], now_us // 1000)
            order_before = checker.live_order(space, keys[0], now_us // 1000)
        elif sha == _ACQUIRE_MANY:
            before = _holding(space, keys[1::4], args[0])
        giver = None
        if checker.handed:
            giver = next((arg for arg in args if arg in checker.handed), None)
            if giver is not None:
                key = keys[1] if sha == _HANDOFF else keys[0]
                before = _state(space, key, now_us // 1000)
        reply = world.engine.run(sha, keys, args, space, self.server, now_us)
        checker.after_script(self, now_us // 1000)
        if giver is not None:
            checker.giver_ran(self, key, giver, before, _state(space, key, now_us // 1000))
        elif sha == _ACQUIRE:
            if lock_token(space.data.get(keys[0])) == args[0] != held_before:
                checker.granted_on_node(self, keys[0], before[1], args[4], args[0])
        elif sha in _WAKERS:
            after = checker.line_state(space, keys[0], now_us // 1000)
            order = (order_before, checker.live_order(space, keys[0], now_us // 1000))
            checker.freed_on_node(self, keys[0], before, after, world.engine.published, order)
        elif sha == _ACQUIRE_MANY:
            checker.took_many(self, keys[1::4], before, _holding(space, keys[1::4], args[0]))
        if world.engine.published:
            checker.granted_after_end(self, keys[0] if keys else b"", world.engine.published)
        if sha == _LEAVE:
            checker.ended_on_node(self, args[0])
        elif sha == _RELEASE and len(args) > 1 and args[1]:
            checker.ended_on_node(self, args[1])
        for _, message in world.engine.published:
            world.publish(message.decode(), self.index)
        if world.now - self.last_snapshot >= 0.25:
            self.last_snapshot = world.now
            self.snapshot()
        return reply

    def restored(self, mode: str) -> Keyspace:
        """The keyspace a process restarting now loads, by persistence ``mode``."""
        if mode == "always":
            return self.space.copy()
        if mode == "empty":
            return Keyspace()
        rng = self.world.rng
        lost = rng.uniform(0.0, 1.0) if mode == "everysec" else rng.uniform(1.0, 6.0)
        older = [space for at, space in self.snapshots if at <= self.world.now - lost]
        return older[-1].copy() if older else Keyspace()


def lock_token(value: object) -> bytes | None:
    """The token a lock key's value holds (``scripts/lock_key.lua``: ``<token> <tag>``), or
    None (absent, or not a lock)."""
    if type(value) is not bytes:
        return None
    token, space, _ = value.partition(b" ")
    return token if space else None


def _holding(space: Keyspace, keys: Sequence[bytes], token: bytes) -> frozenset[bytes]:
    """Which of ``keys`` hold ``token`` (expired ones included: a script sees them gone,
    and only keys this script set are judged)."""
    data = space.data
    return frozenset(key for key in keys if lock_token(data.get(key)) == token)


def _state(space: Keyspace, key: bytes, now_ms: int) -> object:
    """A key's value and expiry at ``now_ms``, copied (None when absent or expired)."""
    value = space.data.get(key)
    when = space.expires.get(key)
    if value is None or (when is not None and now_ms > when):
        return None
    return (value, when)


# -- the wire --------------------------------------------------------------------------------


class Exchange(rounds.Round):
    """One round's replies, counted by the transports' own tally (``wire.rounds.Round``),
    and the simulated process waiting for them."""

    __slots__ = ("waiter",)

    def __init__(self, size: int, yes_value: object, need: int, give_up: int) -> None:
        super().__init__(size, yes_value, need, give_up)
        self.waiter: Any = None


class Connection:
    """A client's connection to one node: FIFO both ways (TCP), bound to one server process."""

    __slots__ = (
        "greeted",
        "held_since",
        "incarnation",
        "last_in",
        "last_out",
        "node",
        "owed",
        "reload",
    )

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.greeted = False  # its hello (wire.setup.Hello) has run on the node
        self.reload = False  # SCRIPT LOADs owed behind a NOSCRIPT fallback
        self.incarnation = node.incarnation
        self.last_in = 0.0  # when its last command reaches the node
        self.last_out = 0.0  # when its last reply reaches the client
        self.owed: list[Exchange | None] = []
        # When a paused node first held one of its commands unread (None: none held): past
        # the stall reset the client replaces it (wire.stall), the held commands still run.
        self.held_since: float | None = None


_PARSED: dict[bytes, tuple[int, list[bytes]]] = {}


def parse_command(data: bytes) -> tuple[int, list[bytes]]:
    """A RESP command: (the argument count its header announces, the arguments present).
    A round sends one command to every node: parsed once."""
    parsed = _PARSED.get(data)
    if parsed is None:
        if len(_PARSED) > 256:
            _PARSED.clear()
        parsed = _PARSED[data] = _parse(data)
    return parsed[0], list(parsed[1])


def _parse(data: bytes) -> tuple[int, list[bytes]]:
    end = data.index(b"\r\n")
    count = int(data[1:end])
    parts = []
    pos = end + 2
    while pos < len(data):
        end = data.index(b"\r\n", pos)
        size = int(data[pos + 1 : end])
        parts.append(data[end + 2 : end + 2 + size])
        pos = end + 4 + size
    return count, parts


# -- clients ---------------------------------------------------------------------------------


@dataclass
class Db:
    """A statement on the fenced table (``tests/sim/fence.py``): ``mint`` the row of ``name``
    (the process is sent its new token), or ``write`` it under ``token`` (sent True when the
    table took it). One message delay each way."""

    op: str
    name: str
    token: int = 0


@dataclass
class LeaseRecord:
    """A lease a client held: its lock, token, and the interval of virtual time it held it
    within its validity (``end`` grows with each renewal, shrinks to the release)."""

    client: int
    name: str
    token: str
    start: float
    end: float
    claims: tuple[tuple[str, str], ...] = ()  # (resource, "x" exclusive | "r" read | "s" slot)
    released: float | None = None
    revoked: float | None = None  # when an operator force-released it (the holder is not told)
    began: float = 0.0  # when the round its keys date from was sent


@dataclass
class SimClient:
    world: World
    index: int
    clock: Clock
    nodes: flow.Nodes
    connections: list[Connection | None] = field(default_factory=list)
    alive: bool = True
    paused_until: float = 0.0
    process: Generator[Any, Any, None] | None = None
    waiters: int = 0
    pauses: int = 0
    incarnation: int = 0
    listens: bool = False  # hears wake-ups (pub/sub), else sleeps the retry delay
    woken: set[str] = field(default_factory=set)  # wake-ups kept for a waiter not waiting yet
    # Hand-off grants heard (scripts/hand_grant.lua): waiter -> node index -> round named.
    grants: dict[str, dict[int, int]] = field(default_factory=dict)
    waiting: tuple[str, object] | None = None  # (waiter, process) of the wait in progress
    wait_need: int = 0  # the grants that end the wait in progress (0: only a wake-up)
    quarantine_ms: int = 0  # what its acquires send: its max_ttl, raised by what nodes report
    heard: set[int] = field(default_factory=set)  # nodes whose hello reported their quarantine
    db_in: float = 0.0  # when its last statement reaches the database (one connection, FIFO)
    db_out: float = 0.0
    round_began: float = 0.0  # virtual time its last round was sent
    host: Any = None  # what its procedures ask of the engine (clients.SimHost)
    last_results: Sequence[Any] = ()  # the replies of its last round, as its process got them

    def now(self) -> float:
        return self.clock.at(self.world.now)

    def log(self, text: str) -> None:
        self.world.log(f"c{self.index}", text)


class Crashed(BaseException):
    """Thrown into the process of a client that crashed (or whose history ended)."""


def abandon(process: Generator[Any, Any, None] | None) -> None:
    """End ``process`` as a crash does: its procedure unwinds (a procedure's clean-ups would
    ask for posts, which a crashed client never sends, so they are dropped), rather than be
    closed by the collector, where a procedure unwinding would ask for a post in vain."""
    if process is None:
        return
    try:
        process.throw(Crashed())
        while True:
            process.send(None)
    except (Crashed, StopIteration):
        pass


class World:
    """One simulated history. ``patches``: the mutant's changes, already applied by the
    caller (see ``tests/sim/run.py``); ``overrides``: script SHA1 -> source for the nodes."""

    def __init__(
        self,
        seed: int,
        config: Config | None = None,
        overrides: dict[bytes, bytes] | None = None,
        dropped: frozenset[int] = frozenset(),
    ) -> None:
        self.seed = seed
        self.dropped = dropped  # the planned faults left out (see faults.plan)
        self.faults = 0  # the planned faults scheduled (faults.schedule)
        self.steps = 0  # the events run: deliveries, timers, faults, client steps
        self.rng = random.Random(seed)
        self.config = config or draw_config(self.rng)
        self.stall_reset = stall_limits(self.config.node_timeout)["stall_reset"]
        self.now = 0.0
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.trace: list[tuple[float, str, str]] = []
        self.engine = LuaEngine(overrides)
        self.checker = Checker(self)
        self.table = Table()
        self.handles: list[Any] = []  # leases handed off (lease.handle()), not yet adopted
        self.noscripts = 0  # NOSCRIPT replies that the transport's fallback took over
        self.rounds = 0
        config = self.config
        self.nodes = [
            SimNode(self, i, self.rng.choice(config.persistence)) for i in range(config.nodes)
        ]
        labels = tuple(node.label for node in self.nodes)
        self.flow_nodes = flow.Nodes(
            labels, config.quorum, config.node_timeout, config.drift_factor, config.retry_delay
        )
        self.clients: list[SimClient] = []
        for i in range(config.clients):
            clock = Clock(drift_rate(self.rng, config), self.rng.uniform(0, 1000))
            client = SimClient(self, i, clock, self.flow_nodes, [None] * config.nodes)
            client.listens = self.rng.random() < config.listen
            self.clients.append(client)
        # The operator's admin page (force release): a client of its own, with no process.
        self.operator = SimClient(
            self, config.clients, Clock(0.0, 0.0), self.flow_nodes, [None] * config.nodes
        )

    # -- the event queue -------------------------------------------------------------------

    def at(self, when: float, action: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (when, self.seq, action))

    def log(self, who: str, text: str) -> None:
        self.trace.append((self.now, who, text))

    def history(self) -> str:
        return "\n".join(f"{t:12.6f}  {who:>4}  {text}" for t, who, text in self.trace)

    def run(self) -> World:
        from tests.sim import clients, faults

        for client in self.clients:
            client.process = clients.client_process(client)
            self.at(self.rng.uniform(0, 0.01), partial(self.step, client, None, client.process))
        faults.schedule(self)
        end = self.config.seconds
        while self.queue and not self.checker.stop:
            when, _, action = heapq.heappop(self.queue)
            if when > end + 3 * self.config.longest_ttl:
                break
            self.now = when
            self.steps += 1
            action()
        for client in self.clients:
            abandon(client.process)  # the history ends: nothing more is sent
        self.checker.finish()
        return self

    # -- client processes ------------------------------------------------------------------

    def step(self, client: SimClient, value: object, process: object = None) -> None:
        """Resume ``client``'s process with ``value`` and act on what it yields next (not if
        the client crashed since: ``process`` is then no longer its process)."""
        if not client.alive or client.process is None:
            return
        if process is not None and process is not client.process:
            return
        process = client.process
        if client.paused_until > self.now:  # a GC pause: it resumes when the pause ends
            self.at(client.paused_until, lambda: self.step(client, value, process))
            return
        while True:
            try:
                request = client.process.send(value)
            except StopIteration:
                client.process = None
                return
            # What takes no virtual time is carried out at once, and the process resumed.
            if type(request) is Post:
                self.clean_up(client, request.commands)
                value = None
            elif type(request) is Listen:
                client.waiters += 1
                value = f"c{client.index}.{client.waiters}"
            elif type(request) is Subscribe:
                # The simulated pub/sub hears every channel at once: subscribed just now, so
                # the procedure tries again at once (a release before it is covered).
                value = True
            elif type(request) is Grants:
                value = client.grants.pop(request.waiter, {})
            else:
                break
        if isinstance(request, Sleep):
            wake = self.now + max(0.0, request.delay) / (1.0 + client.clock.rate)
            self.at(wake, lambda: self.step(client, None, process))
        elif isinstance(request, Wait):
            heard = len(client.grants.get(request.waiter, ()))
            if request.waiter in client.woken or (request.need and heard >= request.need):
                # Published while it was trying: kept.
                client.woken.discard(request.waiter)
                self.at(self.now, lambda: self.step(client, True, process))
                return
            marker = (request.waiter, object())
            client.waiting = marker
            client.wait_need = request.need
            wake = self.now + max(0.0, request.delay) / (1.0 + client.clock.rate)
            self.at(wake, lambda: self.end_wait(client, marker, False, process))
            if request.need and heard:
                self._settle(client, marker, process)
        elif isinstance(request, Round):
            self.send_round(client, request)
        elif isinstance(request, Db):
            self.database(client, request, process)
        else:  # pragma: no cover
            raise TypeError(request)

    def database(self, client: SimClient, request: Db, process: object) -> None:
        """Run ``request`` on the fenced table when it arrives; the reply resumes the process
        one delay later (a crashed client's statement in flight still lands)."""
        who = f"c{client.index}"
        client.db_in = arrive = max(client.db_in, self.now + self.delay())

        def run() -> None:
            reply: int | bool
            if request.op == "mint":
                reply = self.table.mint(request.name)
                self.checker.minted(request.name, reply)
                self.log(who, f"minted fencing token {reply} for {request.name}")
            else:
                reply = self.table.write(request.name, request.token)
                self.log(
                    who,
                    f"write to {request.name} under fencing token {request.token}: "
                    + ("accepted" if reply else "refused (stale)"),
                )
                self.checker.written(who, request.name, request.token, bool(reply))
            client.db_out = back = max(client.db_out, self.now + self.delay())
            self.at(back, lambda: self.step(client, reply, process))

        self.at(arrive, run)

    def end_wait(
        self, client: SimClient, marker: tuple[str, object], woken: bool, process: object
    ) -> None:
        if client.waiting is not marker:
            return  # already ended (woken, or timed out)
        client.waiting = None
        self.step(client, woken, process)

    def _settle(self, client: SimClient, marker: tuple[str, object], process: object) -> None:
        """A first grant came: the wait ends a node timeout later at most (as
        ``Subscriber.wait``'s ``settle``), if the other grants have not ended it."""
        when = self.now + self.config.node_timeout / (1.0 + client.clock.rate)
        self.at(when, lambda: self.end_wait(client, marker, True, process))

    def publish(self, message: str, index: int) -> None:
        """A script on node ``index`` published a wake-up (``wake_next.lua``: the waiter id)
        or a hand-off grant (``hand_grant.lua``: the waiter id and a round): its client hears
        it over its pub/sub connection after one message delay."""
        waiter, _, round_ = message.partition(" ")
        listener = waiter.split(".", 1)[0]
        for client in self.clients:
            if f"c{client.index}" != listener or not client.alive or not client.listens:
                continue

            def hear(client: SimClient = client) -> None:
                waiting = client.waiting
                if round_:
                    grants = client.grants.setdefault(waiter, {})
                    first = not grants
                    grants[index] = max(grants.get(index, 0), int(round_))
                    if waiting is None or waiting[0] != waiter or not client.wait_need:
                        return
                    if len(grants) >= client.wait_need:
                        self.end_wait(client, waiting, True, client.process)
                    elif first:
                        self._settle(client, waiting, client.process)
                elif waiting is not None and waiting[0] == waiter:
                    self.end_wait(client, waiting, True, client.process)
                else:
                    client.woken.add(waiter)

            self.at(self.now + self.delay(), hear)

    def send_round(self, client: SimClient, request: Round) -> None:
        size = len(request.commands)
        need = request.need
        give_up = size - need if request.give_up is None else request.give_up
        exchange = Exchange(size, request.yes, need, give_up)
        exchange.waiter = client.process
        client.round_began = self.now
        self.rounds += 1
        for index, command in enumerate(request.commands):
            if command is None:
                exchange.results[index] = None
                continue
            exchange.pending += 1
            self.send(client, index, command, exchange, request.identify)
        if exchange.known():
            self.finish_round(client, exchange)
            return
        deadline = client.clock.when(client.now() + self.config.node_timeout)
        exchange.waiter = client.process
        self.at(deadline, lambda: self.timeout_round(client, exchange))

    def finish_round(self, client: SimClient, exchange: Exchange) -> None:
        if exchange.closed:
            return
        exchange.closed = True
        client.last_results = exchange.results
        self.step(client, exchange, exchange.waiter)

    def timeout_round(self, client: SimClient, exchange: Exchange) -> None:
        if exchange.closed:
            return
        if client.paused_until > self.now:
            # wire.sync: a reply already in the socket when the client finds its deadline
            # passed is an answer (the pause was the client's, not the node's): the client
            # judges lateness only once it runs again, after taking in what arrived.
            self.at(client.paused_until, lambda: self.timeout_round(client, exchange))
            return
        exchange.results = [TIMED_OUT if r is PENDING else r for r in exchange.results]
        self.finish_round(client, exchange)

    def clean_up(self, client: SimClient, commands: Sequence[scripts.Command | None]) -> None:
        """Send without waiting (``ConnectionSet.post``: as ``fire_and_forget`` makes
        each command, the EVAL at once for a script no connection preloads)."""
        for index, command in enumerate(commands):
            if command is not None:
                self.send(client, index, scripts.fire_and_forget(command), None, False)

    def delay(self) -> float:
        config = self.config
        base = self.rng.expovariate(1.0 / config.latency)
        if config.late and self.rng.random() < config.late:
            base += self.rng.uniform(0.0, 4 * config.node_timeout)
        return base

    def send(
        self,
        client: SimClient,
        index: int,
        command: scripts.Command,
        exchange: Exchange | None,
        identify: bool,
    ) -> None:
        node = self.nodes[index]
        conn = client.connections[index]
        self.checker.sent(client, index, command[0])
        if conn is None or conn.incarnation != node.incarnation:
            if node.state == "down":
                if exchange is not None:
                    exchange.record(index, NotSent("connection refused"))
                elif client is self.operator:
                    self.landed(command[0])
                return
            conn = client.connections[index] = Connection(node)
        elif conn.held_since is not None and self.now - conn.held_since >= self.stall_reset:
            # wire.stall: a connection owing a reply past the stall reset is replaced; a
            # clean-up goes on the old one (behind what it undoes) and once more on the new
            # one. What the old one holds still runs when the node wakes, in any order with
            # the new one's commands (resume_node).
            if exchange is None:
                self._send_on(client, conn, index, command, exchange)
            self.log(f"c{client.index}", f"stalled connection to {node.label} replaced")
            conn = client.connections[index] = Connection(node)
        self._send_on(client, conn, index, command, exchange)

    def _send_on(
        self,
        client: SimClient,
        conn: Connection,
        index: int,
        command: scripts.Command,
        exchange: Exchange | None,
    ) -> None:
        node = self.nodes[index]
        data = command[0]
        if self.config.loss and self.rng.random() < self.config.loss:
            self.log(f"c{client.index}", f"message to {node.label} lost")
            if client is self.operator:
                self.landed(data)
            return  # never arrives: the round times out, a clean-up is lost
        arrive = max(conn.last_in, self.now + self.delay())
        conn.last_in = arrive
        fallback = command[1]
        self.at(arrive, lambda: self.deliver(client, conn, data, exchange, index, fallback))

    def deliver(
        self,
        client: SimClient,
        conn: Connection,
        data: bytes,
        exchange: Exchange | None,
        index: int,
        fallback: scripts.Fallback | None = None,
    ) -> None:
        node = conn.node
        if client is self.operator and (
            node.incarnation != conn.incarnation or node.state == "down"
        ):
            self.landed(data)
        if node.incarnation != conn.incarnation or node.state == "down":
            self.reply(
                client,
                conn,
                exchange,
                index,
                NodeError("connection closed by the server"),
                lost_node=True,
            )
            return
        if node.state == "paused":
            if conn.held_since is None:
                conn.held_since = self.now
            node.inbox.append(partial(self.deliver, client, conn, data, exchange, index, fallback))
            return
        if not conn.greeted:
            self.hello(client, conn, index)
        reply = self.execute(node, conn, data)
        if client is self.operator and not (type(reply) is NodeError and str(reply) == _NOSCRIPT):
            self.landed(data, ran=index)  # else its EVAL, sent in its place, will
        if conn.reload:  # the SCRIPT LOADs pipelined behind a NOSCRIPT fallback
            conn.reload = False
            node.loaded |= _PRELOADED
        self.reply(client, conn, exchange, index, reply, fallback=fallback)

    def hello(self, client: SimClient, conn: Connection, index: int) -> None:
        """A new connection's hello, pipelined ahead of its first command: the node's longest
        quarantine (``HGET <marker> q``) raises the client's (``core.engine.Quarantine.report``)
        when the reply arrives, ahead of the command's."""
        conn.greeted = True
        node = conn.node
        node.loaded |= _PRELOADED  # its SCRIPT LOADs come first (wire.setup.setup_commands)
        marker = node.space.data.get(_NODE_KEY)
        q = int(marker.get(b"q", b"0")) if type(marker) is Hash else 0
        arrive = conn.last_out = max(conn.last_out, self.now + self.delay())
        incarnation = client.incarnation

        def report() -> None:
            if client.alive and client.incarnation == incarnation:
                client.heard.add(index)
                client.quarantine_ms = max(client.quarantine_ms, q)

        self.at(arrive, report)

    def execute(self, node: SimNode, conn: Connection, data: bytes) -> object:
        count, parts = parse_command(data)
        verb = parts[0].upper()
        if verb == b"PING":
            return b"PONG"
        if verb in (b"EVALSHA", b"EVAL"):
            if verb == b"EVALSHA":
                sha = parts[1]
                if sha not in node.loaded:  # a new process, or a SCRIPT FLUSH
                    return NodeError(_NOSCRIPT)
            else:
                sha = hashlib.sha1(parts[1], usedforsecurity=False).hexdigest().encode()
                node.loaded.add(sha)  # EVAL caches the script, as Redis does
            keys_count = int(parts[2])
            if len(parts) < count:
                # identify=True: the connection's identity ends the command (wire.setup.Hello),
                # the server process and persistence its hello read when it connected.
                parts += [node.server.identity, node.hint]
            keys = parts[3 : 3 + keys_count]
            args = parts[3 + keys_count :]
            return node.run(sha, keys, args)
        return NodeError(f"ERR the simulator does not run {verb.decode()}")

    def reply(
        self,
        client: SimClient,
        conn: Connection,
        exchange: Exchange | None,
        index: int,
        reply: object,
        lost_node: bool = False,
        fallback: scripts.Fallback | None = None,
    ) -> None:
        noscript = fallback is not None and type(reply) is NodeError and str(reply) == _NOSCRIPT
        if exchange is None and not noscript:
            return
        if lost_node:
            arrive = self.now
        else:
            arrive = max(conn.last_out, self.now + self.delay())
            conn.last_out = arrive

        def receive() -> None:
            if not client.alive:
                return
            if noscript:
                # The transport (wire/rounds.py): the node lacks the script. The EVAL goes out
                # in its place (for a round still open, or for a command that must run even
                # once it is over, a clean-up), the preloaded scripts are loaded again behind.
                assert fallback is not None
                open_round = exchange is not None and not exchange.closed
                self.noscripts += 1
                if open_round or fallback.when_over:
                    self.log(f"c{client.index}", f"NOSCRIPT from {conn.node.label}: EVAL instead")
                    self.send(
                        client,
                        index,
                        (fallback.build(), None),
                        exchange if open_round else None,
                        fallback.identify,
                    )
                current = client.connections[index]
                if current is not None:
                    current.reload = True
                return
            if exchange is None or exchange.closed:
                return
            exchange.record(index, reply)
            if exchange.known():
                self.finish_round(client, exchange)

        self.at(arrive, receive)

    # -- what faults do to nodes -------------------------------------------------------------

    def pause_node(self, node: SimNode, seconds: float) -> None:
        if node.state != "up":
            return
        node.state = "paused"
        self.log(node.label, f"paused for {seconds * 1000:.0f} ms")
        self.at(self.now + seconds, lambda: self.resume_node(node))

    def resume_node(self, node: SimNode) -> None:
        if node.state != "paused":
            return
        node.state = "up"
        self.log(node.label, "resumed")
        held, node.inbox = node.inbox, []
        # A server wakes to every connection's unread input at once and serves them in the
        # order its event loop finds them: FIFO on each connection, any order across them.
        queues: dict[int, list[Callable[[], None]]] = {}
        for deliver in held:
            conn = deliver.args[1] if isinstance(deliver, partial) else None
            if isinstance(conn, Connection):
                conn.held_since = None
            queues.setdefault(id(conn), []).append(deliver)
        order = list(queues.values())
        while order:
            queue = order[self.rng.randrange(len(order))]
            queue.pop(0)()
            if not queue:
                order.remove(queue)

    def crash_node(self, node: SimNode, seconds: float, mode: str | None = None) -> None:
        if node.state == "down":
            return
        if mode is None or node.persistence == "always":
            # A node with fsync always loses nothing (that it restarts empty, its AOF wiped,
            # is outside the model: an operator's declare_fresh case, see restart_node).
            mode = node.persistence
        kept = node.restored(mode)
        node.state = "down"
        node.incarnation += 1  # every connection to the old process is closed
        self.log(node.label, f"crashed ({mode}); back in {seconds * 1000:.0f} ms")
        held, node.inbox = node.inbox, []
        for deliver in held:  # commands it never read: their connections are closed
            deliver()
        self.at(self.now + seconds, lambda: self.restart_node(node, kept, mode))

    def restart_node(self, node: SimNode, kept: Keyspace, mode: str) -> None:
        node.start_process()
        kept.purge(node.now_us() // 1000)
        node.space = kept
        node.state = "up"
        node.snapshots = []
        node.snapshot()
        locks = sum(1 for k, v in kept.data.items() if type(v) is bytes and k[:1] != b"\x00")
        self.log(
            node.label,
            f"restarted ({mode}): {locks} lock keys kept, run_id {node.server.run_id[:8].decode()}",
        )
        if self.config.operator_errors and mode != "always" and self.rng.random() < 0.5:
            self.declare_fresh(node)

    def fail_over(self, node: SimNode, seconds: float, lag: float) -> None:
        """The node's master dies and its replica is promoted after ``seconds`` (a Sentinel's or
        a managed service's failover, on the same address): a process up for long (longer than
        any quarantine), whose dataset is the master's as it was ``lag`` seconds before it died
        (asynchronous replication), marker included, and whose AOF, however durable, holds
        only what it replicated."""
        if node.state == "down":
            return
        older = [space for at, space in node.snapshots if at <= self.now - lag]
        kept = older[-1].replicated() if older else Keyspace()
        node.state = "down"
        node.incarnation += 1  # every connection to the old master is closed
        self.log(node.label, f"master died; its replica ({lag * 1000:.0f} ms behind) takes over")
        held, node.inbox = node.inbox, []
        for deliver in held:
            deliver()

        def promote() -> None:
            node.start_process()
            node.server.promoted = True
            # The replica has been up all along: uptime proves nothing about what it missed.
            node.server.started_ms -= int(self.config.longest_ttl * 1000) + 60_000
            kept.purge(node.now_us() // 1000)
            node.space = kept
            node.state = "up"
            node.snapshots = []
            node.snapshot()
            self.log(node.label, f"replica promoted: run_id {node.server.run_id[:8].decode()}")

        self.at(self.now + seconds, promote)

    def declare_fresh(self, node: SimNode) -> None:
        """An operator's ``redlock_declare_fresh`` (``DECLARE_FRESH``, naming the run_id read
        just before), here at the wrong moment: the node lost leases it granted."""
        reply = node.run(
            scripts.DECLARE_FRESH.sha, [scripts.NODE_KEY.encode()], [node.server.run_id]
        )
        self.log(node.label, f"operator declared it fresh: {reply!r}")
        self.checker.expect_violations("declare_fresh after a lossy restart")

    def pause_client(self, client: SimClient, seconds: float) -> None:
        if not client.alive or client.paused_until > self.now:
            return
        client.paused_until = self.now + seconds
        client.pauses += 1
        self.log(f"c{client.index}", f"GC pause of {seconds * 1000:.0f} ms")

    def crash_client(self, client: SimClient, seconds: float) -> None:
        if not client.alive:
            return
        client.alive = False
        abandon(client.process)
        client.process = None
        self.checker.client_crashed(client)
        self.log(f"c{client.index}", f"crashed; a new process in {seconds * 1000:.0f} ms")

        def restart() -> None:
            from tests.sim import clients

            client.alive = True
            client.incarnation += 1
            client.paused_until = 0.0
            client.waiting = None
            client.woken = set()
            client.grants = {}
            client.connections = [None] * len(self.nodes)
            client.process = clients.client_process(client)
            self.log(f"c{client.index}", "restarted")
            self.step(client, None)

        self.at(self.now + seconds, restart)

    def flush_scripts(self, node: SimNode) -> None:
        """``SCRIPT FLUSH`` (an operator, a failover to a replica): the process forgets every
        script, its connections stay open."""
        if node.state == "down":
            return
        node.loaded = set()
        self.log(node.label, "SCRIPT FLUSH")

    def force_release(self, name: str) -> None:
        """The admin's force release of lock ``name`` (``admin.py``): bump the fenced row's
        token first, then delete the lock on every node, whoever holds it. The evicted holder
        is not told: its window ends here (exclusion is no longer owed to it), and only the
        fence refuses its later writes."""
        token = self.table.mint(name)
        self.checker.minted(name, token)
        self.checker.forcing[name] = self.checker.forcing.get(name, 0) + len(self.nodes)
        self.checker.force_released(name)
        self.checker.force_ran[name] = {}
        self.log("op", f"force release of {name} (fencing token bumped to {token})")
        key = "redlock:" + name
        self.clean_up(self.operator, flow.force_release_round(len(self.nodes), key))

    def landed(self, data: bytes, ran: int | None = None) -> None:
        """One node's force release reached it (or never will): a lease granted until the
        last one lands may be evicted too, whoever holds it by then. ``ran``: the node it ran
        on, when it did."""
        name = parse_command(data)[1][3].decode().removeprefix("redlock:")
        if ran is not None:
            self.checker.force_ran.setdefault(name, {})[ran] = self.nodes[ran].incarnation
        self.checker.forcing[name] -= 1
        if not self.checker.forcing[name]:
            self.checker.forced[name] = self.now

    def jump_clock(self, node: SimNode, seconds: float) -> None:
        node.clock.jumped += seconds
        self.log(node.label, f"clock jumped {seconds * 1000:+.0f} ms")
        self.checker.expect_violations("node clock jump beyond the drift bound")


__all__ = [
    "KINDS",
    "PERSISTENCE",
    "PROFILES",
    "Config",
    "LeaseRecord",
    "Round",
    "SimClient",
    "SimNode",
    "Sleep",
    "Wait",
    "World",
    "draw_config",
]
