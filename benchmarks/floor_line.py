"""W3's floor at equal work: the minimal Redlock's client sending our blocking acquire.

``benchmarks/floor.py`` is the floor of W1 and W2: the minimal client's code path sending our
single-try acquire and release. W3's blocking acquire sends other commands: a waiter's try,
which joins the lock's fair line and registers a hand-off token (``scripts/acquire.lua``,
``hand_register.lua``), and a holder's release that grants the lock to the head of the line on
each node and publishes the grant to it (``release.lua``, ``hand_grant.lua``). A waiter holds
the lock when a quorum of nodes granted it, with no round of its own.

:class:`SameCommandsLine` does that with the minimal client's code path
(:class:`~benchmarks.minimal_redlock.Rounds`) and nothing else: byte for byte the commands a
``LockManager`` sends for ``with manager.lock(name)`` with the default options, the waiter's
clean-up of a refused try included (``scripts/hand_undo.lua`` behind a try whose reply the
round did not wait for, ``hand_yield.lua`` behind one a node granted), and one pub/sub
connection per node on which it hears the grants. ``tests/test_floor.py`` compares them on
each node's ``MONITOR``. What it leaves out, as the minimal client does: the owner record's
observers, re-entry, reconnection, renewal of the place in line while it waits (a wait
longer than the place's life tries again, as ours does after its poll delay), a grant heard
from fewer than a quorum (it tries again at the end of the wait), and every check of bad
input. Off W3's path it also differs in small ways: an error reply counts as heard (ours
sends an undo behind it), a try that gives up yields what it holds and sends no leave, and a
node whose socket fails is not reconnected.

So W3 splits as W1 and W2 do: ours / this floor is the client's share, this floor / the
minimal Redlock the scripts' share (what a fair line with our rules costs the nodes and the
transport, in a client that does nothing else).

Units: ``ttl_ms`` and ``lifetime_ms`` in milliseconds, ``validity``, ``node_timeout`` and
``retry_delay`` in seconds.
"""

from __future__ import annotations

import random
import secrets
import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import hiredis

from benchmarks.floor import Held, SameCommandsRedlock
from benchmarks.minimal_redlock import CONNECT_TIMEOUT, DRIFT_FACTOR, DRIFT_FLOOR_MS, NODE_TIMEOUT
from benchmarks.minimal_redlock import _connect as connect
from benchmarks.references import LINE_LIFETIME_MS, QUARANTINE_MS
from django_redlock.core.owner import base36
from django_redlock.wire.resp import encode_command
from django_redlock.wire.scripts import (
    GRANTED,
    RELEASE,
    acquire_command,
    hand_undo_command,
    hand_yield_command,
    release_command,
)

RETRY_DELAY = 0.2  # seconds: a LockManager's default, the longest a waiter waits between tries


