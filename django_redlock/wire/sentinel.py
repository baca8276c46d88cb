"""Where a Sentinel-managed node's master is: asked of its Sentinels, cached, asked again.

A node given as a Sentinel service (:class:`~django_redlock.wire.nodes.SentinelService`) has
no fixed address. When a connection to it opens, the transports call :func:`master_of` (sync)
or :func:`amaster_of` (asyncio I/O: the event loop never blocks), which answer from the cache,
else ask the Sentinels in turn (``SENTINEL GET-MASTER-ADDR-BY-NAME``), the one that answered
last first, all of them within one deadline: the node timeout, so a dead or stalled Sentinel
costs at most that, and only when a connection opens.

The answer is cached per service for the process, and dropped (:func:`forget`) whenever a
connection to that node is lost or meets a replica: a ``READONLY`` reply, the scripts' refusal
``QUARANTINED this node is a replica``, or a hello whose ``INFO replication`` says the address
the Sentinels gave is not a master (a Sentinel that has not seen the failover yet). The next
connection asks again. A daemon thread per service (:class:`Watch`) also listens to the
Sentinels' ``+switch-master``, so that connections that live on are dropped at a failover
instead of at the old master's demotion. Nothing here decides whether a node votes: a promoted
replica still waits its quarantine (``scripts/node_rule.lua``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import weakref
from dataclasses import replace
from typing import Any

from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress, SentinelService
from django_redlock.wire.resp import PROTOCOL_ERRORS, ReplyError, encode_command, make_reader
from django_redlock.wire.setup import describe, login_commands, tls_context

__all__ = ["Watch", "amaster_of", "cached", "endpoint", "forget", "master_of", "watch"]

# service -> ((host, port) of its master as last told, the Sentinel that told it);
# service -> the Sentinels' order to ask.
_MASTERS: dict[SentinelService, tuple[tuple[str, int], NodeAddress]] = {}
_ORDER: dict[SentinelService, tuple[NodeAddress, ...]] = {}
_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held the lock at the instant of the fork; that
    # thread does not exist here. The cache itself is kept: a connection checks the role.
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def cached(address: NodeAddress) -> tuple[str, int] | None:
    """The master ``(host, port)`` last told for ``address``'s service, or None."""
    assert address.sentinel is not None
    told = _MASTERS.get(address.sentinel)
    return None if told is None else told[0]


def forget(address: NodeAddress, *, stale: bool = False) -> None:
    """Drop the cached master of ``address``'s service (none: nothing to do): the next
    connection to it asks the Sentinels again.

    ``stale``: the address told turned out to be a replica. The Sentinel that told it is
    asked last from now on: one that has not seen a failover (cut off from the others, or
    slow) would otherwise name the same replica again at every connection.
    """
    service = address.sentinel
    if service is None:
        return
    with _LOCK:
        told = _MASTERS.pop(service, None)
        if stale and told is not None:
            order = _ordered(service)
            _ORDER[service] = (*(item for item in order if item != told[1]), told[1])


def endpoint(address: NodeAddress, master: tuple[str, int]) -> NodeAddress:
    """``address`` as a plain node at ``master``: the master's login, database and TLS."""
    return replace(address, host=master[0], port=master[1], sentinel=None)


def _ordered(service: SentinelService) -> tuple[NodeAddress, ...]:
    return _ORDER.get(service, service.sentinels)


def _remember(service: SentinelService, sentinel: NodeAddress, master: tuple[str, int]) -> None:
    with _LOCK:
        _MASTERS[service] = (master, sentinel)
        # The Sentinel that answered is asked first next time (as redis-py's Sentinel does):
        # a dead first Sentinel costs its timeout once, not at every connection.
        order = _ordered(service)
        _ORDER[service] = (sentinel, *(item for item in order if item != sentinel))


