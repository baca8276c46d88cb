"""The asyncio wake-up subscriber: pub/sub streams of one event loop, one per node
(:class:`LoopSubscriber`), the twin of :mod:`django_redlock.wire.sync.subscriber`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence

from django_redlock.wire.asyncio.connection import open_stream
from django_redlock.wire.cluster_route import (
    channel_on,
)
from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.resp import (
    PROTOCOL_ERRORS,
    ReplyError,
    encode_command,
    make_reader,
)
from django_redlock.wire.setup import (
    login_commands,
)
from django_redlock.wire.waking import (
    hear_message,
    new_listener_id,
    new_waiter_id,
    note_grant,
    wake_channel,
)

__all__ = ["LoopSubscriber"]


class LoopSubscriber:
    """Pub/sub streams (one per node) of one event loop, shared by all its waiting tasks.

    The asyncio twin of :class:`~django_redlock.wire.sync.subscriber.Subscriber`: one listener id
    per loop, one channel per lock key and waiter ids as :mod:`~django_redlock.wire.waking`
    names them, and a release publishes only to the head of the line
    (``scripts/wake_next.lua``). A reader task per node sets the event of the waiter that a
    message names; each waiter is registered (its event made) when its id is given, before
    its first try, so a release that comes before the task awaits is kept, not lost.
    """

    KEEP = 16  # channels kept subscribed between waits, as in the sync Subscriber

    def __init__(self, addresses: Sequence[NodeAddress]) -> None:
        self.addresses = tuple(addresses)
        self.listener = new_listener_id()
        self.writers: list[asyncio.StreamWriter | None] = [None] * len(self.addresses)
        self.tasks: list[asyncio.Task[None] | None] = [None] * len(self.addresses)
        # Per node, the futures of SUBSCRIBE confirmations still owed, in order.
        self.confirming: list[deque[asyncio.Future[bool]]] = [deque() for _ in self.addresses]
        self.channels: dict[str, None] = {}  # subscribed (or being subscribed), oldest first
        self.lock: asyncio.Lock | None = None  # one task at a time opens and subscribes
        self.waiting: dict[bytes, asyncio.Event] = {}
        # Registered waiter: node index -> the round each hand-off grant heard names
        # (scripts/hand_grant.lua), until taken by grants(); and the waiters woken by a
        # plain wake-up since their last wait.
        self.granted: dict[bytes, dict[int, int]] = {}
        self.woken: set[bytes] = set()
        # Which channel each waiting task listens on, and how many listen on each: a channel
        # somebody listens on is never unsubscribed to make room (its wake-ups would be lost,
        # and that task left to its poll), so past KEEP only unheard channels go.
        self.listening: dict[bytes, str] = {}
        self.listeners: dict[str, int] = {}

    def waiter_id(self) -> str:
        """A new id for one blocking acquire, ``<listener>.<nonce>``, registered: from now on
        a release naming it is kept until :meth:`wait` or :meth:`unregister`. Every id given
        must be unregistered when its acquire ends."""
        waiter = new_waiter_id(self.listener)
        self.waiting[waiter.encode()] = asyncio.Event()
        return waiter

    def unregister(self, waiter: str) -> None:
        """Stop keeping ``waiter``'s wake-ups; its channel may be unsubscribed from now on."""
        ident = waiter.encode()
        self.waiting.pop(ident, None)
        self.granted.pop(ident, None)
        self.woken.discard(ident)
        channel = self.listening.pop(ident, None)
        if channel is not None:
            left = self.listeners.get(channel, 1) - 1
            if left > 0:
                self.listeners[channel] = left
            else:
                self.listeners.pop(channel, None)

    async def _open(self, index: int, timeout: float) -> None:
        try:
            reader, writer = await open_stream(self.addresses[index], timeout)
        except (TimeoutError, OSError, ValueError, NodeError):
            return  # this node stays silent: the poll fallback covers it
        try:
            logins = login_commands(self.addresses[index])
        except NodeError:
            writer.close()
            return
        for command in logins:
            writer.write(command)
        self.writers[index] = writer
        self.tasks[index] = asyncio.get_running_loop().create_task(
            self._read(index, reader, len(logins))
        )

    async def _read(self, index: int, stream: asyncio.StreamReader, logins: int) -> None:
        parser = make_reader()
        try:
            while True:
                data = await stream.read(65536)
                if not data:
                    break
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    if logins:
                        logins -= 1
                        if isinstance(reply, ReplyError):
                            return  # a refused AUTH: this node stays silent
                        continue
                    if not isinstance(reply, list) or len(reply) != 3:
                        continue
                    if reply[0] == b"message" and isinstance(reply[2], bytes):
                        # The waiter id (a wake-up), or the id and a round (a grant).
                        ident, round_ = hear_message(reply[2])
                        event = self.waiting.get(ident)
                        if event is not None:
                            if round_ is not None:
                                note_grant(self.granted, ident, index, round_)
                            else:
                                self.woken.add(ident)
                            event.set()
                    elif reply[0] == b"subscribe" and self.confirming[index]:
                        future = self.confirming[index].popleft()
                        if not future.done():
                            future.set_result(True)
        except (OSError, asyncio.CancelledError):
            pass
        except PROTOCOL_ERRORS:
            pass  # not RESP: this node is lost (the poll fallback covers it)
        finally:
            self._lost(index)

    def _lost(self, index: int) -> None:
        writer = self.writers[index]
        self.writers[index] = None
        self.tasks[index] = None
        if writer is not None:
            writer.close()
        while self.confirming[index]:
            future = self.confirming[index].popleft()
            if not future.done():
                future.set_result(False)
        # The next wait must subscribe again on a new connection.
        self.channels.clear()

    async def subscribe(self, key: str, timeout: float, waiter: str = "") -> bool:
        """Subscribe to this loop's channel for ``key`` on every node, waiting up to
        ``timeout`` seconds for the confirmations, and count ``waiter`` (registered) as
        listening on it until :meth:`unregister`. Returns False, doing nothing more, when it
        was already subscribed on every node (a release since then was heard), True otherwise.

        One task at a time opens connections and subscribes: two tasks opening the same node
        at once would leave one connection orphaned, and closed when collected, with the
        subscription on it.
        """
        channel = wake_channel(key, self.listener)
        ident = waiter.encode()
        if waiter and ident in self.waiting and ident not in self.listening:
            # Counted before any await: a subscribe of another task that makes room while
            # this one waits for the lock below must not take this channel.
            self.listening[ident] = channel
            self.listeners[channel] = self.listeners.get(channel, 0) + 1
        if channel in self.channels and all(self.writers):
            self.channels[channel] = self.channels.pop(channel)  # most recently used
            return False
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            if channel in self.channels and all(self.writers):
                return True  # another task subscribed it while we waited: try once more
            missing = [index for index, writer in enumerate(self.writers) if writer is None]
            if missing:
                await asyncio.gather(*(self._open(index, timeout) for index in missing))
            if len(self.channels) >= self.KEEP:
                # The oldest channel nobody listens on; none when every kept one is heard.
                unheard = (c for c in self.channels if c != channel and c not in self.listeners)
                oldest = next(unheard, None)
                if oldest is not None:
                    del self.channels[oldest]
                    for index, writer in enumerate(self.writers):
                        if writer is not None:
                            here = channel_on(self.addresses[index], oldest)
                            writer.write(encode_command(b"UNSUBSCRIBE", here))
            loop = asyncio.get_running_loop()
            confirmations = []
            for index, writer in enumerate(self.writers):
                if writer is not None:
                    future: asyncio.Future[bool] = loop.create_future()
                    self.confirming[index].append(future)
                    confirmations.append(future)
                    here = channel_on(self.addresses[index], channel)
                    writer.write(encode_command(b"SUBSCRIBE", here))
            if confirmations:
                await asyncio.wait(confirmations, timeout=timeout)
            # Listed only now: a task that finds it listed may skip its extra try.
            self.channels[channel] = None
        return True

    async def wait(self, waiter: str, timeout: float, need: int = 0, settle: float = 0.0) -> bool:
        """Wait up to ``timeout`` seconds for a release that names ``waiter`` (an id from
        :meth:`waiter_id`, not yet unregistered); True if one came since its last wait.
        ``need`` and ``settle``: for a waiter taking hand-off grants, as the sync
        :meth:`Subscriber.wait <django_redlock.wire.sync.subscriber.Subscriber.wait>` (take
        them with :meth:`grants`)."""
        ident = waiter.encode()
        event = self.waiting.get(ident)
        if event is None:
            await asyncio.sleep(timeout)
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if not event.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), max(0.0, deadline - loop.time()))
            if not event.is_set():
                break
            event.clear()
            grants = len(self.granted.get(ident, ()))
            if ident in self.woken or not need or not grants or grants >= need:
                break
            # A first grant: the other nodes' come within the release's round trip.
            deadline = min(deadline, loop.time() + settle)
        woken = ident in self.woken or bool(self.granted.get(ident))
        self.woken.discard(ident)
        return woken

    def grants(self, waiter: str) -> dict[int, int]:
        """The hand-off grants heard for ``waiter`` since this was last called (node index ->
        the round each names)."""
        return self.granted.pop(waiter.encode(), None) or {}

    def open_count(self) -> int:
        """How many pub/sub streams are open now (at most one per node)."""
        return sum(1 for writer in self.writers if writer is not None)

    def close(self) -> None:
        """Close the streams (they reopen on the next subscribe)."""
        for task in self.tasks:
            if task is not None:
                task.cancel()
        for writer in self.writers:
            if writer is not None:
                writer.close()
        self.writers = [None] * len(self.addresses)
        self.tasks = [None] * len(self.addresses)
        self.channels.clear()
