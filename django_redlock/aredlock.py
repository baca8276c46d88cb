"""The asyncio twin of :class:`~django_redlock.redlock.LockManager`: no thread hop per call.

Same algorithm, same Lua scripts, same validity arithmetic and errors; the transport is an
asyncio protocol instead of non-blocking sockets: per event loop, one connection per node,
shared by every task of that loop. A command is written to every node at once (one round
trip whatever N); each connection has a FIFO of reply handlers, called in order as replies are
parsed in ``data_received``, so replies can never be handed to the wrong command, and commands
of many tasks pipeline on one socket. The outcome is known at a quorum of yes votes, or once a
quorum is no longer possible; a node that owes too many replies is skipped without sending.
Waiting tasks are woken by the release through per-loop pub/sub streams (``_AsyncSubscriber``).

Why not ``redis.asyncio``: five ``evalsha`` calls under ``asyncio.gather`` cost 1.2 ms a pair
or more on this project's benchmark machine, three times this transport or more, and its
clients retry by default. Node URLs and redis-py clients are accepted all the same.

Renewal of ``auto_extend`` leases runs on the process's extender thread (one per process),
and the operator calls (``holder``, ``locks``, ``force_release``, ``declare_fresh``) are the
sync manager's: they are not on any hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, NoReturn

from django_redlock._nodes import NodeAddress
from django_redlock._resp import ReplyError, encode_command, make_reader
from django_redlock._transport import (
    HELLO_PERSISTENCE,
    HELLO_RUN_ID,
    PENDING,
    TIMED_OUT,
    UNIDENTIFIED,
    Command,
    Hello,
    NodeError,
    hello_quarantine,
    identity_of,
    new_waiter_id,
    quarantine_of,
    run_id_of,
    wake_channel,
)
from django_redlock.exceptions import (
    LeaseReleased,
    LockLost,
)
from django_redlock.redlock import (
    _ACQUIRE,
    _EXTEND,
    _FORCE_RELEASE,
    _GRANTED,
    _HOLDER,
    _LEAVE,
    _OWNS,
    _PING,
    _RELEASE,
    MANAGER_DEFAULT,
    BaseLease,
    LockManager,
    _acquire_command,
    _extend_command,
    _leave_command,
    _ManagerDefault,
    _owner_scope,
    _owns_command,
    _release_command,
    clip_origin,
    validate_name,
)

__all__ = ["AsyncLease", "AsyncLockManager"]

logger = logging.getLogger("django_redlock")  # the sync manager's logger: one log, both paths

_MAX_OUTSTANDING = 32


async def _connect(
    address: NodeAddress, protocol: asyncio.Protocol, timeout: float
) -> asyncio.BaseTransport:
    """Connect ``protocol`` to ``address`` (unix socket, TCP or TLS) within ``timeout`` s.

    Raises:
        TimeoutError, OSError, ValueError: the node cannot be reached or the TLS set-up failed.
    """
    loop = asyncio.get_running_loop()
    if address.path is not None:
        opening = loop.create_unix_connection(lambda: protocol, address.path)
    else:
        ssl = address.ssl_context() if address.tls else None
        assert address.host is not None
        assert address.port is not None
        opening = loop.create_connection(
            lambda: protocol,
            address.host,
            address.port,
            ssl=ssl,
            server_hostname=address.host if ssl else None,
        )
    transport, _ = await asyncio.wait_for(opening, timeout)
    return transport


async def _open_stream(
    address: NodeAddress, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream pair to ``address`` (see :func:`_connect`), as ``asyncio.open_connection``
    builds it."""
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport = await _connect(address, protocol, timeout)
    writer = asyncio.StreamWriter(
        transport,  # type: ignore[arg-type]
        protocol,
        reader,
        asyncio.get_running_loop(),
    )
    return reader, writer


def _auth_commands(address: NodeAddress) -> list[bytes]:
    """The AUTH command a connection to ``address`` starts with (none without a password)."""
    if address.password is None:
        return []
    parts: tuple[str, ...] = (address.password,)
    if address.username:
        parts = (address.username, address.password)
    return [encode_command(b"AUTH", *parts)]


