"""The asyncio transport: per event loop, one connection per node, shared by every task.

A command is written to every node at once (one round trip whatever N); each connection has a
FIFO of reply slots (the round and node each owed reply counts for), taken in order as replies
are parsed in ``data_received``, so replies can never be handed to the wrong command, and
commands of many tasks pipeline on one socket. The outcome is known at a quorum of yes votes,
or once a quorum is no longer possible; a node that owes too many replies is skipped without
sending. A round needs no await before its send once every node is connected (``send_now``),
and one timer per loop watches the deadlines of all the rounds waited for. Waiting tasks are
woken by the release through per-loop pub/sub streams (:class:`LoopSubscriber`).

:class:`LoopConnections` is a :class:`~django_redlock.wire.transport.AsyncTransport`, and
:class:`LoopSubscriber` an :class:`~django_redlock.wire.transport.AsyncWakeSubscriber`: the
same methods as the sync transport's, written in :mod:`~django_redlock.wire.transport`.

Why not ``redis.asyncio``: five ``evalsha`` calls under ``asyncio.gather`` cost 1.2 ms a pair
or more on this project's benchmark machine, three times this transport or more, and its
clients retry by default.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial

from django_redlock.wire.acks import acked_round, wait_ms
from django_redlock.wire.asyncio.connection import (
    TAKE_IN_TURNS,
    AsyncConnection,
    LoopRound,
    Slot,
    new_round,
    record_reply,
    settle,
    unread,
)
from django_redlock.wire.asyncio.subscriber import LoopSubscriber
from django_redlock.wire.cluster import Redirect
from django_redlock.wire.cluster_route import (
    ASKING,
    ASKING_REPLY,
    MAX_HOPS,
    ClusterRoute,
    Endpoint,
    NotCluster,
    Routed,
    plain_form,
    remember,
    shards_reply_map,
)
from django_redlock.wire.errors import PENDING, NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.primitives import PRELOAD
from django_redlock.wire.rounds import Round
from django_redlock.wire.scripts import Command, Commands, fire_and_forget
from django_redlock.wire.sentinel import Watch, watch
from django_redlock.wire.servers import Twins, keep_apart
from django_redlock.wire.setup import (
    UNIDENTIFIED,
    Hello,
    shard_hello,
    warm_tls,
)
from django_redlock.wire.stall import StallRule

__all__ = ["LoopConnections", "LoopSubscriber", "PerLoop", "keep_with_loop"]


def _usable(conn: AsyncConnection | None) -> bool:
    """True if ``conn`` is logged in and not broken: a command may be written to it now."""
    return conn is not None and conn.ready and conn.broken is None


class LoopConnections:
    """The connections of one event loop, one per node.

    Args:
        addresses: the nodes, in the manager's order.
        hello: what every new connection asks its node after its login.
        max_outstanding, stall_reset, stall_age: counts and seconds that judge a node owing
            replies (see :class:`~django_redlock.wire.stall.StallRule`): a node owing
            ``max_outstanding`` replies, the oldest older than ``stall_age``, is skipped; one
            whose oldest owed reply is older than ``stall_reset`` gets a new connection.
    """

    def __init__(
        self,
        addresses: Sequence[NodeAddress],
        hello: Hello,
        *,
        max_outstanding: int = 32,
        stall_reset: float = 1.0,
        stall_age: float | None = None,
    ) -> None:
        self.addresses = tuple(addresses)
        warm_tls(self.addresses)  # now, not inside the first command's deadline
        # Whether a node has REPLICA_ACKS: only then are grants and renewals sent otherwise.
        self.acked = any(address.replica_acks for address in self.addresses)
        self.hello = hello
        # Nodes whose server an earlier node reached: sent nothing (wire/servers.py).
        self.twins: Twins = hello.twins
        self.stall = StallRule(max_outstanding, stall_reset, stall_age)
        # How long a connection opened for a posted command may take (seconds): the node
        # timeout of the last round.
        self.delivery = 1.0
        self.connections: list[AsyncConnection | None] = [None] * len(self.addresses)
        # Cluster nodes, as the sync transport keeps them (see ConnectionSet): the shards'
        # connections follow the nodes' in `connections`, `targets` says where each goes.
        self.targets: list[NodeAddress] = list(self.addresses)
        self.routes: dict[int, ClusterRoute] = {}
        self.shard_of: dict[int, int] = {}
        self.members: dict[tuple[int, Endpoint], int] = {}
        # The connections (by index) whose server's mode (plain or a cluster member) is not
        # known yet: every new one asks, holding every command until the answer (see
        # ConnectionSet.unclassified). Empty in the steady state (send_now's test).
        self.unclassified: set[int] = set()
        self._subscriber = LoopSubscriber(self.addresses)
        self.guard: asyncio.Task[None] | None = None
        # The rounds a task waits for (in outcome), and one timer for all their deadlines,
        # set for the earliest (loop clock; inf: none set): one timer per node timeout
        # or so instead of one made and cancelled per round.
        self.waiting: set[LoopRound] = set()
        self.alarm_at = math.inf
        # The Sentinel nodes, each with the failovers of its service heard in this process
        # (see ConnectionSet.watches).
        self.watches: dict[int, Watch] = {
            index: watch(address)
            for index, address in enumerate(self.addresses)
            if address.sentinel is not None
        }

    @property
    def subscriber(self) -> LoopSubscriber:
        """The pub/sub streams this loop's waiting acquires listen on."""
        return self._subscriber

    async def close_at_loop_end(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self.close()

    async def connection(self, index: int, timeout: float) -> AsyncConnection:
        """Node ``index``'s connection once its opening is over (logged in, or broken),
        opening a new one if there is none or it broke.

        The opening runs in its own task, shielded: a caller cancelled meanwhile (or a
        ``wait_for`` around it) must not cut a connection that other tasks of the loop share
        and wait on in the middle of its login.
        """
        conn = self.opened(index, timeout)
        assert conn.opening is not None
        if not conn.opening.done():
            await asyncio.shield(conn.opening)
        return conn

    def opened(self, index: int, timeout: float) -> AsyncConnection:
        """Node ``index``'s connection, its opening started (within ``timeout`` seconds) if
        there is none or it broke; not awaited: commands given to it meanwhile are queued
        (:class:`AsyncConnection`)."""
        conn = self.connections[index]
        if conn is None or conn.broken is not None:
            node = self.shard_of.get(index)
            if conn is not None:
                conn.close()
                if node is not None:  # a cluster shard's master: its slots may have a new one
                    self.routes[node].failed()
            if node is None:
                # Sentinel nodes do not ask: Sentinel does not manage clusters.
                classify = self.targets[index].sentinel is None
                conn = AsyncConnection(self.targets[index], self.hello, classify=classify)
            else:
                # A shard of a cluster node: its scripts and hello name the shard's records.
                address = self.targets[index]
                tag = self.routes[node].tag_of((address.host or "", address.port or 0)) or ""
                conn = AsyncConnection(
                    address,
                    shard_hello(self.hello, tag, self.addresses[node].label),
                    tuple(script.for_shard(tag) for script in PRELOAD),
                    classify=True,
                    expect_cluster=True,
                )
                conn.redirect = self._redirect
            if conn.asks_mode:
                conn.on_classified = partial(self._classified, index)
            if conn.classifying:
                self.unclassified.add(index)
            watched = self.watches.get(index)
            if watched is not None:
                watched.ensure_running()  # (a forked child has no thread of its parent's)
                conn.switches = watched.switches  # before asking: a switch meanwhile drops it
            self.connections[index] = conn
            conn.opening = asyncio.get_running_loop().create_task(conn.open(timeout))
        return conn

    async def run(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        *,
        give_up: int | None = None,
        identify: bool = False,
        queue_behind: bool = False,
    ) -> Round:
        """One round trip: send ``commands[i]`` to node ``i`` and wait up to ``timeout``
        seconds for the outcome. See :meth:`~django_redlock.wire.transport.Transport.run`
        for the arguments and results (the same as the sync transport's, so both managers
        log the same node errors).

        Commands are written synchronously to every connected node (no task per node: on a
        small machine a task costs more than the round trip); replies are tallied as they
        are parsed, and the caller resumes once the outcome is known or ``timeout`` passes:
        :meth:`send_now` (or, when a node must be connected or read first, the same with
        those awaits before it), then :meth:`outcome`.

        Raises:
            asyncio.CancelledError: the task was cancelled (the round is closed: replies
                still owed are read and dropped).
        """
        self.delivery = timeout
        answer = self.send_now(
            commands,
            timeout,
            yes_value,
            need,
            give_up=give_up,
            identify=identify,
            queue_behind=queue_behind,
        )
        if answer is None:
            answer = await self._send_after_awaits(
                commands, timeout, yes_value, need, give_up, identify, queue_behind
            )
        return await self.outcome(answer)

    def send_now(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        *,
        give_up: int | None = None,
        identify: bool = False,
        queue_behind: bool = False,
    ) -> Round | None:
        """The first half of :meth:`run` (arguments as there) when it needs no await: every
        node given a command has a logged-in connection that owes fewer than
        ``max_outstanding`` replies, the oldest not past the stall reset (so no node is
        judged, read first or replaced: :meth:`StallRule.judged
        <django_redlock.wire.stall.StallRule.judged>` is False for each). The commands are
        written now; returns the round, to pass to :meth:`outcome` with no await between
        (its deadline runs from now). None when a node needs more: nothing was sent, and
        :meth:`run` is the way.

        Raises:
            RuntimeError: no event loop is running.
        """
        if self.watches:
            self._drop_switched()
        if self.routes or self.unclassified:
            return None  # a cluster node's command goes to a shard: the general way
        connections = self.connections
        stall = self.stall
        cap = stall.max_outstanding
        now = time.monotonic()
        fresh = now - stall.stall_reset
        for conn, command in zip(connections, commands, strict=True):
            if command is None:
                continue
            if conn is None or not conn.ready:  # not logged in yet, or broken
                return None
            pending = conn.pending
            if pending and (len(pending) >= cap or pending[0][3] < fresh):
                return None
        answer = LoopRound(len(commands), yes_value, need, give_up)  # new_round inlined
        answer.decided = None
        answer.deadline = asyncio.get_running_loop().time() + timeout
        if self.twins:  # empty unless two nodes reached one server (wire/servers.py)
            commands = keep_apart(answer, commands, self.twins)
        results = answer.results
        expect = self._expect
        if self.acked and acked_round(commands):
            expect = partial(self._expect_acked, timeout_ms=wait_ms(timeout))
        for index, command in enumerate(commands):
            if command is None:
                if results[index] is PENDING:  # else refused (a twin)
                    results[index] = None
            else:
                conn = connections[index]
                assert conn is not None  # checked above
                answer.pending += 1
                expect(conn, index, command, answer, identify, now)
        return answer

    def _expect_acked(
        self,
        conn: AsyncConnection,
        index: int,
        command: Command,
        answer: LoopRound,
        identify: bool,
        now: float,
        *,
        timeout_ms: int,
    ) -> None:
        """:meth:`_expect` for a grant or renewal: followed by its WAIT on a node with
        REPLICA_ACKS (wire/acks.py); as it is on any other node."""
        if conn.acks is None:
            self._expect(conn, index, command, answer, identify, now)
        else:
            conn.send_acked(command, answer, index, now, identify, timeout_ms)

    def _drop_switched(self) -> None:
        """Fail each connection to a Sentinel node opened before a failover of its service
        heard since (see ConnectionSet._drop_switched): the next round opens a new one."""
        for index, watched in self.watches.items():
            conn = self.connections[index]
            if conn is not None and conn.broken is None and conn.switches != watched.switches:
                conn.fail("the Sentinels switched the master: connection dropped")

    async def _send_after_awaits(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        give_up: int | None,
        identify: bool,
        queue_behind: bool,
    ) -> LoopRound:
        """The first half of :meth:`run` in general: nodes that owe many or old replies are
        read first, then judged (skipped, or given a new connection), the nodes not
        connected are connected (or their login awaited), and the commands written. The
        round's deadline runs from after those awaits."""
        answer = new_round(len(commands), yes_value, need, give_up, math.inf)
        if self.twins:  # empty unless two nodes reached one server (wire/servers.py)
            commands = keep_apart(answer, commands, self.twins)
        commands, at = await self._placed(answer, commands, timeout)
        stall = self.stall
        now = time.monotonic()
        judged = [
            conn
            for conn, command in zip(self._of(at), commands, strict=True)
            if command is not None and conn is not None and conn.pending
            if stall.judged(len(conn.pending), conn.age(now), queue_behind)
        ]
        if judged and unread(judged):
            # As the sync transport reads a node before it judges it stalled: this loop may
            # have been blocked (a long garbage collection, a callback that does not yield)
            # while the replies came, and that is no fault of the node.
            await self._take_in(judged)
            now = time.monotonic()
        for conn, command in zip(self._of(at), commands, strict=True):
            # Only a node that owes replies can be past the stall reset (its age is 0 else).
            if (
                command is not None
                and conn is not None
                and conn.pending
                and stall.reset(conn.age(now))
            ):
                # Open, but its oldest owed reply is long overdue (a black hole): replaced.
                conn.fail("stalled connection reset")
        for index, command in enumerate(commands):
            if command is not None and not _usable(self.connections[at[index]]):
                # Connected in the background (or its login not over): the command waits
                # in the connection's queue, and the round's deadline runs from now, as
                # the sync transport's does. The caller never waits for a connect.
                self.opened(at[index], timeout)
        cap = stall.max_outstanding
        now = time.monotonic()
        expect = self._expect
        if self.acked and acked_round(commands):
            expect = partial(self._expect_acked, timeout_ms=wait_ms(timeout))
        for index, command in enumerate(commands):
            if command is None:
                if answer.results[index] is PENDING:  # else refused: not placed
                    answer.results[index] = None
                continue
            conn = self.connections[at[index]]
            assert conn is not None
            if conn.broken is not None:
                answer.refuse(index, NodeError(conn.broken))
                continue
            owed = len(conn.pending)
            if owed >= cap and not (queue_behind and stall.room(owed, conn.age(now))):
                reason = stall.refusal(owed, conn.age(now))
                if reason is not None:
                    answer.refuse(index, NodeError(reason))
                    continue
            answer.pending += 1
            expect(conn, index, command, answer, identify, now)
        answer.deadline = asyncio.get_running_loop().time() + timeout
        return answer

    async def outcome(self, answer: Round, *, keep_open: bool = False) -> Round:
        """Wait for the outcome of ``answer`` (a round :meth:`send_now` sent) until it is
        known or its deadline passes; then it is closed (late replies are dropped) and
        returned, each reply still owed :data:`~django_redlock.wire.errors.TIMED_OUT`.

        ``keep_open``: a cancellation leaves the round open (its replies still counted), for
        a caller that waits for it again, with this method, in another task; its deadline
        stays the one it had.

        Raises:
            asyncio.CancelledError: the task was cancelled (the round is closed, unless
                ``keep_open``).
        """
        assert isinstance(answer, LoopRound)
        twins = self.twins  # empty unless two nodes reached one server (wire/servers.py)
        if twins:
            # Two addresses of one server may both have said yes before their hellos told
            # them apart: then the quorum is short, and the round waits on.
            answer.counted_twice(twins)
        # Round.known inlined: a quorum said yes, too many said no, or all answered.
        if answer.yes < answer.need and answer.no <= answer.give_up and answer.pending > 0:
            loop = asyncio.get_running_loop()
            decided = answer.decided = loop.create_future()
            # The alarm on the loop instead of asyncio.wait_for: no extra task and no shield
            # per round trip (wait_for costs more than a loopback round trip here).
            self.waiting.add(answer)
            if answer.deadline < self.alarm_at:
                self._set_alarm(loop, answer.deadline)
            cancelled = False
            try:
                await decided
                while twins and answer.counted_twice(twins) and loop.time() < answer.deadline:
                    decided = answer.decided = loop.create_future()
                    if answer.deadline < self.alarm_at:
                        self._set_alarm(loop, answer.deadline)
                    await decided
                if not answer.known():
                    # The deadline passed undecided. A reply that sits in its socket is an
                    # answer, not a timeout: the loop may have been blocked while the nodes
                    # answered (the timer can run before the loop reads what came during
                    # the block), and that pause is the client's. The caller counts the
                    # validity from before the send, so the lease still loses that time (the
                    # Redlock spec's step 3).
                    await self._take_in(
                        [
                            conn
                            for index, reply in enumerate(answer.results)
                            if reply is PENDING
                            for conn in self._connections_of(index)
                        ],
                        answer.known,
                    )
                    answer.time_out()
            except asyncio.CancelledError:
                cancelled = True
                raise
            finally:
                self.waiting.discard(answer)
                answer.decided = None
                # Over, decided or cancelled: late replies are dropped, and a NOSCRIPT
                # fallback that is not ``when_over`` is no longer sent (an acquire's SET
                # re-sent now would land after the clean-up release).
                if not (cancelled and keep_open):
                    answer.closed = True
        answer.closed = True
        return answer

    def _set_alarm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """Ring :meth:`_ring` at ``when`` (the loop's clock, seconds), before the time it
        was set for (an alarm set for later rings anyway: it finds nothing due)."""
        self.alarm_at = when
        loop.call_at(when, self._ring, loop)

    def _ring(self, loop: asyncio.AbstractEventLoop) -> None:
        """The alarm: wake each waiting round whose deadline has passed (its task then
        looks at what the sockets hold and times out the rest), and set the alarm again
        for the earliest deadline still ahead."""
        self.alarm_at = math.inf
        now = loop.time()
        ahead = math.inf
        for answer in self.waiting:
            if answer.deadline <= now:
                if answer.decided is not None:
                    settle(answer.decided)
            elif answer.deadline < ahead:
                ahead = answer.deadline
        if ahead < self.alarm_at:
            self._set_alarm(loop, ahead)

    async def _take_in(
        self, conns: Sequence[AsyncConnection], settled: Callable[[], bool] | None = None
    ) -> None:
        """Let the event loop read what already sits in ``conns``' sockets: a few turns of
        the loop (the reading is the transports'), ending as soon as nothing is left unread
        there or ``settled()`` says the round needs no more. Never waits for new bytes."""
        for _ in range(TAKE_IN_TURNS):
            if (settled is not None and settled()) or not unread(conns):
                return
            await asyncio.sleep(0)

    def post(self, commands: Commands) -> None:
        """Write ``commands[i]`` to node ``i`` now, without awaiting (safe in a task being
        cancelled), queued behind what each node owes; the replies are read and dropped.
        A node not connected gets a connection opened in the background, the command
        queued on it (within the last round's node timeout). See
        :meth:`~django_redlock.wire.transport.Transport.post`.

        Raises:
            Nothing: a node that cannot be written to is left out (best effort).
        """
        # Its replies are dropped (closed), except that a NOSCRIPT still gets the EVAL
        # fallback: clean-up commands are built with ``when_over=True``.
        ignored = new_round(len(commands), None, 0, None, math.inf)
        ignored.closed = True
        now = time.monotonic()
        for index, command in enumerate(commands):
            if command is None:
                continue
            at = index
            if index in self.routes:
                try:
                    at, command = self._place(index, command)
                except NodeError:
                    continue
            conn = self.connections[at]
            if conn is None or conn.broken is not None:
                conn = self.opened(at, self.delivery)
            self._expect(conn, index, fire_and_forget(command), ignored, False, now)

    def open_count(self) -> int:
        """How many sockets this loop holds open now, its pub/sub ones included."""
        count = sum(1 for conn in self.connections if conn is not None and conn.broken is None)
        return count + self._subscriber.open_count()

    def _expect(
        self,
        conn: AsyncConnection,
        index: int,
        command: Command,
        answer: LoopRound,
        identify: bool,
        now: float,
    ) -> None:
        """Send ``command`` on ``conn`` (asked at ``now``, monotonic seconds); its reply is
        node ``index``'s answer in ``answer``, re-sent as EVAL once if the node had no copy
        of the script (see :func:`~django_redlock.wire.rounds.on_reply`). The task waiting
        for ``answer`` resumes once the reply that makes its outcome known is parsed.

        :meth:`AsyncConnection.send` inlined (one call fewer per node and round)."""
        if conn.broken is not None:
            record_reply(answer, index, NodeError(conn.broken))
            return
        transport = conn.transport
        if not conn.ready or transport is None:  # still opening: written once it is open
            conn.queued.append((command[0], (answer, index, command[1], now), identify))
            return
        conn.pending.append((answer, index, command[1], now))
        if conn.held is None:  # Handshake.outgoing's usual case: the hello was answered
            transport.write(command[0] + conn.identity if identify else command[0])
            return
        data = conn.outgoing(command[0], identify)
        if data:  # else held until the hello is answered
            transport.write(data)

    def close(self) -> None:
        """Close every socket (they reopen on the next round or subscribe)."""
        for conn in self.connections:
            if conn is not None:
                conn.close()
        self.connections = [None] * len(self.addresses)
        self.targets = list(self.addresses)
        self.shard_of.clear()
        self.members.clear()
        # Every node plain again: the next connections ask their servers' mode.
        self.routes.clear()
        self.unclassified.clear()
        self._subscriber.close()

    # -- cluster nodes (wire/cluster_route.py; the sync transport's ConnectionSet likewise) --

    def _classified(self, index: int, conn: AsyncConnection) -> None:
        """Connection ``index`` learned its server's mode. The one the node is used in
        (plain for its own address, a cluster member for a shard's): it sends what it held.
        A cluster member at a plain node's address: the node is a cluster node from now on
        (in this loop, until a connection to its address finds a plain server:
        :meth:`_unroute`), and what the connection held goes to the shards, each command in
        its shard's form, with the reply slot it had; the connection is closed. A plain
        server at a shard's address: :meth:`_unroute`."""
        self.unclassified.discard(index)
        connections = self.connections
        if index >= len(connections) or connections[index] is not conn:
            return  # replaced or dropped meanwhile (it was failed then: nothing goes out)
        node = self.shard_of.get(index)
        if not conn.switched:
            if node is None:
                remember(self.addresses[index], None)  # the hint (cluster_route.known)
            return
        if node is not None:
            self._unroute(node, conn)
            return
        address = self.addresses[index]
        held = conn.take_held()
        slots = [conn.pending.pop() for _ in held][::-1]
        try:
            # A CLUSTER SHARDS reply (or, before Redis 7, CLUSTER SLOTS read here: blocking
            # within the node timeout, once each time a connection finds a plain node's
            # address serving a cluster member).
            slot_map = shards_reply_map(address, conn.cluster_shards, self.delivery)
        except NodeError as exc:
            for answer, node, _, _ in slots:
                if answer is not None:
                    record_reply(answer, node, NodeError(str(exc)))
            conn.fail(str(exc))
            return
        remember(address, slot_map)
        route = self.routes[index] = ClusterRoute(address, slot_map)
        conn.fail("a cluster node: its commands go to its shards")
        for (data, identify), (answer, node, fallback, asked) in zip(held, slots, strict=True):
            try:
                endpoint, placed, _ = route.place(data)
            except NodeError as exc:
                if answer is not None:
                    record_reply(answer, node, exc)
                continue
            target = self.opened(self._member(index, endpoint), self.delivery)
            routed = None if fallback is None else Routed.of(fallback, route, endpoint)
            target.send(placed, (answer, node, routed, asked), identify)

    def _unroute(self, node: int, conn: AsyncConnection | None) -> None:
        """Cluster node ``node`` is plain now: a shard connection of it found a plain server
        (``conn``, holding what it was given), or its own address answered as one when its
        slot map was read (see ConnectionSet._unroute, the same rule). Its route and shard
        connections go; what ``conn`` held is sent in plain form on the node's own
        connection, which asks its server's mode first."""
        held = conn.take_held() if conn is not None else []
        slots = [conn.pending.pop() for _ in held][::-1] if conn is not None else []
        for at in [at for at, of in self.shard_of.items() if of == node]:
            shard = self.connections[at]
            if shard is not None:
                shard.fail("the node is not a cluster any more: connection dropped")
            self.connections[at] = None  # unused from now on
            del self.shard_of[at]
        for key in [key for key in self.members if key[0] == node]:
            del self.members[key]
        del self.routes[node]
        if not self.routes:  # no shard connection left: the nodes' own ones only, as at first
            del self.connections[len(self.addresses) :]
            del self.targets[len(self.addresses) :]
        own = self.opened(node, self.delivery)
        for (data, identify), (answer, index, fallback, asked) in zip(held, slots, strict=True):
            if answer is None:  # a set-up command or an ASKING: the shard's alone
                continue
            plain = plain_form(data, fallback, identify)
            if plain is None:
                record_reply(answer, index, NodeError("the node is not a cluster any more"))
                continue
            own.send(plain[0], (answer, index, plain[1], asked), plain[2])

    async def _placed(
        self, answer: LoopRound, commands: Commands, timeout: float
    ) -> tuple[list[Command | None], list[int]]:
        """Each node's command as it goes (a cluster node's placed on its shard), and the
        connection it goes on; a node that gets nothing has ``None`` (refused in ``answer``
        when it could not be placed or classified). A stale slot map is read first; a node
        whose own address answers as a plain server then is plain (:meth:`_unroute`)."""
        for index, route in list(self.routes.items()):
            if route.stale:
                try:
                    route.refresh(await asyncio.to_thread(route.read, timeout))
                except NotCluster:
                    if self.routes.get(index) is route:
                        self._unroute(index, None)
                except NodeError:  # the old map stays in use
                    pass
        placed: list[Command | None] = []
        at: list[int] = []
        for index, command in enumerate(commands):
            target = index
            if command is not None and index in self.routes:
                try:
                    target, command = self._place(index, command)
                except NodeError as exc:
                    answer.refuse(index, exc)
                    command = None
            placed.append(command)
            at.append(target)
        return placed, at

    def _of(self, at: Sequence[int]) -> list[AsyncConnection | None]:
        return [self.connections[index] for index in at]

    def _connections_of(self, index: int) -> list[AsyncConnection]:
        """Node ``index``'s connections: its own, and its shards' (a cluster node)."""
        found = [self.connections[index]]
        found += [self.connections[at] for at, node in self.shard_of.items() if node == index]
        return [conn for conn in found if conn is not None]

    def _place(self, index: int, command: Command) -> tuple[int, Command]:
        """Cluster node ``index``'s ``command`` on its shard: the connection index and the
        command in the shard's form (see ConnectionSet._place).

        Raises:
            NodeError: it cannot be placed (no master serves its slot, or the map is stale).
        """
        route = self.routes[index]
        endpoint, data, _ = route.place(command[0])
        fallback = command[1]
        routed = None if fallback is None else Routed.of(fallback, route, endpoint)
        return self._member(index, endpoint), (data, routed)

    def _member(self, index: int, endpoint: Endpoint) -> int:
        """The index of the connection to shard master ``endpoint`` of cluster node
        ``index`` (a new entry, opened on first use)."""
        at = self.members.get((index, endpoint))
        if at is None:
            at = len(self.connections)
            self.connections.append(None)
            self.targets.append(self.routes[index].member(endpoint))
            self.shard_of[at] = index
            self.members[(index, endpoint)] = at
        return at

    def _redirect(self, conn: AsyncConnection, redirect: Redirect, slot: Slot) -> None:
        """A shard answered MOVED or ASK for ``slot``'s command: send it to the shard named
        (see ConnectionSet._redirect, the same rule)."""
        answer, node, fallback, _ = slot
        assert answer is not None
        assert isinstance(fallback, Routed)
        endpoint = (redirect.host or conn.address.host or "", redirect.port)
        route = fallback.route
        if not redirect.ask:
            route.moved(redirect.slot, endpoint)  # learnt even when too late to re-send
        if answer.closed and not fallback.when_over:
            return
        if fallback.hops >= MAX_HOPS:
            record_reply(answer, node, NodeError(f"redirected {fallback.hops} times; giving up"))
            return
        try:
            data = route.rewrite(fallback.original.build(), endpoint)
        except NodeError as exc:
            record_reply(answer, node, exc)
            return
        target = self.opened(self._member(node, endpoint), self.delivery)
        routed = Routed.of(fallback.original, route, endpoint, fallback.hops + 1)
        now = time.monotonic()
        identify = routed.identify
        if redirect.ask:
            # ASKING holds for the very next command only: the two go together, the command
            # never held behind the hello (its identity left blank: the node checks itself).
            target.send(ASKING, (None, ASKING_REPLY, None, now))
            if identify:
                data += UNIDENTIFIED
                identify = False
        target.send(data, (answer, node, routed, now), identify)


# Seconds: how far off the timer that keeps a task (keep_with_loop) is set where a loop
# takes no infinite time (uvloop's timers are whole milliseconds): a year.
_A_YEAR = 365 * 24 * 3600.0


def keep_with_loop(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
    """Have ``loop`` keep ``task`` while the loop is open and the task is not done (a loop
    holds its tasks only weakly), through a timer that never fires: closing the loop drops
    its timers, so a loop closed on the task, kept or not, keeps nothing of it. Not a module
    global (which a loop closed with the task pending would leave holding it for ever), nor
    the loop's ``__dict__`` (which a closed loop still referenced would hold)."""
    try:
        keeper = loop.call_at(math.inf, task.cancel)
    except (OverflowError, ValueError):  # a loop whose timers must be finite
        keeper = loop.call_later(_A_YEAR, task.cancel)
    task.add_done_callback(lambda _: keeper.cancel())


class PerLoop:
    """Hands each event loop its own :class:`LoopConnections` (made by ``factory``), each
    closed when its loop ends: the asyncio twin of
    :class:`~django_redlock.wire.sync.connections.ThreadConnections`."""

    def __init__(self, factory: Callable[[], LoopConnections]) -> None:
        self._factory = factory
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopConnections] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        # The loop (weakly) and connections get found last: most calls come from the same
        # loop as the one before, and need no lock and no lookup. One attribute, read at
        # once, so a thread running another loop sees a pair or the other, never a mix.
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], LoopConnections] | None = None

    def __len__(self) -> int:
        """How many loops have connections open here."""
        return len(self._loops)

    def get(self, keep: object) -> LoopConnections:
        """The running loop's connections, opened on first use; ``keep`` (the manager) is
        kept alive by them until the loop ends.

        Raises:
            RuntimeError: no running event loop.
        """
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1]
        with self._lock:
            connections = self._loops.get(loop)
            if connections is None:
                # The entries of loops closed with their guard pending (a loop closed on
                # pending tasks, never cancelled): an entry's connections refer to its loop,
                # so it would never leave this weakly keyed map, and with it the futures of
                # the tasks left waiting, those tasks and the leases they hold. Their
                # transports cannot be closed through a closed loop: they close as they are
                # freed.
                for closed in [other for other in self._loops if other.is_closed()]:
                    del self._loops[closed]
                connections = self._factory()
                self._loops[loop] = connections
                # Closes the connections when the loop's tasks are cancelled at its end
                # (asyncio.run does that): protocols have no reader task that would.
                guard = loop.create_task(connections.close_at_loop_end())
                connections.guard = guard
                # The guard belongs to the loop, and the entry keeps the guard: forgotten
                # with it, or every ended loop (one per asyncio.run, or per async_to_sync
                # call) would stay in memory with its connections. Its callback keeps
                # ``keep`` (a manager whose leases hold it weakly) while the loop runs.
                guard.add_done_callback(partial(self._forget, connections, keep))
                # Kept by the loop while it is open: otherwise a manager nobody else keeps
                # would be freed with its guard, pending, while the loop still runs.
                keep_with_loop(loop, guard)
            self._last = (weakref.ref(loop), connections)
        return connections

    def _forget(
        self, connections: LoopConnections, keep: object, guard: asyncio.Task[None]
    ) -> None:
        """Drop the entry of the loop whose ``guard`` ended (its connections are closed)."""
        with self._lock:
            loop = guard.get_loop()
            if self._loops.get(loop) is connections:
                del self._loops[loop]
            last = self._last
            if last is not None and last[1] is connections:
                self._last = None
