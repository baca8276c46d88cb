"""The sync transport's pub/sub sockets, on which the waiting acquires of one manager, in
every thread of the process, hear of releases.

:class:`Subscriber` is a :class:`~django_redlock.wire.transport.WakeSubscriber`.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from django_redlock.wire.cluster_route import channel_on
from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.process import current_pid
from django_redlock.wire.resp import encode_command
from django_redlock.wire.sync.connection import POLL_ERR, POLL_IN, NodeSocket, close_all
from django_redlock.wire.waking import (
    hear_message,
    new_listener_id,
    new_waiter_id,
    note_grant,
    wake_channel,
)

__all__ = ["Subscriber"]


class Subscriber:
    """Pub/sub sockets (one per node) on which the waiting acquires of one manager, in every
    thread of this process, hear of releases.

    Each subscriber is a *listener* with its own channel per lock (the lock key, ``"\\x00w"``,
    the listener id), and its waiters' ids start with the listener id (:meth:`waiter_id`).
    A release publishes only to the first waiter in line (``scripts/wake_next.lua``), and the
    message is that waiter's id, so a hand-off wakes one thread, not every waiter on every
    node. A message only says "your turn may have come": the caller then retries, so a message
    lost or a node that fails costs at most one poll delay.

    Shared by every thread of the manager (one per manager and process, held by
    :class:`~django_redlock.wire.sync.connections.ThreadConnections`), so waiting never adds
    connections: a process holds at most one command connection per thread and node plus
    this one pub/sub connection per node.
    (One per thread doubled them while threads waited in one line.)

    Design: no thread of its own. The waiting threads take turns reading ("whoever waits
    reads"): one at a time polls the sockets, without the lock, for as long as it waits
    itself; it routes each message, under the lock, to the waiter it names (a flag per
    registered waiter, and a notify of that waiter's condition only, so a message wakes one
    thread), and hands the reading over to a waiting thread when it leaves. A background
    reader thread would need a start after fork and a stop on close, and would wake on every
    message even with no waiter left. Commands (SUBSCRIBE, UNSUBSCRIBE, the login) are written
    under the lock by the thread that needs them, and a byte on a pipe makes the reader poll
    again with the new sockets and buffers.

    A channel is listed once every node confirmed it; a waiter that registered (before its
    first try) after that skips subscribing and the extra try that follows a subscription.
    Channels are counted by the acquires listening on them (:meth:`subscribe` with a
    ``waiter``, until :meth:`unregister`): only a channel nobody listens on is unsubscribed
    when more than :attr:`KEEP` are kept. A node that fails is dropped; the next subscribe
    opens it again and subscribes there every channel kept or listened on. After ``fork()``
    the child closes its copies of the parent's sockets unused and becomes a new listener, so
    it never hears the parent's wake-ups.
    """

    # Channels stay subscribed between waits (a thread that waited for a lock once is likely
    # to wait for it again): SUBSCRIBE/UNSUBSCRIBE on every node for every wait would cost
    # more than the wait itself. The oldest nobody listens on are dropped past this many.
    KEEP = 16

    def __init__(self, addresses: Sequence[NodeAddress]) -> None:
        self.addresses = tuple(addresses)
        self.connections: list[NodeSocket | None] = [None] * len(self.addresses)
        self.pipe: list[int] = []  # read end, write end: wakes the reading thread's poll
        self._fresh()
        weakref.finalize(self, _close_subscriber, self.connections, self.pipe)
        _EVERY_SUBSCRIBER.add(self)

    def _fresh(self) -> None:
        """Start with no channel, no waiter and no reader (at creation, and after fork)."""
        self.pid = current_pid()
        self.listener = new_listener_id()
        self.lock = threading.Lock()
        # Subscribed and confirmed on every node open since: the stamp of its listing (see
        # subscribe), oldest used first.
        self.channels: dict[str, int] = {}
        self.stamp = 0  # the next listing's stamp
        self.born: dict[bytes, int] = {}  # registered waiter: the next stamp at registration
        self.users: dict[str, int] = {}  # channel: acquires listening on it now
        self.listens: dict[bytes, str] = {}  # waiter: the channel it is counted on
        self.woken: dict[bytes, bool] = {}  # registered waiter: named since its last wait
        # Registered waiter: node index -> the round each hand-off grant heard names
        # (scripts/hand_grant.lua), until taken by grants().
        self.granted: dict[bytes, dict[int, int]] = {}
        self.sleepers: dict[threading.Condition, Callable[[], bool]] = {}
        self.reading = False
        # Per node: SUBSCRIBE confirmations asked and heard on the current connection, and
        # how many connections were dropped (a confirmation owed by a dropped one never
        # comes).
        self.asked = [0] * len(self.addresses)
        self.heard = [0] * len(self.addresses)
        self.drops = [0] * len(self.addresses)

    def _after_fork_in_child(self) -> None:
        # Our copies of the parent's sockets and pipe: closed unused (no shutdown is sent,
        # the parent's connections stay up). A thread of the parent may have held the lock or
        # been reading at the instant of the fork: it does not exist here.
        _close_subscriber(self.connections, self.pipe)
        self._fresh()

    def _check_fork(self) -> None:
        if self.pid != current_pid():  # pragma: no cover - the fork hook did it already
            self._after_fork_in_child()

    def waiter_id(self) -> str:
        """A new id for one blocking acquire, ``<listener>.<nonce>`` (see wake_next.lua),
        registered: from now on a release naming it is kept until :meth:`wait` or
        :meth:`unregister`. Every id given must be unregistered when its acquire ends."""
        self._check_fork()
        waiter = new_waiter_id(self.listener)
        with self.lock:
            self.woken[waiter.encode()] = False
            self.born[waiter.encode()] = self.stamp
        return waiter

    def unregister(self, waiter: str) -> None:
        """Forget ``waiter`` (its acquire is over) and stop counting it on its channel."""
        key = waiter.encode()
        with self.lock:
            self.woken.pop(key, None)
            self.granted.pop(key, None)
            self.born.pop(key, None)
            channel = self.listens.pop(key, None)
            if channel is not None:
                left = self.users[channel] - 1
                if left:
                    self.users[channel] = left
                else:
                    del self.users[channel]
                    self._trim()

    def subscribe(self, key: str, timeout: float, waiter: str = "") -> bool:
        """Subscribe to this listener's channel for lock ``key`` on every node and wait (up to
        ``timeout`` seconds) for the nodes to confirm, so that a release from then on cannot
        go unheard.

        Returns False, doing nothing, when the channel was already subscribed and confirmed
        on every node (a release since then was heard), True when it had to subscribe (the
        caller then tries once more: a release between its last try and the subscription
        was not heard). ``waiter`` (from :meth:`waiter_id`) is counted as listening on the
        channel until it is unregistered, so no other thread unsubscribes it meanwhile; it
        skips the subscription only if the channel was confirmed before it registered, that
        is before its first try (if another thread listed it later, a release between that
        try and the confirmation went unheard).

        Never raises: a node that cannot be reached is left out (its releases are not
        heard; the caller's poll delay covers it).
        """
        self._check_fork()
        channel = wake_channel(key, self.listener)
        with self.lock:
            if waiter and waiter.encode() not in self.listens:
                # Counted before it is listed: an interruption (a signal's exception) between
                # the two leaves the channel counted once too often (it stays subscribed),
                # never a listed waiter its channel does not count (unregister's KeyError).
                self.users[channel] = self.users.get(channel, 0) + 1
                self.listens[waiter.encode()] = channel
            listed = self.channels.get(channel)
            if (
                listed is not None
                and listed < self.born.get(waiter.encode(), self.stamp)
                and all(self.connections)
            ):
                self.channels[channel] = self.channels.pop(channel)  # most recently used
                return False
            owed = self._send(b"SUBSCRIBE", channel)
            drops = list(self.drops)

            def confirmed() -> bool:
                return all(
                    self.heard[index] >= asked or self.drops[index] != drops[index]
                    for index, asked in owed.items()
                )

            if self._progress(confirmed, time.monotonic() + timeout):
                # Listed only now: a waiter registered after this may skip its extra try.
                self.channels[channel] = self.channels.pop(channel, self.stamp)
                self.stamp += 1
                self._trim()
        return True

    def wait(self, waiter: str, timeout: float, need: int = 0, settle: float = 0.0) -> bool:
        """Wait up to ``timeout`` seconds for a release that names ``waiter`` (an id from
        :meth:`waiter_id`, not yet unregistered); True if one came since its last wait.

        ``need`` > 0: a waiter taking hand-off grants; the wait also ends once ``need``
        nodes granted it the lock, and at most ``settle`` seconds after the first grant (the
        release reached every node at once: the others come within its round trip, or the
        waiter's next try finds them). Take the grants with :meth:`grants`."""
        self._check_fork()
        key = waiter.encode()
        with self.lock:
            if key not in self.woken:  # pragma: no cover - the acquire loop registers first
                self.woken[key] = False

            def done() -> bool:
                return self.woken.get(key, False) or (
                    need > 0 and len(self.granted.get(key, ())) >= need
                )

            deadline = time.monotonic() + timeout
            self._progress(lambda: done() or bool(self.granted.get(key)), deadline)
            if need > 0 and self.granted.get(key) and not done():
                self._progress(done, min(deadline, time.monotonic() + settle))
            woken = self.woken.get(key, False) or bool(self.granted.get(key))
            if key in self.woken:
                self.woken[key] = False
        return woken

    def grants(self, waiter: str) -> dict[int, int]:
        """The hand-off grants heard for ``waiter`` since this was last called: node index ->
        the round the grant names (``scripts/hand_grant.lua``)."""
        with self.lock:
            return self.granted.pop(waiter.encode(), None) or {}

    def _trim(self) -> None:
        """Unsubscribe the oldest channels nobody listens on past :attr:`KEEP` (lock held)."""
        if len(self.channels) <= self.KEEP:
            return
        for channel in [c for c in self.channels if c not in self.users]:
            del self.channels[channel]
            self._send(b"UNSUBSCRIBE", channel)
            if len(self.channels) <= self.KEEP:
                return

    def _send(self, verb: bytes, channel: str) -> dict[int, int]:
        """Write ``verb channel`` to every node, opening what is closed (lock held): per node
        written to, the count of SUBSCRIBE confirmations that includes this one."""
        owed: dict[int, int] = {}
        for index, conn in enumerate(self.connections):
            channels = [channel]
            if conn is None:
                if verb != b"SUBSCRIBE":
                    continue  # a new connection subscribes nothing it was not asked to
                try:
                    conn = NodeSocket(self.addresses[index], time.monotonic)
                except NodeError:
                    continue
                self.connections[index] = conn
                self.asked[index] = self.heard[index] = 0
                # Everything kept or listened on, on the node that just came back.
                channels = list(dict.fromkeys([*self.channels, *self.users, channel]))
                verb_here = b"SUBSCRIBE"
            else:
                verb_here = verb
            address = self.addresses[index]
            conn.out += encode_command(verb_here, *(channel_on(address, c) for c in channels))
            if verb_here == b"SUBSCRIBE":
                self.asked[index] += len(channels)
                owed[index] = self.asked[index]
            try:
                conn.flush()
            except NodeError:
                self._drop(index)
        self._nudge()
        return owed

    def _drop(self, index: int) -> None:
        """Close node ``index``'s socket (lock held); confirmations owed on it are given up."""
        conn = self.connections[index]
        if conn is not None:
            conn.close()
            self.connections[index] = None
            self.drops[index] += 1
            # Listed channels must be confirmed on the next connection to this node before
            # a waiter skips its extra try (those listened on are subscribed there at once).
            self.channels.clear()
            self._notify_done()

    def _nudge(self) -> None:
        """Make the reading thread poll again now, with the sockets and buffers as they are."""
        if self.reading and self.pipe:
            with contextlib.suppress(OSError):  # full: a nudge is pending already
                os.write(self.pipe[1], b"x")

    def _notify_done(self) -> None:
        for condition, done in self.sleepers.items():
            if done():
                condition.notify()

    def _progress(self, done: Callable[[], bool], deadline: float) -> bool:
        """Until ``done()`` or ``deadline`` (monotonic seconds): read the sockets if no other
        thread does, else sleep until told. Called with the lock held; returns ``done()``."""
        condition: threading.Condition | None = None
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if not self.reading:
                self._read(done, deadline)
                continue
            if condition is None:
                condition = threading.Condition(self.lock)
            self.sleepers[condition] = done
            try:
                condition.wait(remaining)
            finally:
                del self.sleepers[condition]
        return True

    def _read(self, done: Callable[[], bool], deadline: float) -> None:
        """Poll and route until ``done()`` or ``deadline``, as the one reading thread (lock
        held, released while polling); then hand the reading to a thread still waiting."""
        self.reading = True
        try:
            if not self.pipe:
                self.pipe.extend(os.pipe())
                for fd in self.pipe:
                    os.set_blocking(fd, False)
            while not done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                # With no socket open this only sleeps (the caller's poll delay applies), woken
                # early by a nudge: a subscribe opened a connection.
                poller = select.poll()
                polled: dict[int, tuple[int, NodeSocket]] = {}
                for index, conn in enumerate(self.connections):
                    if conn is not None:
                        polled[conn.fileno()] = (index, conn)
                        poller.register(conn.fileno(), conn.events())
                poller.register(self.pipe[0], select.POLLIN)
                self.lock.release()
                try:
                    events = poller.poll(max(1, int(remaining * 1000 + 0.999)))
                finally:
                    self.lock.acquire()
                self._route(events, polled)
        finally:
            self.reading = False
            # The next reader: one thread still waiting (those done were told already).
            for condition, other in self.sleepers.items():
                if not other():
                    condition.notify()
                    break

    def _route(
        self, events: list[tuple[int, int]], polled: dict[int, tuple[int, NodeSocket]]
    ) -> None:
        """Read what ``events`` report (lock held): set the flag of each waiter a message
        names and wake that thread; count SUBSCRIBE confirmations; drop failed nodes."""
        for fd, event in events:
            if fd == self.pipe[0]:
                with contextlib.suppress(OSError):
                    os.read(fd, 4096)
                continue
            index, conn = polled[fd]
            if self.connections[index] is not conn:
                continue  # dropped (and maybe reopened) while we polled
            try:
                if event & select.POLLOUT:
                    conn.flush()
                if event & (POLL_IN | POLL_ERR):
                    conn.receive()
                    while (reply := conn.replies()) is not False:
                        if conn.slots:  # the login's own replies come first
                            conn.learn(conn.slots.popleft()[1], reply)
                        elif isinstance(reply, list) and len(reply) == 3:
                            if reply[0] == b"message" and isinstance(reply[2], bytes):
                                self._wake(reply[2], index)
                            elif reply[0] == b"subscribe":
                                self.heard[index] += 1
            except NodeError:
                self._drop(index)
        self._notify_done()

    def _wake(self, message: bytes, index: int) -> None:
        """A release on node ``index`` named a waiter: keep it for its next wait (if it is
        still registered: a message for an acquire that is over is dropped). The message is
        the waiter id (a wake-up), or the waiter id and a round (a hand-off grant)."""
        waiter, round_ = hear_message(message)
        if waiter not in self.woken:
            return
        if round_ is not None:
            note_grant(self.granted, waiter, index, round_)
        else:
            self.woken[waiter] = True

    def open_count(self) -> int:
        """How many pub/sub sockets are open now (at most one per node)."""
        return sum(1 for conn in self.connections if conn is not None)

    def close(self) -> None:
        """Close the sockets (they reopen on the next subscribe). Waiters still registered
        stay so; those listening hear nothing more until they subscribe again (their poll
        delay covers it)."""
        self._check_fork()
        with self.lock:
            for index in range(len(self.connections)):
                self._drop(index)
            self._nudge()  # a thread polling the closed sockets would not notice


def _close_subscriber(connections: list[NodeSocket | None], pipe: list[int]) -> None:
    """Close a subscriber's sockets and pipe (in place: both lists are emptied of them)."""
    close_all(connections)
    for fd in pipe:
        with contextlib.suppress(OSError):
            os.close(fd)
    pipe.clear()


_EVERY_SUBSCRIBER: weakref.WeakSet[Subscriber] = weakref.WeakSet()


def _after_fork_in_child_subscribers() -> None:
    for subscriber in list(_EVERY_SUBSCRIBER):
        subscriber._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child_subscribers)