def _question(service: str) -> bytes:
    return encode_command(b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", service)


def _answer(reply: object, service: str) -> tuple[str, int]:
    """The master from a GET-MASTER-ADDR-BY-NAME reply.

    Raises:
        NodeError: an error reply, or the Sentinel does not know the service.
    """
    if isinstance(reply, ReplyError):
        raise NodeError(f"refused: {reply}")
    if not isinstance(reply, list) or len(reply) != 2:
        raise NodeError(f"does not monitor a master named {service!r}")
    host, port = reply
    try:
        return bytes(host).decode(), int(port)
    except (TypeError, ValueError):
        raise NodeError(f"answered {reply!r}, not a host and port") from None


def _take(logins: int, service: str, replies: list[object]) -> tuple[str, int]:
    """The answer once every reply is in ``replies`` (logins first)."""
    for reply in replies[:logins]:
        if isinstance(reply, ReplyError):
            raise NodeError(f"login refused: {reply}")
    return _answer(replies[logins], service)


def _failure(sentinel: NodeAddress, exc: BaseException) -> str:
    if isinstance(exc, NodeError):
        return f"{sentinel.label}: {exc}"
    if isinstance(exc, TimeoutError):
        return f"{sentinel.label}: timed out"
    if isinstance(exc, OSError):
        return f"{sentinel.label}: {describe(exc)}"
    return f"{sentinel.label}: {type(exc).__name__}"


def _gave_up(service: SentinelService, errors: list[str]) -> NodeError:
    return NodeError(
        f"no Sentinel told the master of service {service.service!r}: " + "; ".join(errors)
    )


# -- sync ---------------------------------------------------------------------------------


def _ask(sentinel: NodeAddress, service: str, deadline: float) -> tuple[str, int]:
    """One Sentinel's answer, within ``deadline`` (time.monotonic).

    Raises:
        NodeError, OSError: no answer (refused, timed out, TLS failed, login refused), or
            the Sentinel does not know the service.
    """
    commands = login_commands(sentinel)

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    assert sentinel.host is not None
    assert sentinel.port is not None
    sock = socket.create_connection((sentinel.host, sentinel.port), timeout=left())
    try:
        if sentinel.tls:
            sock.settimeout(left())
            sock = tls_context(sentinel).wrap_socket(sock, server_hostname=sentinel.host)
        sock.settimeout(left())
        sock.sendall(b"".join([*commands, _question(service)]))
        reader = make_reader()
        replies: list[object] = []
        while len(replies) <= len(commands):
            sock.settimeout(left())
            _take_in(reader, sock.recv(4096), replies)
        return _take(len(commands), service, replies)
    finally:
        sock.close()


def _take_in(reader: Any, data: bytes, replies: list[object]) -> None:
    """Feed what a Sentinel sent to ``reader`` and append each complete reply (both ways of
    asking read this way).

    Raises:
        NodeError: the Sentinel closed the connection, or sent bytes that are not RESP.
    """
    if not data:
        raise NodeError("connection closed by the Sentinel")
    reader.feed(data)
    try:
        while (reply := reader.gets()) is not False:
            replies.append(reply)
    except PROTOCOL_ERRORS:
        raise NodeError("answered bytes that are not RESP") from None


def master_of(address: NodeAddress, timeout: float) -> NodeAddress:
    """The master of ``address``'s service as a plain address (see :func:`endpoint`): the
    cached one, else the first Sentinel's answer, all of them asked within ``timeout``
    seconds together.

    Raises:
        NodeError: no Sentinel answered within ``timeout``, or none knows the service (the
            message says what each one did).
    """
    service = address.sentinel
    assert service is not None
    told = _MASTERS.get(service)
    if told is not None:
        return endpoint(address, told[0])
    deadline = time.monotonic() + timeout
    errors: list[str] = []
    for sentinel in _ordered(service):
        if time.monotonic() >= deadline:
            errors.append(f"{sentinel.label}: not asked, no time left")
            continue
        try:
            master = _ask(sentinel, service.service, deadline)
        except (OSError, NodeError, ValueError) as exc:
            errors.append(_failure(sentinel, exc))
            continue
        _remember(service, sentinel, master)
        return endpoint(address, master)
    raise _gave_up(service, errors)


# -- asyncio ------------------------------------------------------------------------------


async def _aask(sentinel: NodeAddress, service: str) -> tuple[str, int]:
    """:func:`_ask` with asyncio streams (the caller bounds it with ``asyncio.timeout``)."""
    commands = login_commands(sentinel)
    assert sentinel.host is not None
    assert sentinel.port is not None
    context = tls_context(sentinel) if sentinel.tls else None
    stream, writer = await asyncio.open_connection(
        sentinel.host,
        sentinel.port,
        ssl=context,
        server_hostname=sentinel.host if context else None,
    )
    try:
        writer.write(b"".join([*commands, _question(service)]))
        reader = make_reader()
        replies: list[object] = []
        while len(replies) <= len(commands):
            _take_in(reader, await stream.read(4096), replies)
        return _take(len(commands), service, replies)
    finally:
        writer.close()


async def amaster_of(address: NodeAddress, timeout: float) -> NodeAddress:
    """:func:`master_of` on the event loop: the Sentinels are asked with asyncio I/O.

    Raises:
        NodeError: as :func:`master_of`.
    """
    service = address.sentinel
    assert service is not None
    told = _MASTERS.get(service)
    if told is not None:
        return endpoint(address, told[0])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    errors: list[str] = []
    for sentinel in _ordered(service):
        if loop.time() >= deadline:
            errors.append(f"{sentinel.label}: not asked, no time left")
            continue
        try:
            async with asyncio.timeout_at(deadline):
                master = await _aask(sentinel, service.service)
        except (OSError, NodeError, ValueError) as exc:  # TimeoutError is an OSError
            errors.append(_failure(sentinel, exc))
            continue
        _remember(service, sentinel, master)
        return endpoint(address, master)
    raise _gave_up(service, errors)


# -- failovers heard ----------------------------------------------------------------------

# A connection that lives on is not asked about: until the Sentinels reconfigure an old master
# that is still up (SENTINEL FAILOVER, a partition that heals), it stays a master, and a client
# whose connection to it lives on would still get its vote while the promoted replica, its
# quarantine over, votes for others. So each process listens to the Sentinels' +switch-master
# (one thread per service, while a connection set uses it): at a switch the master told is
# forgotten and the transports drop their connections to the old one before their next round.

_WATCHES: weakref.WeakValueDictionary[SentinelService, Watch] = weakref.WeakValueDictionary()
_SWITCH = b"+switch-master"
_KEEPALIVE = 1.0  # seconds between PINGs to the Sentinel listened to
_SILENT = 3  # PINGs unanswered in a row before another Sentinel is listened to


class Watch:
    """The failovers of one service heard so far in this process (:attr:`switches`), kept
    up to date by a daemon thread listening to one of its Sentinels while anything holds
    this object (the connection sets of the nodes served by that service do).

    A transport notes :attr:`switches` when it opens a connection to the node, and drops
    the connection once the count has moved on (:func:`switched`).
    """

    def __init__(self, address: NodeAddress) -> None:
        assert address.sentinel is not None
        self.address = address
        self.service = address.sentinel
        self.switches = 0
        self.pid = 0
        self.thread: threading.Thread | None = None

    def ensure_running(self) -> None:
        """Start the listening thread if it is not running in this process (first use, or
        a forked child, which has none of its parent's threads)."""
        if self.pid == os.getpid() and self.thread is not None and self.thread.is_alive():
            return
        with _LOCK:
            if self.pid == os.getpid() and self.thread is not None and self.thread.is_alive():
                return
            self.pid = os.getpid()
            self.thread = threading.Thread(
                target=_listen,
                args=(weakref.ref(self), self.service, self.address),
                name=f"django_redlock-sentinel-{self.service.service}",
                daemon=True,
            )
            self.thread.start()


def watch(address: NodeAddress) -> Watch:
    """The :class:`Watch` of ``address``'s service (one per process), its thread started."""
    service = address.sentinel
    assert service is not None
    with _LOCK:
        found = _WATCHES.get(service)
        if found is None:
            found = Watch(address)
            _WATCHES[service] = found
    found.ensure_running()
    return found


def _switched(service: SentinelService, watch: Watch) -> None:
    with _LOCK:
        _MASTERS.pop(service, None)
        watch.switches += 1


def _subscribe(sentinel: NodeAddress) -> socket.socket:
    """A socket to ``sentinel`` subscribed to +switch-master (its confirmation read).

    Raises:
        OSError, NodeError: it cannot be reached, or refused the login or the subscription.
    """
    assert sentinel.host is not None
    assert sentinel.port is not None
    sock = socket.create_connection((sentinel.host, sentinel.port), timeout=_KEEPALIVE)
    try:
        if sentinel.tls:
            sock = tls_context(sentinel).wrap_socket(sock, server_hostname=sentinel.host)
        logins = login_commands(sentinel)
        sock.sendall(b"".join([*logins, encode_command(b"SUBSCRIBE", _SWITCH)]))
        reader = make_reader()
        replies: list[object] = []
        while len(replies) <= len(logins):
            data = sock.recv(4096)
            if not data:
                raise NodeError("connection closed by the Sentinel")
            reader.feed(data)
            while (reply := reader.gets()) is not False:
                replies.append(reply)
        if any(isinstance(reply, ReplyError) for reply in replies):
            raise NodeError("the Sentinel refused the login or the subscription")
    except BaseException:
        sock.close()
        raise
    return sock


def _listen(owner: weakref.ref[Watch], service: SentinelService, address: NodeAddress) -> None:
    """The thread of a :class:`Watch`: listen to the service's Sentinels in turn, until
    nothing holds the watch any more."""
    name = service.service.encode()
    while owner() is not None:
        for sentinel in _ordered(service):
            if owner() is None:
                return
            try:
                sock = _subscribe(sentinel)
            except (OSError, NodeError, ValueError):
                continue
            try:
                _hear(sock, owner, service, name)
            except (OSError, NodeError):
                pass
            except PROTOCOL_ERRORS:
                pass  # not RESP: another Sentinel, then
            finally:
                sock.close()
            # Between two Sentinels a switch may have gone unheard: forget the master told.
            forget(address)
        time.sleep(_KEEPALIVE)  # no Sentinel listens now: try them all again in a while


def _hear(
    sock: socket.socket, owner: weakref.ref[Watch], service: SentinelService, name: bytes
) -> None:
    """Read +switch-master messages from ``sock`` until it fails or falls silent, or nothing
    holds the watch any more.

    Raises:
        OSError, NodeError: the connection failed or the Sentinel fell silent.
    """
    reader = make_reader()
    sock.settimeout(_KEEPALIVE)
    silent = 0
    while True:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            if owner() is None:
                return
            silent += 1
            if silent > _SILENT:
                raise NodeError("the Sentinel fell silent") from None
            sock.sendall(encode_command(b"PING"))
            continue
        if not data:
            raise NodeError("connection closed by the Sentinel")
        silent = 0
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            if (
                isinstance(reply, list)
                and len(reply) == 3
                and reply[0] == b"message"
                and isinstance(reply[2], bytes)
                and reply[2].split(b" ", 1)[0] == name
            ):
                held = owner()
                if held is None:
                    return
                _switched(service, held)
                del held  # this thread must not keep the watch alive
