"""Reference transports for W1: what the same acquire + release costs without this project's
transport, so the choice of a hand-written one stays measured.

Both send the very commands our manager sends for ``acquire(name, blocking=False)`` then
``release()`` with the default options (the same scripts, keys, arguments, owner record and
connection identity, see ``scripts/acquire.lua``; ``tests/test_floor.py`` compares them on
each node's ``MONITOR``), to every node at once:

- ``raw_sockets``: plain sockets, write the acquire to all, then one ``poll()`` loop until a
  quorum granted; the same for the release. No retries, no timeouts beyond the poll's, no
  bookkeeping: the floor a Python transport can reach.
- ``redis_py_connections``: redis-py ``Connection`` objects, ``send_command`` to all, then
  ``read_response`` from each in turn (redis-py has no way to read whichever answers first).
"""

from __future__ import annotations

import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import hiredis

from django_redlock.core.owner import base36, owner_id, owner_prefix
from django_redlock.wire.clients import client_for
from django_redlock.wire.nodes import NodeAddress, parse_node
from django_redlock.wire.process import current_pid
from django_redlock.wire.scripts import (
    ACQUIRE,
    GRANTED,
    RELEASE,
    acquire_command,
    release_command,
)
from django_redlock.wire.setup import persistence_hint

PairRunner = Callable[[str], bool]
TTL_MS = 10_000
# What a LockManager sends with its default options: the quarantine of a restarted node
# (60 s, ms) and the lifetime of a place in line (max(1 s, 4 x retry_delay), ms).
QUARANTINE_MS = 60_000
LINE_LIFETIME_MS = 1_000


def owner_parts() -> tuple[str, str]:
    """The owner record's id and ``" " +`` its JSON up to ``acquired_at``, as a manager's
    ``OwnerRecords`` caches them for this thread (no task, no origin): an acquire's owner
    argument is ``id + base36(now in ms) + rest`` (see ``core/owner.py``)."""
    thread = threading.current_thread().name
    prefix = owner_prefix(socket.gethostname(), current_pid(), thread, None, None)
    return owner_id(prefix), f" {prefix}"


def identity(address: NodeAddress) -> tuple[str, str]:
    """The identity (``run_id/<promotion history>``) and persistence arguments our connections
    learn in their hello (``wire/setup.py``)."""
    with client_for(address, 1.0) as client:
        for script in (ACQUIRE, RELEASE):
            client.script_load(script.source)
        run_id = str(client.info("server")["run_id"])
        replication = client.info("replication")
        replid2 = replication["master_replid2"]  # redis-py reads an all-digit id as an int
        replid2 = f"{replid2:040d}" if isinstance(replid2, int) else replid2
        history = f"{replid2}:{replication['second_repl_offset']}"
        config = client.config_get("append*")
    flat = [str(part).encode() for item in config.items() for part in item]
    return f"{run_id}/{history}", persistence_hint(flat)


def _bulk(text: str) -> bytes:
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def identity_suffix(address: NodeAddress) -> bytes:
    """:func:`identity` as the two RESP bulk strings our transport appends to an acquire (and
    to the holder's release) on that node's connections."""
    run_id, persistence = identity(address)
    return _bulk(run_id) + _bulk(persistence)


def raw_sockets(urls: list[str]) -> PairRunner:
    addresses = [parse_node(url) for url in urls]
    quorum = len(addresses) // 2 + 1
    socks, identities = [], []
    for address in addresses:
        identities.append(identity_suffix(address))
        if address.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(address.path)
        else:
            sock = socket.create_connection((address.host, address.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking: a send waits for room (it never has to here), and a recv only follows a
        # poll that said the socket is readable.
        socks.append(sock)
    readers = [hiredis.Reader() for _ in socks]
    owed = [0] * len(socks)  # replies of earlier rounds still to come, per socket
    poller = select.poll()
    by_fd = {sock.fileno(): index for index, sock in enumerate(socks)}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)

    def round_trip(commands: list[bytes], yes: object) -> bool:
        for sock, command in zip(socks, commands, strict=True):
            sock.sendall(command)
        answered = [False] * len(socks)
        granted = refused = 0
        while granted < quorum and refused <= len(socks) - quorum:
            for fd, _ in poller.poll(50):
                index = by_fd[fd]
                readers[index].feed(socks[index].recv(8192))
                while (reply := readers[index].gets()) is not False:
                    if owed[index]:
                        owed[index] -= 1
                    elif not answered[index]:
                        answered[index] = True
                        if reply == yes:
                            granted += 1
                        else:
                            refused += 1
        for index, done in enumerate(answered):
            if not done:
                owed[index] += 1
        return granted >= quorum

    owner_tag, owner_rest = owner_parts()

    def run(name: str) -> bool:
        key = f"redlock:{name}"
        token = secrets.token_hex(20)
        owner = f"{owner_tag}{base36(int(time.time() * 1000))}{owner_rest}"
        acquire = acquire_command(
            key, token, TTL_MS, owner, QUARANTINE_MS, "", time.time_ns() // 1000,
            LINE_LIFETIME_MS,
        )[0]  # fmt: skip
        if not round_trip([acquire + identity for identity in identities], GRANTED):
            return False
        release = release_command(key, token, "", identified=True)[0]
        return round_trip([release + identity for identity in identities], 1)

    return run


def redis_py_connections(urls: list[str]) -> PairRunner:
    addresses = [parse_node(url) for url in urls]
    quorum = len(addresses) // 2 + 1
    identities = [identity(address) for address in addresses]
    # One connection each, taken from a pool as redis-py's own clients do, and kept.
    connections: list[Any] = [
        client_for(address, 1.0).connection_pool.get_connection() for address in addresses
    ]

    owner_tag, owner_rest = owner_parts()

    def run(name: str) -> bool:
        key = f"redlock:{name}"
        token = secrets.token_hex(20)
        keys = (key,)  # acquire.lua names the marker, line, lapse and readers keys itself
        owner = f"{owner_tag}{base36(int(time.time() * 1000))}{owner_rest}"
        ticket = time.time_ns() // 1000  # the place in line a single try names (µs)
        for connection, (run_id, persistence) in zip(connections, identities, strict=True):
            connection.send_command(
                "EVALSHA", ACQUIRE.sha, len(keys), *keys, token, TTL_MS, owner, QUARANTINE_MS,
                "", ticket, LINE_LIFETIME_MS, 0, run_id, persistence,
            )  # fmt: skip
        granted = sum(connection.read_response() == GRANTED for connection in connections)
        if granted < quorum:
            return False
        for connection, (run_id, persistence) in zip(connections, identities, strict=True):
            # The holder's release, completed by the connection's identity as ours is.
            connection.send_command("EVALSHA", RELEASE.sha, 1, key, token, "", run_id, persistence)
        released: int = sum(connection.read_response() == 1 for connection in connections)
        return released >= quorum

    return run