def _settle(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` (a round trip's outcome) unless it is already decided."""
    if not future.done():
        future.set_result(None)


_Callback = Callable[[Any], None]


def _ignore(reply: Any) -> None:
    """The reply handler of fire-and-forget commands."""


def _drop_reply(index: int, reply: Any) -> None:
    """The per-node recorder of fire-and-forget commands."""


class _AsyncConnection(asyncio.Protocol):
    """One connection to one node: an asyncio protocol with the reply handlers it still owes,
    in order. Replies are parsed in ``data_received`` and handed to their handler right there:
    no reader task, no future per reply, so a round trip costs one wake-up of the waiting task.
    """

    def __init__(self, address: NodeAddress, hello: Hello) -> None:
        self.address = address
        self.hello = hello
        # The run_id and persistence arguments for `identify=True` commands (see Hello), and
        # the commands held until they are known (None: not holding), as the sync transport.
        self.identity = UNIDENTIFIED
        self.run_id = ""
        self.held: list[bytes] | None = []
        self.transport: asyncio.Transport | None = None
        self.pending: deque[_Callback] = deque()
        self.parser = make_reader()
        self.broken: str | None = None
        # The task that connects and logs in (set by _LoopConnections.connection), and
        # whether it got as far as queueing the login: commands may follow it from then on.
        self.opening: asyncio.Task[None] | None = None
        self.ready = False

    async def open(self, timeout: float) -> None:
        """Connect within ``timeout`` seconds, then queue the login and the script loads.
        Never raises for a node that cannot be reached: the connection is marked broken
        instead (and so is it when this task is cancelled, so no one waits on it)."""
        address = self.address
        try:
            await _connect(address, self, timeout)
        except (TimeoutError, OSError, ValueError) as exc:
            self._fail(str(exc) or "connect timed out")
            return
        except BaseException:
            self._fail("connect cancelled")
            raise
        if self.broken is not None:  # closed (aclose) while it was connecting
            self._fail(self.broken)
            return
        login = _auth_commands(address)
        if address.db:
            login.append(encode_command(b"SELECT", address.db))
        for command in login:  # AUTH/SELECT: a refusal makes the connection useless
            self._send_raw(command, self._check_login)
        for script in (_ACQUIRE, _RELEASE, _EXTEND, _HOLDER, _LEAVE, _FORCE_RELEASE, _OWNS):
            # May fail harmlessly (an ACL without SCRIPT): EVALSHA then falls back to EVAL.
            self._send_raw(encode_command(b"SCRIPT", b"LOAD", script.source), _ignore)
        self._send_raw(HELLO_RUN_ID, self._learn_run_id)
        self._send_raw(HELLO_PERSISTENCE, self._learn_persistence)
        self._send_raw(hello_quarantine(self.hello.marker), self._learn_quarantine)
        self.ready = True

    def _learn_run_id(self, reply: Any) -> None:
        self.run_id = run_id_of(reply)

    def _learn_persistence(self, reply: Any) -> None:
        # The identity is complete (INFO came first): the commands held meanwhile go out now.
        self.identity = identity_of(self.run_id, reply)
        held, self.held = self.held or [], None
        if held and self.transport is not None and self.broken is None:
            self.transport.write(b"".join(command + self.identity for command in held))

    def _learn_quarantine(self, reply: Any) -> None:
        if not isinstance(reply, NodeError):
            self.hello.on_quarantine(self.address.label, quarantine_of(reply))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        pending = self.pending
        while (reply := self.parser.gets()) is not False:
            if pending:
                pending.popleft()(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(str(exc) if exc else "connection closed by the server")

    def _check_login(self, reply: Any) -> None:
        if isinstance(reply, ReplyError):
            self._fail(f"login refused: {reply}")

    def _send_raw(self, command: bytes, on_reply: _Callback, identify: bool = False) -> None:
        """Write ``command``; ``on_reply`` gets its reply, or a :class:`NodeError`. With
        ``identify``, the connection's identity completes it (held until it is known; a
        command that names nothing first sends what is held, unidentified, to keep order)."""
        if self.broken is not None or self.transport is None:
            on_reply(NodeError(self.broken or "not connected"))
            return
        self.pending.append(on_reply)
        if self.held is not None:
            if identify:
                self.held.append(command)
                return
            if self.held:
                self.transport.write(b"".join(held + UNIDENTIFIED for held in self.held))
                self.held.clear()
        elif identify:
            command += self.identity
        self.transport.write(command)

    def _fail(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
        while self.pending:
            self.pending.popleft()(NodeError(reason))
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        self._fail("connection closed by the client")


class _AsyncSubscriber:
    """Pub/sub streams (one per node) of one event loop, shared by all its waiting tasks.

    The asyncio twin of :class:`~django_redlock._transport.Subscriber`: one listener id per
    loop, one channel per lock key (key, ``"\\x00w"``, listener), waiter ids
    ``<listener>.<nonce>``, and a release publishes only to the head of the line
    (``scripts/wake_next.lua``). A reader task per node sets the event of the waiter that a
    message names; each waiter registers its event before its first try, so a release that
    comes before the task awaits is kept, not lost.
    """

    KEEP = 16  # channels kept subscribed between waits, as in the sync Subscriber

    def __init__(self, addresses: Sequence[NodeAddress]) -> None:
        self.addresses = tuple(addresses)
        self.listener = secrets.token_hex(6)
        self.writers: list[asyncio.StreamWriter | None] = [None] * len(self.addresses)
        self.tasks: list[asyncio.Task[None] | None] = [None] * len(self.addresses)
        # Per node, the futures of SUBSCRIBE confirmations still owed, in order.
        self.confirming: list[deque[asyncio.Future[bool]]] = [deque() for _ in self.addresses]
        self.channels: dict[str, None] = {}  # subscribed (or being subscribed), oldest first
        self.lock: asyncio.Lock | None = None  # one task at a time opens and subscribes
        self.waiting: dict[bytes, asyncio.Event] = {}

    def waiter_id(self) -> str:
        return new_waiter_id(self.listener)

    def register(self, waiter: str) -> None:
        """Start keeping the wake-ups of ``waiter`` (before its first try)."""
        self.waiting[waiter.encode()] = asyncio.Event()

    def unregister(self, waiter: str) -> None:
        self.waiting.pop(waiter.encode(), None)

    async def _open(self, index: int, timeout: float) -> None:
        try:
            reader, writer = await _open_stream(self.addresses[index], timeout)
        except (TimeoutError, OSError, ValueError):
            return  # this node stays silent: the poll fallback covers it
        logins = _auth_commands(self.addresses[index])
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
                    if reply[0] == b"message":
                        event = self.waiting.get(reply[2])
                        if event is not None:
                            event.set()
                    elif reply[0] == b"subscribe" and self.confirming[index]:
                        future = self.confirming[index].popleft()
                        if not future.done():
                            future.set_result(True)
        except (OSError, asyncio.CancelledError):
            pass
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

    async def subscribe(self, key: str, timeout: float) -> bool:
        """Subscribe to this loop's channel for ``key`` on every node, waiting up to
        ``timeout`` seconds for the confirmations. Returns False, doing nothing, when it was
        already subscribed on every node (a release since then was heard), True otherwise.

        One task at a time opens connections and subscribes: two tasks opening the same node
        at once would leave one connection orphaned, and closed when collected, with the
        subscription on it.
        """
        channel = wake_channel(key, self.listener)
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
                oldest = next(iter(self.channels))
                del self.channels[oldest]
                for writer in self.writers:
                    if writer is not None:
                        writer.write(encode_command(b"UNSUBSCRIBE", oldest))
            loop = asyncio.get_running_loop()
            confirmations = []
            for index, writer in enumerate(self.writers):
                if writer is not None:
                    future: asyncio.Future[bool] = loop.create_future()
                    self.confirming[index].append(future)
                    confirmations.append(future)
                    writer.write(encode_command(b"SUBSCRIBE", channel))
            if confirmations:
                await asyncio.wait(confirmations, timeout=timeout)
            # Listed only now: a task that finds it listed may skip its extra try.
            self.channels[channel] = None
        return True

    async def wait(self, waiter: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a release that names ``waiter`` (registered
        with :meth:`register`); True if one came since the last wait."""
        event = self.waiting.get(waiter.encode())
        if event is None:
            await asyncio.sleep(timeout)
            return False
        if not event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        woken = event.is_set()
        event.clear()
        return woken

    def close(self) -> None:
        for task in self.tasks:
            if task is not None:
                task.cancel()
        for writer in self.writers:
            if writer is not None:
                writer.close()
        self.writers = [None] * len(self.addresses)
        self.tasks = [None] * len(self.addresses)
        self.channels.clear()


def _usable(conn: _AsyncConnection | None) -> bool:
    """True if ``conn`` is logged in and not broken: a command may be written to it now."""
    return conn is not None and conn.ready and conn.broken is None


class _LoopConnections:
    """The connections of one event loop, one per node."""

    def __init__(self, addresses: Sequence[NodeAddress], hello: Hello) -> None:
        self.addresses = tuple(addresses)
        self.hello = hello
        self.connections: list[_AsyncConnection | None] = [None] * len(self.addresses)
        self.subscriber = _AsyncSubscriber(self.addresses)
        self.guard: asyncio.Task[None] | None = None

    async def close_at_loop_end(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self.close()

    async def connection(self, index: int, timeout: float) -> _AsyncConnection:
        """Node ``index``'s connection once its opening is over (logged in, or broken),
        opening a new one if there is none or it broke.

        The opening runs in its own task, shielded: a caller cancelled meanwhile (or a
        ``wait_for`` around it) must not cut a connection that other tasks of the loop share
        and wait on in the middle of its login.
        """
        conn = self.connections[index]
        if conn is None or conn.broken is not None:
            if conn is not None:
                conn.close()
            conn = _AsyncConnection(self.addresses[index], self.hello)
            self.connections[index] = conn
            conn.opening = asyncio.get_running_loop().create_task(conn.open(timeout))
        assert conn.opening is not None
        if not conn.opening.done():
            await asyncio.shield(conn.opening)
        return conn

    async def run(
        self,
        commands: Sequence[Command | None],
        timeout: float,
        yes_value: object,
        need: int,
        give_up: int | None = None,
        identify: bool = False,
        capped: bool = True,
    ) -> tuple[list[Any], int, int]:
        """One round trip: send ``commands[i]`` to node ``i``; results, yes and no counts.
        With ``identify``, each command is completed with its connection's identity (see
        ``_transport.Hello``). A node owing many replies is skipped (a stalled node costs no
        more writes) unless ``capped`` is False: a held lease's release is queued behind
        what the node owes instead, or its keys would stay until they expire.

        Commands are written synchronously to every connected node (no task per node: on a
        small machine a task costs more than the round trip); replies are tallied by future
        callbacks, and the caller resumes once the outcome is known or ``timeout`` passes.
        Per node, as the sync transport reports it: the reply, ``None`` (no command), a
        :class:`NodeError`, :data:`TIMED_OUT` (no reply by the deadline) or :data:`PENDING`
        (not waited for: the outcome was known), so both managers log the same node errors.
        """
        size = len(commands)
        results: list[Any] = [PENDING] * size
        give_up = size - need if give_up is None else give_up
        counts = [0, 0]
        loop = asyncio.get_running_loop()
        decided: asyncio.Future[None] = loop.create_future()
        over = [False]  # set once this round is decided, timed out or cancelled

        def record(index: int, reply: Any) -> None:
            results[index] = reply
            counts[0 if reply == yes_value else 1] += 1
            if (counts[0] >= need or counts[1] > give_up) and not decided.done():
                decided.set_result(None)

        missing = [
            index
            for index, command in enumerate(commands)
            if command is not None and not _usable(self.connections[index])
        ]
        if missing:  # connect the nodes that need it (or wait for their login), all at once
            await asyncio.gather(*(self.connection(index, timeout) for index in missing))
        pending = 0
        for index, command in enumerate(commands):
            if command is None:
                results[index] = None
                continue
            conn = self.connections[index]
            assert conn is not None
            if conn.broken is not None:
                record(index, NodeError(conn.broken))
                continue
            if capped and len(conn.pending) >= _MAX_OUTSTANDING:
                record(index, NodeError(f"stalled: {len(conn.pending)} replies outstanding"))
                continue
            pending += 1
            self._expect(conn, index, command, record, over, identify)
        if pending and not decided.done():
            # A timer on the loop instead of asyncio.wait_for: no extra task and no shield
            # per round trip (wait_for costs more than a loopback round trip here).
            timer = loop.call_later(timeout, _settle, decided)
            try:
                await decided
            finally:
                timer.cancel()
                over[0] = True
        over[0] = True
        outcome = list(results)
        if counts[0] < need and counts[1] <= give_up:  # undecided: the deadline passed
            outcome = [TIMED_OUT if reply is PENDING else reply for reply in outcome]
        return outcome, counts[0], counts[1]

    def post(self, commands: Sequence[Command | None]) -> None:
        """Write ``commands[i]`` to node ``i`` now, without awaiting (safe in a task being
        cancelled); the replies are read and dropped. Nodes not connected are skipped."""
        for index, (conn, command) in enumerate(zip(self.connections, commands, strict=True)):
            if command is not None and conn is not None and conn.ready and conn.broken is None:
                # Through _expect, so a NOSCRIPT reply still gets the EVAL fallback.
                self._expect(conn, index, command, _drop_reply)

    def _expect(
        self,
        conn: _AsyncConnection,
        index: int,
        command: Command,
        record: Any,
        over: list[bool] | None = None,
        identify: bool = False,
    ) -> None:
        """Send ``command`` on ``conn`` and record its reply as node ``index``'s answer
        (re-sent as EVAL once if the node had no copy of the script). Once ``over[0]`` is
        set, a fallback whose ``when_over`` is False is not sent: an acquire's SET re-sent
        after its attempt was given up (or cancelled) would land after the clean-up release
        and leave a key nobody releases."""

        def done(reply: Any) -> None:
            fallback = command[1]
            if (
                isinstance(reply, ReplyError)
                and str(reply).startswith("NOSCRIPT")
                and fallback is not None
            ):
                if over is not None and over[0] and not fallback.when_over:
                    return
                self._expect(conn, index, (fallback.build(), None), record, over)
                return
            record(index, NodeError(str(reply)) if isinstance(reply, ReplyError) else reply)

        conn._send_raw(command[0], done, identify)

    def close(self) -> None:
        for conn in self.connections:
            if conn is not None:
                conn.close()
        self.connections = [None] * len(self.addresses)
        self.subscriber.close()


async def _take(guard: threading.Lock) -> None:
    """Take ``guard`` (an auto-extended lease's, shared with the extender thread) without
    blocking the event loop, and so that a cancelled task never ends up owning it.

    It is polled, never waited for in a worker thread: such a thread goes on waiting after
    its task is cancelled, takes the guard, and no one gives it back; the extender thread,
    which renews every auto-extended lease of the process, then blocks on it for good and
    all those leases expire. The extender holds the guard for one renewal round trip at most
    (bounded by the node timeout), so the polls are few and short.
    """
    delay = 0.0005
    while not guard.acquire(blocking=False):
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.02)


def _retrieve(task: asyncio.Future[None]) -> None:
    """Done-callback of a release that outlived its cancelled caller: read its outcome so
    asyncio does not report it as never retrieved (a LockLost is already logged and told
    to the observer by the release itself)."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("release finished after its caller was cancelled: %s", task.exception())


class AsyncLease(BaseLease):
    """A held lock from :class:`AsyncLockManager`: ``await lease.extend()``,
    ``await lease.release()``, or ``async with``; ``name``, ``validity``, ``lost``,
    ``fencing_token`` and ``check()`` as for :class:`~django_redlock.Lease` (see
    :class:`~django_redlock.redlock.BaseLease`).

    Its own type, not a :class:`~django_redlock.Lease`: its ``extend``/``release`` are
    coroutines, so it is never where code expects a lease that a plain ``with`` releases.
    A plain ``with`` raises ``TypeError``.

    Cancellation: a task cancelled in ``release()`` still releases (the release is shielded
    and finishes in the background); one cancelled in ``extend()`` leaves the lease as it
    was, held until its current validity runs out (or renewed by auto-extension).
    """

    _async_manager: AsyncLockManager
    _closing: asyncio.Task[None] | None = None

    async def owned(self) -> bool:
        """Ask the nodes (one round trip) whether a quorum still holds this lease (see
        :meth:`Lease.owned <django_redlock.Lease.owned>`).

        Raises:
            LeaseInherited: called in a process forked from the lease's owner.
        """
        self._refuse_inherited()
        if self._released or self.validity <= 0:
            return False
        return await self._async_manager._owned(self)

    async def extend(self) -> float:
        """Renew the lease to its full ttl on a quorum; the new validity in seconds (see
        :meth:`Lease.extend <django_redlock.Lease.extend>`).

        Raises:
            LeaseReleased: the lease was released.
            LockLost: the lease was not renewed in time on a quorum; it is now lost.
        """
        guard = self._guard
        if guard is None:
            self.check()
            return await self._async_manager._extend(self)
        await _take(guard)  # one renewal at a time, the extender's or ours
        try:
            self.check()
            return await self._async_manager._extend(self)
        finally:
            guard.release()

    async def release(self) -> None:
        """Delete the lock on every node where it still holds this lease's token (see
        :meth:`Lease.release <django_redlock.Lease.release>`). Shielded from cancellation:
        once called, the release is carried out even if the calling task is cancelled.

        Raises:
            LeaseInherited: called in a process forked from the lease's owner.
            LeaseReleased: called twice.
            LockLost: the lease had expired, or a quorum no longer held it.
        """
        self._refuse_inherited()
        if self._released:
            raise LeaseReleased(self.name)
        if self._depth > 1:
            self._depth -= 1  # an inner re-entry ends; the keys stay until the last exit
            return
        # Released from now on, whatever happens to this task: the extender starts no more
        # renewals of it, and a second release raises.
        self._released = True
        self._manager._forget_owner(self)
        finishing = asyncio.ensure_future(self._finish_release())
        try:
            await asyncio.shield(finishing)
        except asyncio.CancelledError:
            finishing.add_done_callback(_retrieve)
            raise

    async def _finish_release(self) -> None:
        guard = self._guard
        if guard is not None:
            # Wait out a renewal in flight, so it does not find the keys gone and call the
            # lease lost; none starts after it (the lease is marked released).
            await _take(guard)
            guard.release()
        await self._async_manager._release(self)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._left_inherited() or self._released:
            return
        lost = self._lost_reason
        if exc is None:
            await self.release()  # raises LockLost itself when the nodes say it was lost
            if lost is not None:
                raise LockLost(self.name, lost)
            return
        try:
            await self.release()
        except (LockLost, LeaseReleased) as release_error:
            # Never hide the block's own exception behind the release's (as Lease does).
            logger.warning("releasing %r after an error: %s", self.name, release_error)

    def __enter__(self) -> NoReturn:
        # A plain `with` would never release (nothing can await the release there): refuse
        # it, and give the lock back in the background rather than hold it until exit.
        if not self._released:
            with contextlib.suppress(RuntimeError):  # no running loop: it runs out by ttl
                loop = asyncio.get_running_loop()
                self._closing = loop.create_task(self._release_quietly())
        raise TypeError(
            "an AsyncLease is released with 'async with' (or 'await lease.release()'), "
            "not with a plain 'with'"
        )

    def __exit__(self, *exc_info: object) -> None:
        """Never reached (``__enter__`` raises); defined so ``with`` gets that far."""

    async def _release_quietly(self) -> None:
        with contextlib.suppress(LockLost, LeaseReleased):
            await self.release()


class AsyncLockManager:
    """Redlock for asyncio code: ``await manager.acquire(...)``, ``async with manager.lock()``.

    Takes the same arguments as :class:`~django_redlock.LockManager` (except ``sleep``, which
    is ``asyncio.sleep``) and raises the same errors.
    """

    def __init__(self, nodes: Sequence[object], **options: Any) -> None:
        self._wrap(LockManager(nodes, **options))

    def _wrap(self, sync: LockManager) -> None:
        """Share ``sync``'s configuration, owners and observer (``get_async_manager``)."""
        self.sync = sync
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopConnections] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Configuration and operator calls (ttl, quorum, nodes, holder, locks, ...).
        return getattr(self.sync, name)

    def _connections(self) -> _LoopConnections:
        loop = asyncio.get_running_loop()
        with self._lock:
            connections = self._loops.get(loop)
            if connections is None:
                connections = _LoopConnections(self.sync.addresses, self.sync._hello)
                self._loops[loop] = connections
                # Closes the connections when the loop's tasks are cancelled at its end
                # (asyncio.run does that): protocols have no reader task that would.
                connections.guard = loop.create_task(connections.close_at_loop_end())
        return connections

    async def aclose(self) -> None:
        """Close this loop's connections."""
        self._connections().close()

    async def acquire(
        self,
        name: str,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        timeout: float | _ManagerDefault | None = MANAGER_DEFAULT,
        auto_extend: bool = False,
        max_hold: float | None = None,
        origin: str | None = None,
    ) -> AsyncLease:
        """Take lock ``name`` (see :meth:`LockManager.acquire`).

        Cancellation: a task cancelled here owns nothing afterwards. A round in flight is
        released on every node it may have reached (the releases are queued behind its SETs),
        and a waiter leaves the line, so the next release wakes a live waiter.
        """
        sync = self.sync
        name = validate_name(name)
        # Checked before re-entry too, so a bad argument is refused the same way every time.
        seconds, wait, hold = sync._acquire_arguments(
            ttl, blocking, timeout, auto_extend, max_hold, origin
        )
        scope = _owner_scope()
        held = sync._held.get((scope, name))
        if isinstance(held, AsyncLease) and not held.released and not held.lost:
            held._depth += 1
            return held
        origin = clip_origin(origin)
        key = sync.key_prefix + name
        ttl_ms = math.ceil(seconds * 1000)
        owner = sync._owner(origin)
        started = sync._clock()
        deadline = None if (blocking and wait is None) else started + (wait or 0.0)
        connections = self._connections()
        subscriber = connections.subscriber
        waiter = subscriber.waiter_id() if blocking else ""
        ticket = time.time_ns() // 1000
        lifetime_ms = math.ceil(max(1.0, 4 * sync.retry_delay) * 1000)
        size = len(sync.addresses)
        attempts = 0
        listening = False
        polls = 0  # waits in a row that ended without a wake-up (see _retry_delay)
        if len(sync._quarantine.heard) < sync.quorum:
            # Hear from the nodes before the first acquire (see LockManager._first_contact):
            # the PONGs come after each new connection's hello replies.
            await connections.run([_PING] * size, sync.node_timeout, b"PONG", sync.quorum)
        if waiter:
            subscriber.register(waiter)  # from now on a release naming us is kept
        try:
            while True:
                attempts += 1
                token = secrets.token_hex(20)
                command = _acquire_command(
                    key, token, ttl_ms, owner, sync._quarantine.ms, waiter, ticket, lifetime_ms
                )
                start = sync._clock()
                try:
                    results, granted, _ = await connections.run(
                        [command] * size, sync.node_timeout, _GRANTED, sync.quorum, identify=True
                    )
                except BaseException:
                    # Cancelled (or interrupted) mid-round: some SETs may have landed, or may
                    # still land on a slow node, and nobody would release them. The releases go
                    # out now, without awaiting, queued behind the SETs on each connection.
                    connections.post([_release_command(key, token)] * size)
                    raise
                elapsed = sync._clock() - start
                validity = sync._validity(seconds, elapsed)
                if granted >= sync.quorum and validity > 0:
                    sync._log_granted(name, results, granted)
                    lease = AsyncLease(
                        sync,
                        name=name,
                        key=key,
                        token=token,
                        ttl=seconds,
                        expires_at=start + elapsed + validity,
                        acquired_at=start + elapsed,
                        origin=origin,
                    )
                    lease._async_manager = self
                    sync._adopt(lease, scope, waiter, auto_extend, hold, started)
                    return lease
                # Failed: unlock wherever our SET may have landed (not where another holder
                # answered); written now, no await, so a cancellation cannot skip it.
                release = _release_command(key, token)
                connections.post([None if type(reply) is int else release for reply in results])
                error = sync._failure(name, results, granted, elapsed, attempts)
                now = sync._clock()
                if not blocking or (deadline is not None and now >= deadline):
                    raise sync._give_up(error, origin, now - started)
                delay = sync._retry_delay(now, deadline, polls)
                if not listening and await subscriber.subscribe(key, sync.node_timeout):
                    # Just subscribed: the try right after covers a release that came between
                    # our last try and the subscription (see LockManager.acquire).
                    listening = True
                else:
                    listening = True
                    if not await subscriber.wait(waiter, delay):
                        polls += 1
        except BaseException:
            if waiter:
                # Gave up, cancelled or interrupted: leave the line now (no await). A place left
                # behind would get the next release's wake-up, and the waiters behind it would
                # wait until it lapses.
                connections.post([_leave_command(key, waiter)] * size)
            raise
        finally:
            if waiter:
                subscriber.unregister(waiter)

    async def _release(self, lease: AsyncLease) -> None:
        sync = self.sync
        expired = lease._expires_at <= sync._clock()
        results, deleted, _ = await self._connections().run(
            [_release_command(lease.key, lease.token, lease._waiter)] * len(sync.addresses),
            sync.node_timeout,
            1,
            sync.quorum,
            capped=False,
        )
        sync._judge_release(lease, results, deleted, expired)

    async def _extend(self, lease: AsyncLease) -> float:
        sync = self.sync
        size = len(sync.addresses)
        start = sync._clock()
        results, extended, refused = await self._connections().run(
            [_extend_command(lease.key, lease.token, math.ceil(lease.ttl * 1000))] * size,
            sync.node_timeout,
            1,
            sync.quorum,
        )
        try:
            return sync._judge_extend(lease, start, sync._clock(), results, extended, refused)
        except LockLost:
            # Best effort, no await: free the keys we may still hold.
            self._connections().post([_release_command(lease.key, lease.token)] * size)
            raise

    async def _owned(self, lease: AsyncLease) -> bool:
        sync = self.sync
        _, owned, _ = await self._connections().run(
            [_owns_command(lease.key, lease.token)] * len(sync.addresses),
            sync.node_timeout,
            1,
            sync.quorum,
        )
        return owned >= sync.quorum and lease.validity > 0

    def lock(self, name: str, **options: Any) -> _AsyncLockContext:
        """``async with manager.lock(name, ...) as lease``: acquire on enter, release on exit."""
        return _AsyncLockContext(self, name, options)


class _AsyncLockContext:
    def __init__(self, manager: AsyncLockManager, name: str, options: dict[str, Any]) -> None:
        self._manager = manager
        self._name = name
        self._options = options
        self._lease: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._manager.acquire(self._name, **self._options)
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, traceback)