class SameCommandsLine(SameCommandsRedlock):
    """The minimal client, waiting in our line and taking hand-off grants (module docstring).
    Connects to every node at once (a command and a pub/sub connection each); raises what
    connecting raises. Not thread-safe."""

    def __init__(self, urls: list[str], node_timeout: float = NODE_TIMEOUT) -> None:
        super().__init__(urls, node_timeout)
        # The listener id, as a manager's subscriber makes it (wire/waking.py).
        self._listener = secrets.token_hex(6)
        self._subs: list[socket.socket] = []
        try:
            for url in urls:
                self._subs.append(connect(url, max(node_timeout, CONNECT_TIMEOUT)))
        except BaseException:
            self.close()
            raise
        self._sub_readers = [hiredis.Reader() for _ in urls]
        self._sub_poller = select.poll()
        self._sub_by_fd = {sock.fileno(): index for index, sock in enumerate(self._subs)}
        for fd in self._sub_by_fd:
            self._sub_poller.register(fd, select.POLLIN)
        self._channels: set[bytes] = set()

    def close(self) -> None:
        super().close()
        for sock in getattr(self, "_subs", ()):
            sock.close()

    @contextmanager
    def lock(self, key: str, ttl_ms: int, timeout: float = 60.0) -> Iterator[Held]:
        """Hold ``key`` (the full key, ``redlock:`` and the name) for the ``with`` block:
        wait in line until a round or a quorum of grants gives it; TimeoutError after
        ``timeout`` seconds."""
        held = self.acquire_in_line(key, ttl_ms, timeout)
        try:
            yield held
        finally:
            self.release_in_line(held)

    def acquire_in_line(self, key: str, ttl_ms: int, timeout: float = 60.0) -> Held:
        """Our blocking acquire's commands: tries in line, and grants heard in between."""
        deadline = time.monotonic() + timeout
        waiter = f"{self._listener}.{secrets.token_hex(4)}"
        self._subscribe(f"{key}\x00w{self._listener}".encode())
        token = secrets.token_hex(20)
        ticket = time.time_ns() // 1000
        owner = f"{self._owner_id}{base36(int(time.time() * 1000))}{self._owner_rest}"
        drift = ttl_ms * DRIFT_FACTOR + DRIFT_FLOOR_MS
        sent: dict[int, float] = {}
        # Per node, the round of the last reply heard from it (+ 0.5 after a yield there):
        # a grant naming an older round is stale, that reply said where things stand (as
        # flow.Acquire.hear_grants and _hand_clean_up keep it).
        answered: dict[int, float] = {}
        attempt = 0
        while True:
            attempt += 1
            command = acquire_command(
                key, token, ttl_ms, owner, QUARANTINE_MS, waiter, ticket, LINE_LIFETIME_MS,
                attempt,
            )[0]  # fmt: skip
            start = sent[attempt] = time.monotonic()
            commands = [command + identity for identity in self._identities]
            replies: list[object] = [None] * len(commands)
            granted = self._round(commands, GRANTED, stop_at_refusals=True, replies=replies)
            validity = (ttl_ms - drift) / 1000 - (time.monotonic() - start)
            if granted >= self.quorum and validity > 0:
                return Held(key, token, validity, waiter)
            for index, reply in enumerate(replies):
                if reply is not None:
                    answered[index] = attempt + 0.5 if reply == GRANTED else attempt
            self._clean_up(replies, key, token, waiter, ticket, attempt)
            if time.monotonic() > deadline:
                raise TimeoutError(f"same-commands line: {key} not acquired in {timeout:g} s")
            delay = random.uniform(0.5, 1.5) * RETRY_DELAY
            rounds = self._wait(waiter.encode(), delay, answered)
            if len(rounds) >= self.quorum:
                # A grant naming round r was made after the node ran round r's try: the
                # lease dates from the send of the oldest round the quorum's grants name.
                since = sent[min(sorted(rounds.values())[-self.quorum :])]
                validity = (ttl_ms - drift) / 1000 - (time.monotonic() - since)
                if validity > 0:
                    return Held(key, token, validity, waiter)

    def release_in_line(self, held: Held) -> bool:
        """The holder's release, identified: it grants the lock to the head of the line."""
        command = release_command(held.key, held.token, held.waiter, identified=True)[0]
        commands = [command + identity for identity in self._identities]
        return self._round(commands, 1, stop_at_refusals=False, held=held) >= self.quorum

    def _noscript(self, held: Held, index: int) -> bytes:
        body = RELEASE.eval((held.key,), (held.token, held.waiter), trailing=2)
        return body + self._identities[index]

    def _clean_up(
        self, replies: list[object], key: str, token: str, waiter: str, ticket: int, attempt: int
    ) -> None:
        """After a refused try, what ours posts (procedures/flow.py, Acquire._hand_clean_up): an
        undo behind a try whose reply the round did not wait for (``None`` in ``replies``),
        a yield where a node granted it (a minority)."""
        undo = yielded = b""
        for index, reply in enumerate(replies):
            if reply is None:
                undo = undo or hand_undo_command(key, token, waiter, attempt)[0]
                command = undo
            elif reply == GRANTED:
                yielded = (
                    yielded
                    or hand_yield_command(key, token, waiter, ticket, LINE_LIFETIME_MS, attempt)[0]
                )
                command = yielded
            else:
                continue
            if self._alive[index]:
                self._socks[index].sendall(command)
                self._owed[index] += 1

    def _subscribe(self, channel: bytes) -> None:
        """SUBSCRIBE on every node's pub/sub connection (once per channel), and wait for
        every node to confirm it, as a manager's subscriber does before its first wait
        (every node must answer then, as when connecting: there is no reconnection)."""
        if channel in self._channels:
            return
        command = encode_command(b"SUBSCRIBE", channel)
        for sock in self._subs:
            sock.sendall(command)
        for index, sock in enumerate(self._subs):
            sock.settimeout(CONNECT_TIMEOUT)
            reader = self._sub_readers[index]
            while (reply := reader.gets()) is False:
                reader.feed(sock.recv(4096))
            sock.settimeout(None)
            if not (isinstance(reply, list) and reply[0] == b"subscribe"):
                raise RuntimeError(f"same-commands line: SUBSCRIBE answered {reply!r}")
        self._channels.add(channel)

    def _wait(self, waiter: bytes, seconds: float, answered: dict[int, float]) -> dict[int, int]:
        """Hear what releases publish to ``waiter`` for up to ``seconds``: node index ->
        the round its grant names, unless older than the last reply heard from that node
        (``answered``). Returns at a quorum of grants, or when woken without a grant (the
        next try goes at once), or at the end of the wait."""
        deadline = time.monotonic() + seconds
        rounds: dict[int, int] = {}
        while len(rounds) < self.quorum:
            wait_ms = (deadline - time.monotonic()) * 1000
            if wait_ms <= 0:
                break
            for fd, _ in self._sub_poller.poll(wait_ms):
                index = self._sub_by_fd[fd]
                data = self._subs[index].recv(65536)
                if not data:
                    raise ConnectionError("same-commands line: a node closed its pub/sub")
                reader = self._sub_readers[index]
                reader.feed(data)
                while (message := reader.gets()) is not False:
                    named, _, round_ = message[2].partition(b" ")
                    if named != waiter:
                        continue
                    if not round_:
                        return rounds  # woken, no grant: try again now
                    grant = int(round_)
                    if grant >= answered.get(index, 0):
                        rounds[index] = max(rounds.get(index, 0), grant)
        return rounds
