"""The sync transport: one connection per node for each thread, and the poll loop that runs a
round trip to every node at once.

Redlock's safety argument assumes the time to reach the nodes is small next to the lease
(the spec: "the client uses a timeout that is small compared to the auto-release time").
Asking nodes one after another makes that time grow with N; a thread per node costs more than
it saves. So each round writes its command to every node's socket, then reads replies with
one ``poll()`` until the caller has an answer (a quorum reached, or no longer reachable) or the
per-node timeout ends.

Connections are plain sockets (:class:`~django_redlock.wire.sync.connection.NodeSocket`) owned by
one thread (see :class:`ConnectionSet`; the pub/sub ones, on which waiters hear of releases,
are shared by a manager's threads: see :class:`~django_redlock.wire.sync.subscriber.Subscriber`).
Later commands are pipelined behind a reply still owed on the same socket, which keeps the
order of an acquire and its clean-up release on a node that stalled (a SIGSTOPped server
applies its queued input on SIGCONT: without that order a late SET would leave a zombie key).
A node that owes too many replies is skipped without sending until it answers or its
connection is reset (:mod:`~django_redlock.wire.stall`), so a stalled node costs neither time
nor new connections.

What a round leaves unsent when it returns (a connect or TLS handshake still under way, a
socket buffer full, commands held behind a hello) is not left to this thread's next operation,
which may never come: a courier thread takes the set for at most one node timeout and writes
it (see :meth:`ConnectionSet.deliver_rest`), so every reachable node gets each round's request,
and the caller's wait never includes a connect.

:class:`ConnectionSet` is a :class:`~django_redlock.wire.transport.Transport`.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from django_redlock.wire import process
from django_redlock.wire.acks import acked_round, wait_ms
from django_redlock.wire.cluster import Redirect, parse_redirect
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
from django_redlock.wire.errors import PENDING, NodeError, NotSent
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.process import current_pid
from django_redlock.wire.resp import BAD_REPLY, PROTOCOL_ERRORS, ReplyError
from django_redlock.wire.rounds import RELOAD, RESEND, Round, on_reply
from django_redlock.wire.scripts import Command, Commands, Fallback, Script, fire_and_forget
from django_redlock.wire.sentinel import Watch, forget, watch
from django_redlock.wire.servers import Twins, keep_apart
from django_redlock.wire.setup import (
    CLUSTER_MAP,
    UNIDENTIFIED,
    Hello,
    describe,
    is_replica_reply,
    shard_hello,
    warm_tls,
)
from django_redlock.wire.stall import StallRule
from django_redlock.wire.sync.connection import (
    HUNG_UP,
    POLL_ERR,
    POLL_IN,
    READ_SIZE,
    NodeSocket,
    Slot,
    close_all,
)
from django_redlock.wire.sync.subscriber import Subscriber

__all__ = ["ConnectionSet", "ThreadConnections"]

# A connection set unused this long (seconds) looks for closed sockets before sending.
_IDLE = 0.005


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


_POLLOUT = select.POLLOUT
_READABLE = POLL_IN | POLL_ERR
_POLLIN = select.POLLIN


class ConnectionSet:
    """One connection per node for one thread, and the poll loop that uses them.

    Not thread-safe by design: :class:`~django_redlock.redlock.LockManager` keeps one set per
    thread, so no lock is taken on the hot path. A set notices a fork (the child owns none of
    the parent's sockets) and starts afresh.

    Args:
        addresses: the nodes, in the manager's order.
        clock: monotonic clock in seconds (injected by tests).
        max_outstanding, stall_reset, stall_age: counts and seconds that judge a node owing
            replies (see :class:`~django_redlock.wire.stall.StallRule`): one owing
            ``max_outstanding``, the oldest older than ``stall_age``, is skipped without
            sending; one whose oldest owed reply is older than ``stall_reset`` gets a new
            connection.
        preload: scripts loaded (SCRIPT LOAD) on every new connection.
        hello: what every new connection asks the node after its login (see :class:`Hello`).
    """

    def __init__(
        self,
        addresses: Sequence[NodeAddress],
        *,
        clock: Callable[[], float],
        max_outstanding: int,
        stall_reset: float,
        preload: Sequence[Script] = (),
        hello: Hello | None = None,
        stall_age: float | None = None,
    ) -> None:
        self.addresses = tuple(addresses)
        # Whether a node has REPLICA_ACKS: only then are grants and renewals sent otherwise.
        self.acked = any(address.replica_acks for address in self.addresses)
        warm_tls(self.addresses)  # now, not inside the first command's deadline
        self.preload = tuple(preload)
        self.hello = hello
        # Nodes whose server an earlier node reached: sent nothing (wire/servers.py).
        self.twins: Twins = {} if hello is None else hello.twins
        self.clock = clock
        self.stall = StallRule(max_outstanding, stall_reset, stall_age)
        self.pid = current_pid()
        self.connections: list[NodeSocket | None] = [None] * len(self.addresses)
        # Where each connection goes: the nodes first, then (cluster nodes) one entry per
        # shard master reached, appended as they are met (see _member).
        self.targets: list[NodeAddress] = list(self.addresses)
        # Cluster nodes (wire/cluster_route.py): node index -> its route; the node index of
        # each shard connection; the shard connection of (node index, master).
        self.routes: dict[int, ClusterRoute] = {}
        self.shard_of: dict[int, int] = {}
        self.members: dict[tuple[int, Endpoint], int] = {}
        # The connections (by index) that have not learned yet whether their server is
        # plain or a cluster member: every new one asks, and holds every command until the
        # answer (Handshake.classifying), so that a lock's keys never take the form of the
        # other mode on a server (an endpoint switched between the two, a port re-used: the
        # mode is the server process's, not the address's). Every node starts plain, and
        # becomes a cluster node when a connection finds a cluster member (_adopt); a plain
        # node again when a connection to its own address finds a plain server (_unroute).
        # Sentinel nodes do not ask: Sentinel does not manage clusters. Empty in the steady
        # state, so that the hot path tests one empty set.
        self.unclassified: set[int] = set()
        # One poll object for the set's life: every open socket stays registered, so a wait
        # costs one poll() call per wake-up and no per-call registration.
        self.poller = select.poll()
        self.by_fd: dict[int, int] = {}
        # fd -> its connection (which knows its node's index): one lookup per poll event.
        self.polling: dict[int, NodeSocket] = {}
        self.last_post = float("-inf")
        # The courier (deliver_rest): while `lent`, a thread of its own writes what the last
        # round left unsent, holding `_courier`; the owner thread takes the set back (waits
        # for it) before its next operation. `delivery` is how long the courier may take: the
        # node timeout of the last round (seconds). `unsent` is set wherever bytes may be left
        # in a connection's buffer, so a round that wrote everything checks nothing.
        self.lent = False
        self._courier = threading.Lock()
        self._wanted = False  # the owner wants the set back: the courier stops at once
        # A pipe whose read end the courier polls beside the sockets: the owner rings it to
        # take the set back at once (made on the first lending; None until then).
        self._bell: tuple[int, int] | None = None
        self.delivery = 1.0
        self.unsent = False
        # Seconds this round spent asking Sentinels where a node's master is (real time,
        # see _connection): taken off the round's wait, so that the round stays within the
        # node timeout whatever the Sentinels do.
        self.asking = 0.0
        # The Sentinel nodes, each with the failovers of its service heard in this process:
        # a connection opened before the last one is dropped before the next round.
        self.watches: dict[int, Watch] = {
            index: watch(address)
            for index, address in enumerate(self.addresses)
            if address.sentinel is not None
        }
        # Whether a connection opened lately may still hold commands until its hello is
        # answered (see wait): checked only then, not on every round trip.
        self.settling = False
        # The pub/sub sockets: the manager's, shared by all its threads (see ThreadConnections),
        # or this set's own, opened on first use, when the set stands alone.
        self._subscriber: Subscriber | None = None
        self._shared_subscriber = False
        # Closes the sockets when the set is dropped without close(). A weakref finalizer
        # runs before the garbage collector finalizes the sockets themselves, even when the
        # set is freed as part of a reference cycle; it holds the list, not the set.
        weakref.finalize(self, close_all, self.connections)

    @property
    def subscriber(self) -> Subscriber:
        """The pub/sub sockets a waiting acquire listens on: the manager's, shared by all its
        threads, or (a set standing alone) this set's own, opened on first use."""
        if self._subscriber is None:
            self._subscriber = Subscriber(self.addresses)
        return self._subscriber

    def share(self, subscriber: Subscriber) -> None:
        """Listen on ``subscriber`` (shared with other sets, which close and count it)."""
        self._subscriber = subscriber
        self._shared_subscriber = True

    def open_count(self) -> int:
        """How many sockets this set holds open now (its own pub/sub ones included, a shared
        subscriber's not: :class:`ThreadConnections` counts those once)."""
        count = sum(1 for conn in self.connections if conn is not None)
        if self._subscriber is not None and not self._shared_subscriber:
            count += self._subscriber.open_count()
        return count

    def close(self) -> None:
        """Close every socket (in the owning process only)."""
        if self.pid != current_pid():
            self._forget_all()
            return
        if self.lent:
            self._take_back()
        for index in range(len(self.connections)):
            self._drop(index, "connection closed by the client")
        if self._subscriber is not None and not self._shared_subscriber:
            self._subscriber.close()

    def _forget_all(self) -> None:
        # After fork: the sockets are copies of the parent's. Closing our copy does not touch
        # the parent's connection (no shutdown is sent), and nothing is read or written.
        close_all(self.connections)
        if not self._shared_subscriber:  # a shared one starts afresh in its own fork hook
            if self._subscriber is not None:
                close_all(self._subscriber.connections)
            self._subscriber = None
        self.poller = select.poll()
        self.by_fd.clear()
        self.polling.clear()
        self.pid = current_pid()
        # A courier of the parent's does not exist here; its lock may have been copied held.
        self._courier = threading.Lock()
        self.lent = False
        self.unsent = False
        if self._bell is not None:  # the parent's pipe: this process makes its own
            _close_fds(*self._bell)
            self._bell = None

    def _drop(self, index: int, reason: str) -> None:
        conn = self.connections[index]
        if conn is None:
            return
        self.connections[index] = None
        fd = self.by_fd.pop(index, None)
        if fd is not None:
            self.polling.pop(fd, None)
            self.poller.unregister(fd)
        conn.close()
        self.unclassified.discard(index)
        # A Sentinel node's connection lost, stalled or met a replica: where its master is
        # may have changed, so the next connection asks the Sentinels again.
        forget(conn.address, stale=conn.met_replica)
        node = self.shard_of.get(index)
        if node is not None:  # a cluster shard's master: its slots may have a new one
            self.routes[node].failed()
        for answer, index_, _, _ in conn.slots:
            if answer is not None:
                answer.record(index_, NodeError(reason))

    def _connection(self, index: int, now: float) -> NodeSocket:
        """The usable connection to node ``index``, opened if needed.

        Replies still owed from earlier operations do not stop a new command: it is pipelined
        behind them and they are read (and dropped) as they come. A node is judged by the age
        of its oldest owed reply, not by a count alone (see
        :class:`~django_redlock.wire.stall.StallRule`): one that owes many replies, the oldest
        older than ``stall_age``, is first drained without blocking, then skipped if that
        did not help; one whose oldest owed reply is older than ``stall_reset`` gets a new
        connection (a black hole: open, never answering).

        Raises:
            NodeError: the node cannot be reached, or is stalled.
        """
        conn = self.connections[index]
        if conn is not None and conn.slots:
            stall = self.stall
            if stall.judged(len(conn.slots), now - conn.slots[0][3]):
                self._read(index, conn)
                conn = self.connections[index]
                if conn is not None and conn.slots:
                    age = now - conn.slots[0][3]
                    if stall.reset(age):
                        self._drop(index, "stalled connection reset")
                        conn = None
                    else:
                        reason = stall.refusal(len(conn.slots), age)
                        if reason is not None:
                            raise NodeError(reason)
        if conn is None:
            address = self.targets[index]
            node = self.shard_of.get(index)
            if node is not None:
                # A shard of a cluster node: its scripts and hello name the shard's records.
                route = self.routes[node]
                tag = route.tag_of((address.host or "", address.port or 0)) or ""
                try:
                    conn = NodeSocket(
                        address,
                        self.clock,
                        tuple(script.for_shard(tag) for script in self.preload),
                        shard_hello(self.hello, tag, self.addresses[node].label),
                        classify=True,
                        expect_cluster=True,
                    )
                except NodeError:
                    route.failed()
                    raise
            elif address.sentinel is None:
                conn = NodeSocket(address, self.clock, self.preload, self.hello, classify=True)
            else:
                watched = self.watches[index]
                watched.ensure_running()  # (a forked child has no thread of its parent's)
                switches = watched.switches  # before asking: a switch meanwhile drops it
                # Asking the Sentinels blocks (within the node timeout): counted, so the
                # round's wait is shortened by as much (see run).
                started = time.monotonic()
                try:
                    conn = NodeSocket(
                        address, self.clock, self.preload, self.hello, timeout=self.delivery
                    )
                finally:
                    self.asking += time.monotonic() - started
                conn.switches = switches
            conn.index = index
            self.settling = self.hello is not None
            if conn.classifying:
                self.unclassified.add(index)
            self.connections[index] = conn
            self._rearm(index, conn)
        return conn

    def _rearm(self, index: int, conn: NodeSocket) -> None:
        """Poll ``conn`` for what it waits on now, under its current file descriptor (a
        connect that moved on to the node's next address has a new socket)."""
        fd = conn.fileno()
        if conn.out:
            self.unsent = True
        if self.by_fd.get(index) == fd:
            self.poller.modify(fd, conn.events())
            return
        old = self.by_fd.pop(index, None)
        if old is not None:
            self.polling.pop(old, None)
            with contextlib.suppress(KeyError):
                self.poller.unregister(old)
        self.by_fd[index] = fd
        self.polling[fd] = conn
        self.poller.register(fd, conn.events())

    def _read(self, index: int, conn: NodeSocket, hung_up: int = 0) -> None:
        """Read what node ``index`` sent and hand each reply to the operation waiting for it
        (a node that fails, or sends bytes that are not RESP, is dropped and its owed replies
        become errors).

        ``hung_up``: the poll said the node closed the connection. Its last replies and the
        close often come in one read, which then ends without seeing the close: the
        connection is dropped here, after those replies, so that the next command (the
        release right after a node restarted) goes on a new connection instead of failing
        with "broken pipe" on this one, and the key it should delete staying until its ttl.
        """
        reader = conn.reader
        if conn.connecting or conn.tls_handshaking or conn.tls:
            try:
                conn.receive()
            except NodeError as exc:
                self._drop(index, str(exc))
                return
            if conn.connecting:  # may have moved on to the node's next address
                self._rearm(index, conn)
                return
            if conn.out:
                # A TLS handshake that ended here (it waited for the node's answer, polled
                # for input only) with bytes still to write: poll for output again.
                self._rearm(index, conn)
        else:
            # NodeSocket.receive for a plain connected socket, inlined (one call less per
            # read): read until the socket is empty.
            sock = conn.sock
            while True:
                try:
                    data = sock.recv(READ_SIZE)
                except BlockingIOError:
                    break
                except OSError as exc:
                    self._drop(index, describe(exc))
                    return
                if not data:
                    self._drop(index, "connection closed by the server")
                    return
                reader.feed(data)
                if len(data) < READ_SIZE:
                    break
        if self._replies(index, conn) and hung_up:
            self._drop(index, "connection closed by the server")

    def _replies(self, index: int, conn: NodeSocket) -> bool:
        """Hand each complete reply in ``conn``'s reader to what waits for it; False if the
        node was dropped (its owed replies are errors then). The same loop is inlined in
        :meth:`_poll_once` for a ready connection (one call less per node and round): a
        change here goes there too."""
        reader = conn.reader
        slots = conn.slots
        while slots:
            try:
                reply = reader.gets()
            except PROTOCOL_ERRORS:
                self._drop(index, BAD_REPLY)
                return False
            if reply is False:
                break
            slot = slots.popleft()
            answer = slot[0]
            if answer is None or type(reply) is ReplyError:
                if not self._unusual(index, conn, reply, slot):
                    return False
            elif not answer.closed:  # a late reply is dropped here: no call on the hot path
                # Round.record inlined (one call less per reply).
                answer.results[slot[1]] = reply
                answer.pending -= 1
                if reply == answer.yes_value:
                    answer.yes += 1
                else:
                    answer.no += 1
        return True

    def _unusual(self, index: int, conn: NodeSocket, reply: object, slot: Slot) -> bool:
        """A reply to a set-up command (``slot`` names no round), or an error reply: learn
        from it, re-send a script's EVAL fallback or reload the scripts (NOSCRIPT), or
        record the error. False if the node was dropped."""
        answer, slot_index, fallback, _ = slot
        if answer is None:
            try:
                out = conn.learn(slot_index, reply)
            except NodeError as exc:  # AUTH or SELECT refused: the connection is useless
                self._drop(index, str(exc))
                return False
            if slot_index == CLUSTER_MAP:
                self.unclassified.discard(index)
                node = self.shard_of.get(index)
                if conn.switched:  # not the mode the node is used in: switch it first
                    if node is None:
                        self._adopt(index, conn)
                    else:
                        self._unroute(node, conn)
                    return False
                if node is None:
                    remember(self.addresses[index], None)  # the hint (cluster_route.known)
            return not out or self._write(index, conn, out)
        assert type(reply) is ReplyError
        if index in self.shard_of and isinstance(fallback, Routed):
            redirect = parse_redirect(str(reply))
            if redirect is not None:
                self._redirect(index, conn, redirect, slot)
                return True
        action = on_reply(reply, fallback, answer.closed)
        if action == RESEND:
            assert fallback is not None  # on_reply resends only a fallback
            return self._resend(index, conn, fallback, answer, slot_index)
        if action == RELOAD:  # too late to run, not to load
            for command, step in conn.reload_commands():
                if not self._write_expecting(index, conn, command, step):
                    return False
            return True
        answer.record(slot_index, NodeError(str(reply)))
        if is_replica_reply(reply):
            # A replica answers (a demotion, a Sentinel's stale answer, a replica listed as
            # the node): the next connection reads the identity afresh, and a Sentinel node
            # asks where its master is now.
            conn.met_replica = True
            self._drop(index, "the node is a replica: connection dropped")
            return False
        return True

    def _write(self, index: int, conn: NodeSocket, data: bytes) -> bool:
        """Write ``data`` (no reply expected of its own) on ``conn``; False if that failed
        (the node was dropped)."""
        conn.out += data
        try:
            conn.flush()
        except NodeError as exc:
            self._drop(index, str(exc))
            return False
        self._rearm(index, conn)
        return True

    def _write_expecting(self, index: int, conn: NodeSocket, command: bytes, step: int) -> bool:
        """Send set-up ``command`` (its reply, for set-up ``step``, goes to the handshake);
        False if the node was dropped."""
        return self._send_or_drop(index, conn, [(command, (None, step, None, self.clock()))])

    def _resend(
        self, index: int, conn: NodeSocket, fallback: Fallback, answer: Round, slot: int
    ) -> bool:
        """The node had no copy of a script (NOSCRIPT): send the EVAL fallback for node
        ``slot`` of ``answer``, and load the scripts again. False if the node was dropped."""
        now = self.clock()
        # Completed with the connection's identity when the command it replaces was.
        try:
            conn.send(fallback.build(), (answer, slot, None, now), fallback.identify)
        except NodeError as exc:
            self._drop(index, str(exc))
            return False
        sends = [(command, (None, step, None, now)) for command, step in conn.reload_commands()]
        return self._send_or_drop(index, conn, sends)

    def _send_or_drop(
        self, index: int, conn: NodeSocket, sends: Sequence[tuple[bytes, Slot]]
    ) -> bool:
        """Send each command with the reply slot it fills; False (and the node dropped) when
        the connection failed."""
        try:
            for command, slot in sends:
                conn.send(command, slot)
        except NodeError as exc:
            self._drop(index, str(exc))
            return False
        if conn.out:
            self._rearm(index, conn)
        return True

    def run(
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
        """One round trip: :meth:`send_round`, then :meth:`wait_round` until ``timeout``
        seconds from now (by the set's clock). See
        :meth:`~django_redlock.wire.transport.Transport.run` for the arguments and results.

        Raises:
            Nothing of its own: a node that fails is recorded as its result.
        """
        self.delivery = timeout
        self.asking = 0.0
        answer = self.send_round(commands, yes_value, need, give_up, identify, queue_behind)
        # The time spent asking Sentinels (only while opening a connection) comes off the wait.
        wait = timeout - self.asking if self.asking else timeout
        answer = self.wait_round(answer, self.clock() + max(0.0, wait))
        if self.unsent or self.unclassified or (self.routes and self._resharding()):
            self.deliver_rest()
        return answer

    def send_round(
        self,
        commands: Commands,
        yes_value: object = None,
        need: int = 0,
        give_up: int | None = None,
        identify: bool = False,
        queue_behind: bool = False,
    ) -> Round:
        """Send ``commands[i]`` (command, EVAL fallback) to node ``i``, without waiting; the
        first half of :meth:`run` (arguments as there). ``None`` skips a node.

        Returns the round whose results fill in as replies are read (by :meth:`wait_round`,
        or by later rounds).
        """
        answer = Round(len(commands), yes_value, need, give_up)
        if self.twins:  # empty unless two nodes reached one server (wire/servers.py)
            commands = keep_apart(answer, commands, self.twins)
        now = self.clock()
        if self.pid != process.PID:
            self._forget_all()
        if self.lent:
            self._take_back()
        if now - self.last_post > _IDLE:
            # After a pause, first take in what arrived meanwhile: a node that restarted has
            # closed our socket, and learning that now (instead of from a failed send) lets
            # this very operation reconnect to it.
            self._poll_once(0)
        if self.watches:
            self._drop_switched()
        self.last_post = now
        if self.routes:
            return self._send_routed(answer, commands, now, identify, queue_behind)
        if self.acked and acked_round(commands):
            # Grants or renewals, and a node with REPLICA_ACKS: each such node's command goes
            # with its WAIT (wire/acks.py), on the general path. Never on a manager without
            # such a node (the usual path below is left as it is).
            timeout_ms = wait_ms(self.delivery)
            for index, command in enumerate(commands):
                if command is None:
                    if answer.results[index] is PENDING:  # else refused (a twin)
                        answer.results[index] = None
                else:
                    self._send_one(answer, index, command, now, identify, queue_behind, timeout_ms)
            return answer
        connections = self.connections
        results = answer.results
        stall = self.stall
        # A node owing fewer than max_outstanding replies, the oldest not past the stall
        # reset, is not judged (StallRule.judged is False then): checked here, so the usual
        # node that still owes the last round's late reply costs no call.
        cap = stall.max_outstanding
        fresh = now - stall.stall_reset
        # The usual node's slot is counted into `pending` at the end, all at once: `others`
        # counts the nodes whose slot is not (no command, or counted on their own path).
        others = 0
        index = -1  # no command: none sent
        for index, command in enumerate(commands):
            if command is None:
                if results[index] is PENDING:  # else refused (a twin)
                    results[index] = None
                others += 1
                continue
            conn = connections[index]
            if conn is None or not conn.ready or conn.out:
                others += 1
                self._send_one(answer, index, command, now, identify, queue_behind)
                continue
            slots = conn.slots
            if slots and (len(slots) >= cap or slots[0][3] < fresh):
                others += 1
                self._send_one(answer, index, command, now, identify, queue_behind)
                continue
            # The usual node: connected, plain, its hello answered, nothing buffered, owing
            # at most a few fresh replies. NodeSocket.send's common case inlined (one call
            # less per node and round): the bytes go straight to the socket.
            slots.append((answer, index, command[1], now))
            data = command[0] + conn.identity if identify else command[0]
            try:
                written = conn.sock.send(data)
            except BlockingIOError:
                written = 0
            except OSError as exc:
                others += 1
                answer.pending += 1  # the slot's, which the drop records as failed
                self._drop(index, describe(exc))
                continue
            if written < len(data):
                conn.out += data[written:]
                self._rearm(index, conn)
        answer.pending += index + 1 - others
        return answer

    def _adopt(self, index: int, conn: NodeSocket) -> None:
        """A connection to node ``index``'s own address found a cluster member: the node is a
        cluster node from now on (in this set, until a connection to its address finds a
        plain server: :meth:`_unroute`). What the connection held is sent to the shards,
        each command in its shard's form, with the reply slots it had (so each round counts
        it as before); the connection is dropped. The shard connections ask their servers'
        mode too before sending it."""
        address = self.addresses[index]
        held = conn.take_held()
        slots = [conn.slots.pop() for _ in held][::-1]
        started = time.monotonic()
        try:
            slot_map = shards_reply_map(address, conn.cluster_shards, self.delivery)
        except NodeError as exc:
            for answer, node, _, _ in slots:
                if answer is not None:
                    answer.record(node, NodeError(str(exc)))
            self._drop(index, str(exc))
            return
        finally:
            self.asking += time.monotonic() - started
        remember(address, slot_map)
        route = self.routes[index] = ClusterRoute(address, slot_map)
        self._drop(index, "a cluster node: its commands go to its shards")
        now = self.clock()
        for (data, identify), (answer, node, fallback, asked) in zip(held, slots, strict=True):
            try:
                endpoint, placed, _ = route.place(data)
                at = self._member(index, endpoint)
                target = self._connection(at, now)
            except NodeError as exc:
                if answer is not None:
                    answer.record(node, NodeError(str(exc)))
                continue
            routed = None if fallback is None else Routed.of(fallback, route, endpoint)
            try:
                target.send(placed, (answer, node, routed, asked), identify)
            except NodeError as exc:
                self._drop(at, str(exc))
                continue
            if target.out:
                self._rearm(at, target)

    def _unroute(self, node: int, conn: NodeSocket | None) -> None:
        """Cluster node ``node`` is plain now: a connection of it found a plain server
        (``conn``, a shard connection, holding what it was given), or its own address
        answered as one when its slot map was read (:class:`NotCluster`). Its endpoint's
        cluster mode was switched off, or a port re-used: a process that asks now takes it
        for a plain node, so this set must too, or one lock would be two (one in each form).

        Its route and shard connections go (their owed replies fail); what ``conn`` held is
        sent, each command in plain form with its reply slot (:func:`plain_form`), on the
        node's own connection, which asks its server's mode first (should that be a cluster
        member after all, say another member lost its way, the node is adopted again)."""
        held = conn.take_held() if conn is not None else []
        slots = [conn.slots.pop() for _ in held][::-1] if conn is not None else []
        for at in [at for at, of in self.shard_of.items() if of == node]:
            self._drop(at, "the node is not a cluster any more: connection dropped")
            del self.shard_of[at]  # its entry stays in connections, unused from now on
        for key in [key for key in self.members if key[0] == node]:
            del self.members[key]
        del self.routes[node]
        if not self.routes:  # no shard connection left: the nodes' own ones only, as at first
            del self.connections[len(self.addresses) :]
            del self.targets[len(self.addresses) :]
        now = self.clock()
        try:
            own = self._connection(node, now)
        except NodeError as exc:
            own = None
            failure = str(exc)
        for (data, identify), (answer, index, fallback, asked) in zip(held, slots, strict=True):
            if answer is None:  # a set-up command or an ASKING: the shard's alone
                continue
            plain = plain_form(data, fallback, identify)
            if own is None or plain is None:
                why = failure if own is None else "the node is not a cluster any more"
                answer.record(index, NodeError(why))
                continue
            try:
                own.send(plain[0], (answer, index, plain[1], asked), plain[2])
            except NodeError as exc:
                self._drop(node, str(exc))  # records the error of every slot sent
                own = None
                failure = str(exc)
        if own is not None and own.out:
            self._rearm(node, own)

    def _routed(self, index: int) -> bool:
        """Whether node ``index`` is a cluster node, its slot map read again first when it is
        stale (:meth:`_refresh`, which finds a node switched out of cluster mode)."""
        route = self.routes.get(index)
        if route is None:
            return False
        if route.stale:
            self._refresh(index)
        return index in self.routes

    def _send_routed(
        self,
        answer: Round,
        commands: Commands,
        now: float,
        identify: bool,
        queue_behind: bool,
    ) -> Round:
        """:meth:`send_round` with a cluster node among the nodes: each cluster node's command
        goes to the shard master that serves its lock's slot (:meth:`_place`), the others'
        as usual. Never taken by a manager of plain nodes."""
        acked_ms = wait_ms(self.delivery) if self.acked and acked_round(commands) else 0
        for index, command in enumerate(commands):
            if command is None:
                if answer.results[index] is PENDING:  # else refused (a twin)
                    answer.results[index] = None
                continue
            if not self._routed(index):
                self._send_one(answer, index, command, now, identify, queue_behind, acked_ms)
                continue
            try:
                placed = self._place(index, command, strict=True)
            except NodeError as exc:
                answer.refuse(index, NotSent(str(exc)))
                continue
            assert placed is not None
            at, routed = placed
            self._send_one(answer, index, routed, now, identify, queue_behind, at=at)
        return answer

    def _place(
        self, index: int, command: Command, strict: bool = False
    ) -> tuple[int, Command] | None:
        """Cluster node ``index``'s ``command`` placed on its shard: the shard connection's
        index and the command in the shard's form, with a fallback that builds that form
        too. None (or, ``strict``, :class:`NodeError`) when it cannot be placed."""
        route = self.routes[index]
        try:
            endpoint, data, _ = route.place(command[0])
        except NodeError:
            if strict:
                raise
            return None
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

    def _refresh(self, index: int) -> None:
        """Read cluster node ``index``'s slot map again (blocking, within the node timeout,
        counted as :attr:`asking`); a failure leaves the old map (and MOVED answers) in use.
        A node whose own address answers as a plain server is plain from now on
        (:meth:`_unroute`)."""
        route = self.routes[index]
        started = time.monotonic()
        try:
            route.refresh(route.read(self.delivery))
        except NotCluster:
            self._unroute(index, None)
        except NodeError:
            pass
        finally:
            self.asking += time.monotonic() - started

    def _redirect(self, at: int, conn: NodeSocket, redirect: Redirect, slot: Slot) -> None:
        """Shard connection ``at`` answered MOVED or ASK for ``slot``'s command: the member
        did not run it. Send it, in the form of the shard named, to that shard (after
        ``ASKING`` for an ASK), unless the round is over and the command is not one to send
        late (an acquire: as for NOSCRIPT, see rounds.on_reply), or it has been redirected
        :data:`~django_redlock.wire.cluster_route.MAX_HOPS` times already."""
        answer, node, fallback, _ = slot
        assert answer is not None
        assert isinstance(fallback, Routed)
        endpoint = (redirect.host or conn.address.host or "", redirect.port)
        route = fallback.route
        route.redirected()
        if not redirect.ask:
            route.moved(redirect.slot, endpoint)  # learnt even when too late to re-send
        if answer.closed and not fallback.when_over:
            return
        if fallback.hops >= MAX_HOPS:
            answer.record(node, NodeError(f"redirected {fallback.hops} times; giving up"))
            return
        try:
            data = route.rewrite(fallback.original.build(), endpoint)
        except NodeError as exc:
            answer.record(node, NodeError(str(exc)))
            return
        target = self._member(node, endpoint)
        now = self.clock()
        try:
            moved = self._connection(target, now)
        except NodeError as exc:
            answer.record(node, NodeError(str(exc)))
            return
        routed = Routed.of(fallback.original, route, endpoint, fallback.hops + 1)
        identify = routed.identify
        try:
            if redirect.ask:
                # ASKING holds for the very next command only: the two go together, the
                # command never held behind the hello (its identity left blank: the node
                # checks itself).
                moved.send(ASKING, (None, ASKING_REPLY, None, now))
                if identify:
                    data += UNIDENTIFIED
                    identify = False
            moved.send(data, (answer, node, routed, now), identify)
        except NodeError as exc:
            self._drop(target, str(exc))
            return
        if moved.out:
            self._rearm(target, moved)

    def _drop_switched(self) -> None:
        """Drop each connection to a Sentinel node opened before a failover of its service
        that this process has heard of since (+switch-master): the old master may still be
        up and a master for a while, and must not be asked to vote any more."""
        for index, watched in self.watches.items():
            conn = self.connections[index]
            if conn is not None and conn.switches != watched.switches:
                self._drop(index, "the Sentinels switched the master: connection dropped")

    def _send_one(
        self,
        answer: Round,
        index: int,
        command: Command,
        now: float,
        identify: bool,
        queue_behind: bool,
        acked_ms: int = 0,
        at: int = -1,
    ) -> None:
        """Send ``command`` for ``answer`` to node ``index`` whatever state its connection is
        in (none yet, connecting, TLS, its hello unanswered, bytes buffered, owing many
        replies): :meth:`send_round` for all but the usual node. ``acked_ms``: a grant or
        renewal, followed on a node with REPLICA_ACKS by a WAIT of that many ms. ``at``: the
        connection to use, when not the node's own (a shard of a cluster node)."""
        if at < 0:
            at = index
        conn = self.connections[at]
        stall = self.stall
        if conn is None or (
            conn.slots
            and not (
                len(conn.slots) < stall.max_outstanding
                and conn.slots[0][3] >= now - stall.stall_reset
            )
            and not (queue_behind and stall.room(len(conn.slots), now - conn.slots[0][3]))
        ):
            try:
                conn = self._connection(at, now)
            except NodeError as exc:
                # Stored without its traceback: frames hold this set, and a cycle through
                # them would leave the sockets to the garbage collector.
                answer.refuse(index, NotSent(str(exc)))
                return
        answer.pending += 1
        body, fallback = command
        slot = (answer, index, fallback, now)
        try:
            if acked_ms and conn.acks is not None:
                conn.send_acked(command, answer, index, now, identify, acked_ms)
            else:
                conn.send(body, slot, identify)
        except NodeError as exc:
            # Records the error for this slot (and any other still owed) on this node.
            self._drop(at, str(exc))
            return
        if conn.out:  # includes a connect or TLS handshake still under way
            self._rearm(at, conn)

    def post(self, commands: Commands) -> None:
        """Send ``commands[i]`` to node ``i`` and read their replies later, unused (``None``
        skips a node): the release of a failed attempt, or leaving a wait line. See
        :meth:`~django_redlock.wire.transport.Transport.post`.

        A clean-up undoes a command sent before it that a stalled node may not have run yet
        (a SIGSTOPped server runs its queued input when it wakes), so it must reach the node
        *after* that command: it goes on the same connection whatever that connection owes,
        up to :data:`~django_redlock.wire.stall.ROOM` times ``max_outstanding`` (a memory
        bound that never bites a release that matters: an acquire is only sent below the cap,
        and its clean-up follows at once), and a stall reset does not move it elsewhere. A
        connection past ``stall_reset`` may be half-open instead of stalled, so there the
        clean-up goes once more on a new connection; clean-ups are idempotent.

        Raises:
            Nothing: a node that cannot be reached is left out (best effort).
        """
        if self.pid != process.PID:
            self._forget_all()
        if self.lent:
            self._take_back()
        now = self.clock()
        # Its replies are read and dropped (closed), except that a NOSCRIPT still gets the
        # EVAL fallback: clean-up commands are built with ``when_over=True``.
        ignored = Round(len(commands), None, 0)
        ignored.closed = True
        stall = self.stall
        for index, given in enumerate(commands):
            if given is None:
                continue
            command = fire_and_forget(given)
            if self.routes and self._routed(index):
                placed = self._place(index, command)
                if placed is not None:
                    at, command = placed
                    with contextlib.suppress(NodeError):  # best effort, as below
                        self._send_to(at, self._connection(at, now), command, ignored, now, index)
                continue
            conn = self.connections[index]
            if conn is not None and conn.slots:
                if len(conn.slots) < stall.room_for:
                    self._send_to(index, conn, command, ignored, now)
                if not conn.slots or not stall.reset(now - conn.slots[0][3]):
                    continue
                self._drop(index, "stalled connection reset")
            try:
                conn = self._connection(index, now)
            except NodeError:
                continue  # best effort: nothing more can be done for this node now
            self._send_to(index, conn, command, ignored, now)
        if self.settling:
            self._send_held()
        if self.unsent or self.unclassified or (self.routes and self._resharding()):
            self.deliver_rest()

    def _send_to(
        self,
        index: int,
        conn: NodeSocket,
        command: Command,
        answer: Round,
        now: float,
        node: int = -1,
    ) -> None:
        try:
            conn.send(command[0], (answer, index if node < 0 else node, command[1], now))
        except NodeError as exc:
            self._drop(index, str(exc))
            return
        if conn.out:
            self._rearm(index, conn)

    def wait_round(self, answer: Round, deadline: float) -> Round:
        """Read replies until the outcome of ``answer`` is known (see
        :meth:`~django_redlock.wire.rounds.Round.known`) or ``deadline`` (the set's clock,
        seconds); the round is closed then and returned. Late replies are read and dropped
        by later rounds.

        A reply that already sits in its socket when the deadline is found passed counts as
        an answer, never as :data:`~django_redlock.wire.errors.TIMED_OUT`: this thread may
        have been away (a garbage collection, a slow thread holding the GIL, SIGSTOP) while
        the nodes answered, and that pause is the client's, not the nodes'. It costs nothing
        to the lease's safety: the caller counts the validity from before the commands were
        sent (the Redlock spec's step 3), so the time the client was away is still taken off
        the lease.
        """
        try:
            drained = False
            while True:
                # Round.known inlined: a quorum said yes, too many said no, or all answered.
                while (
                    answer.yes < answer.need and answer.no <= answer.give_up and answer.pending > 0
                ):
                    remaining = deadline - self.clock()
                    if remaining <= 0:
                        if not drained:
                            # Before judging any node late, take in what arrived meanwhile:
                            # one look without waiting at every socket (each read to its end).
                            drained = True
                            self._poll_once(0)
                            continue
                        answer.time_out()
                        break
                    self._poll_once(remaining)
                # Two addresses of one server may both have said yes before their hellos
                # told them apart (wire/servers.py): then the quorum was short, so wait on.
                if not self.twins or answer.closed or not answer.counted_twice(self.twins):
                    break
        finally:
            answer.closed = True
        if self.settling:
            # Until every new connection's hello is answered (held is None): one whose hello
            # is still out may hold the commands of this round or of a later one.
            if any(conn is not None and conn.held is not None for conn in self.connections):
                # Take in what has arrived (held commands then go out identified), then send
                # what is still held.
                self._poll_once(0)
                self._send_held()
            else:
                self.settling = False
        return answer

    def _send_held(self) -> None:
        """Send, unidentified, what new connections still hold behind an unanswered hello.

        The round is over, so the vote that the identity speeds up no longer matters; held
        to this thread's next operation, which may never come, a command could reach its
        node at any later time or never: a lease's SET that misses the last node of a
        quorum leaves the lease one failure from lost, and a late one takes a key after the
        lease is over. A connection still connecting or in its TLS handshake keeps these
        bytes buffered: :meth:`deliver_rest` writes them.
        """
        for index, conn in enumerate(self.connections):
            if conn is None or not conn.held:
                continue
            try:
                conn.send_held()
            except NodeError as exc:
                self._drop(index, str(exc))
                continue
            if conn.out:
                self._rearm(index, conn)

    def deliver_rest(self) -> None:
        """Hand what the connections still hold unsent to a courier thread, which writes it
        within :attr:`delivery` seconds (the node timeout of the last round) and gives the set
        back; the owner thread's next operation waits for that first (:meth:`_take_back`).

        Why not this thread: it has its answer, and waiting for a connect or a TLS handshake
        here would add it to the caller's wait; leaving the bytes until this thread's next
        operation, which may never come, lets a lease's SET miss a node (one failure from
        lost) or reach it at any later time. Real time bounds the courier, not the injected
        clock: it is about sockets, not about a lease's validity.
        """
        pending = [conn for conn in self.connections if conn is not None and self._owes(conn)]
        if not pending:
            self.unsent = False
            return
        if all(conn.courier_mark == conn.flushed for conn in pending):
            # A courier already had these connections for a whole delivery time and none has
            # written a byte since: a node that stays stuck is not lent for again (a thread
            # per round for nothing); this thread's rounds go on polling it, and the stall
            # rule judges it.
            return
        if self._bell is None:
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)
            self._bell = (read_end, write_end)
            weakref.finalize(self, _close_fds, read_end, write_end)
        self._courier.acquire()
        self.lent = True
        self._wanted = False
        self.poller.register(self._bell[0], _POLLIN)
        deadline = time.monotonic() + self.delivery
        try:
            threading.Thread(
                target=self._deliver, args=(deadline,), name="django_redlock-courier", daemon=True
            ).start()
        except BaseException:  # no thread (interpreter shutting down): keep the set
            self.poller.unregister(self._bell[0])
            self.lent = False
            self._courier.release()
            raise

    def _resharding(self) -> bool:
        """Whether a cluster node is resharding (:meth:`ClusterRoute.resharding`): only then
        may a connection owe a courier what it has all sent (see :meth:`_owes`); otherwise
        ``unsent`` and ``unclassified`` say whether one owes anything."""
        return any(route.resharding() for route in self.routes.values())

    def _owes(self, conn: NodeSocket) -> bool:
        """Whether ``conn`` has bytes to write, holds commands until it learns whether its
        node is a cluster (Handshake.classifying), or is a shard connection of a cluster
        that is resharding (:meth:`ClusterRoute.resharding`) and owes the reply to a
        clean-up (a release): a shard may answer that with MOVED or ASK after the round is
        over, and the clean-up must then still reach the shard named. A courier takes these
        to their nodes.

        Outside a resharding such a reply is left to this thread's next operation, as a
        plain node's is: a release returns at its quorum, so the last node's reply is often
        still owed, and a thread lent for it (about every second pair at three nodes) cost
        more than the round. Its command has reached the shard; a first MOVED or ASK that
        comes in it is followed when it is read (a late release is safe: it deletes only
        its own token), and starts the watch for the rest of the resharding."""
        if conn.out or (conn.classifying and conn.held):
            return True
        node = self.shard_of.get(conn.index)
        return (
            node is not None
            and self.routes[node].resharding()
            and any(fallback is not None and fallback.when_over for _, _, fallback, _ in conn.slots)
        )

    def _deliver(self, deadline: float) -> None:
        """The courier: poll until the connections that had bytes unsent have written them
        and read every reply they owe, or ``deadline`` (time.monotonic). Reading the replies
        too: a socket closed with replies unread (its thread ended, the set was collected)
        sends a reset, not a close, and a reset may drop what the node had not read yet."""
        try:
            watched = [conn for conn in self.connections if conn is not None and self._owes(conn)]
            before = [conn.flushed for conn in watched]
            born: list[NodeSocket] = []
            timed_out = False
            while not self._wanted and any(
                (conn.out or conn.slots) and self.connections[conn.index] is conn
                for conn in (*watched, *born)
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                self._poll_once(remaining)  # the owner's bell ends it at once (_take_back)
                if self.settling:
                    self._send_held()
                if self.routes or self.unclassified:
                    # A connection that found its server in the other mode may have handed
                    # its commands to new connections meanwhile (_adopt, _unroute):
                    # delivered too.
                    born += [
                        conn
                        for conn in self.connections
                        if conn is not None and conn.out and conn not in watched + born
                    ]
            if not any(conn is not None and conn.out for conn in self.connections):
                self.unsent = False
            if timed_out:
                for conn, flushed in zip(watched, before, strict=True):
                    if conn.out and conn.flushed == flushed:
                        # A whole delivery time without a byte written: see deliver_rest
                        # (stuck: not lent for again until it makes progress).
                        conn.courier_mark = flushed
        finally:  # whatever happens, the set goes back to its owner
            bell = self._bell
            assert bell is not None
            with contextlib.suppress(KeyError, ValueError):
                self.poller.unregister(bell[0])
            with contextlib.suppress(OSError):
                while os.read(bell[0], 64):
                    pass
            self.lent = False
            self._courier.release()

    def _take_back(self) -> None:
        """Take the set back from the courier: it stops at once, woken by the bell (what it
        left unsent goes out with this operation, on the same connections, in order)."""
        self._wanted = True
        if self._bell is not None:
            with contextlib.suppress(OSError):  # full: it has been rung already
                os.write(self._bell[1], b"!")
        with self._courier:
            pass

    def _poll_once(self, timeout: float) -> None:
        # poll() takes whole milliseconds; round up so a short timeout is not a busy loop
        # (a timeout of exactly 0 only looks).
        wait = 0 if timeout == 0 else int(timeout * 1000 + 0.999) or 1
        polling = self.polling
        for fd, event in self.poller.poll(wait):
            conn = polling.get(fd)
            if conn is None:  # dropped earlier in this same loop (or its fd just moved)
                continue
            if event == _POLLIN and conn.ready:
                # The usual event: replies on a ready connection. _read and _replies
                # inlined (no call per node and round); anything else goes through them.
                try:
                    data = conn.sock.recv(READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    self._drop(conn.index, describe(exc))
                    continue
                if not data:
                    self._drop(conn.index, "connection closed by the server")
                    continue
                reader = conn.reader
                reader.feed(data)
                if len(data) == READ_SIZE:  # maybe more: read on, the general way
                    self._read(conn.index, conn)
                    continue
                slots = conn.slots
                while slots:
                    try:
                        reply = reader.gets()
                    except PROTOCOL_ERRORS:
                        self._drop(conn.index, BAD_REPLY)
                        break
                    if reply is False:
                        break
                    slot = slots.popleft()
                    answer = slot[0]
                    if answer is None or reply.__class__ is ReplyError:
                        if not self._unusual(conn.index, conn, reply, slot):
                            break
                    elif not answer.closed:
                        answer.results[slot[1]] = reply
                        answer.pending -= 1
                        if reply == answer.yes_value:
                            answer.yes += 1
                        else:
                            answer.no += 1
                continue
            index = conn.index
            if event & _POLLOUT:
                polled = conn.sock
                try:
                    conn.flush()
                except NodeError as exc:
                    self._drop(index, str(exc))
                    continue
                self._rearm(index, conn)
                if conn.sock is not polled:
                    # The connect failed and moved on to the node's next address: the rest
                    # of this event (a hang-up, an error) was the old socket's.
                    continue
            if event & _READABLE:
                self._read(index, conn, event & HUNG_UP)


class ThreadConnections:
    """Hands each thread its own :class:`ConnectionSet`, and closes them all on demand.

    Every set listens on one :class:`Subscriber` shared by all the threads, so threads that
    wait for locks add no connections: per node, one command connection per thread that used
    the manager, plus one pub/sub connection.

    After ``fork()`` the child's sets start afresh before any use (:meth:`get`), so a child
    never reads or writes a socket it shares with its parent, pub/sub ones included.
    """

    def __init__(self, factory: Callable[[], ConnectionSet]) -> None:
        self._factory = factory
        self._local = threading.local()
        self._all: weakref.WeakSet[ConnectionSet] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._subscriber: Subscriber | None = None
        _EVERY_THREAD_CONNECTIONS.add(self)

    def get(self) -> ConnectionSet:
        try:
            sets: ConnectionSet = self._local.sets
        except AttributeError:  # this thread's first use
            return self._first_use()
        if sets.pid != process.PID:
            sets._forget_all()  # forked: our copies of the parent's sockets are closed unused
        return sets

    def _first_use(self) -> ConnectionSet:
        sets = self._factory()
        self._local.sets = sets
        with self._lock:
            if self._subscriber is None:
                self._subscriber = Subscriber(sets.addresses)
            sets.share(self._subscriber)
            self._all.add(sets)
        return sets

    def _after_fork_in_child(self) -> None:
        # Another thread of the parent may have held the lock at the instant of the fork;
        # that thread does not exist here, so the child's copy would stay locked forever.
        self._lock = threading.Lock()

    def open_count(self) -> int:
        """How many node sockets are open now, in every thread (the shared pub/sub ones
        counted once)."""
        with self._lock:
            count = sum(sets.open_count() for sets in list(self._all))
            if self._subscriber is not None:
                count += self._subscriber.open_count()
            return count

    def close(self) -> None:
        with self._lock:
            every = list(self._all)
            subscriber = self._subscriber
        for sets in every:
            sets.close()
        if subscriber is not None:
            subscriber.close()


_EVERY_THREAD_CONNECTIONS: weakref.WeakSet[ThreadConnections] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for connections in list(_EVERY_THREAD_CONNECTIONS):
        connections._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
