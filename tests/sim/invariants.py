"""The invariants a history must keep, checked as it runs, on virtual time.

* **Exclusion**: no two leases of one lock whose validity windows overlap (a lock, a write
  lease, a lock of ``lock_many``: the same key); no read lease beside a writer; never more
  slots of a semaphore than its limit. A lease's window
  is the virtual time from the round that granted it to the instant its holder's clock
  reaches the validity the library computed (moved by each renewal), cut short by the
  release. It is strict: a lease a renewal judged "gone" or "taken" still counts until its
  validity ends (as ``REDLOCK_STORM_STRICT=1`` in tests/core/test_fault_storm.py), so an
  overlap shows that the library let a rival in, not that the holder noticed in time. Clock
  drift within the configured bound is already in the windows (each clock runs at its own
  rate), so no tolerance is added.
* **Deadline**: an acquire with a timeout gives up no later than its deadline plus one node
  timeout (the last round), on its own clock, unless a GC pause froze it meanwhile.
* **Key lifetime**: after every script, no lock key on any node lives longer than
  ``max_ttl`` from now (on the node's clock), every lock key has an expiry, and no wait-line
  key outlives a place's lifetime.
* **No leak**: every node a failed try's SET may have reached (it granted, or its answer was
  not heard) has been sent the try's release by the time the try is judged: checked against
  the nodes' keyspaces right then and again once late messages had time to land.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from django_redlock.core import flow
from django_redlock.wire.primitives import RELEASE_MANY, RW_RELEASE, SEMAPHORE_RELEASE
from django_redlock.wire.scripts import NODE_KEY, RELEASE
from tests.sim.lua_node import Hash, ZSet

if TYPE_CHECKING:
    from collections.abc import Sequence

    from django_redlock.wire.scripts import Command
    from tests.sim.world import LeaseRecord, SimClient, SimNode, World

_NODE_KEY = NODE_KEY.encode()
_OWNER_KEY = b"\x00o:"  # owner records (scripts/lock_key.lua): "\\0o:<id>:django_redlock:node"
_RELEASES = (RELEASE.sha, SEMAPHORE_RELEASE.sha, RW_RELEASE.sha, RELEASE_MANY.sha)


class Violation(AssertionError):
    """An invariant broken by a history (its seed and steps are in the message)."""


class Checker:
    def __init__(self, world: World) -> None:
        self.world = world
        self.leases: dict[str, list[LeaseRecord]] = {}
        self.violations: list[str] = []
        self.expected: set[str] = set()  # fault classes outside the model that happened
        self.stop = False
        self.released: set[tuple[str, int]] = set()  # (token, node) a release was sent to
        self.crashed: set[int] = set()
        self.grants = 0
        self.failures = 0
        self.max_ttl_ms = math.ceil(world.config.max_ttl * 1000)
        self.line_ms = math.ceil(max(1.0, 4 * world.config.retry_delay) * 1000)

    def violate(self, text: str) -> None:
        self.world.log("!!", "VIOLATION: " + text)
        self.violations.append(text)
        self.stop = True

    def expect_violations(self, reason: str) -> None:
        self.expected.add(reason)

    # -- one holder (a writer alone, readers together, a semaphore up to its limit) -----

    def granted(
        self,
        client: SimClient,
        name: str,
        token: str,
        end: float,
        claims: tuple[tuple[str, str], ...],
    ) -> LeaseRecord:
        from tests.sim.world import LeaseRecord

        record = LeaseRecord(client.index, name, token, self.world.now, end, claims)
        self.grants += 1
        for resource, _ in claims:
            held = self.leases.setdefault(resource, [])
            now = self.world.now
            held[:] = [other for other in held if _end(other) > now]  # the live ones
            held.append(record)
        self._exclusion(record)
        return record

    def renewed(self, record: LeaseRecord, end: float) -> None:
        record.end = end
        self._exclusion(record)

    def releasing(self, record: LeaseRecord) -> None:
        record.released = self.world.now

    def lost(self, record: LeaseRecord, cause: str) -> None:
        pass  # strict: the window still runs to the end of the validity

    def _exclusion(self, record: LeaseRecord) -> None:
        """The leases live now beside ``record`` (every window holds ``now``: a grant starts
        now, a renewal only moves the end of a live one, so ``now`` is where the most
        windows meet) must fit its claims."""
        now = self.world.now
        limit = self.world.config.limit
        for resource, mode in record.claims:
            live = [
                (other, dict(other.claims)[resource])
                for other in self.leases.get(resource, ())
                if other.start <= now < _end(other)
            ]
            others = [(o, m) for o, m in live if o.token != record.token]
            if mode == "s":
                broken = len(others) + 1 > limit
            elif mode == "r":
                broken = any(m == "x" for _, m in others)
            else:
                broken = bool(others)
            if broken:
                listed = ", ".join(
                    f"c{o.client} {o.name} {o.token[:8]} valid {o.start:.6f}..{_end(o):.6f}"
                    for o, _ in others
                )
                self.violate(
                    f"{resource}: c{record.client} {record.name} {record.token[:8]} valid "
                    f"{record.start:.6f}..{_end(record):.6f} beside {listed}"
                    + (f" (limit {limit})" if mode == "s" else "")
                )
                return

    # -- deadlines -------------------------------------------------------------------------

    def tried(self, client: SimClient, attempt: flow.Acquire, results: Sequence[Any]) -> None:
        pass

    def gave_up(self, client: SimClient, attempt: flow.Acquire, end: float, paused: bool) -> None:
        self.failures += 1
        self.ended(client, attempt, end, paused)

    def ended(self, client: SimClient, attempt: flow.Acquire, end: float, paused: bool) -> None:
        """An acquire ended (granted or given up) at ``end`` on its client's clock."""
        if attempt.deadline is None or paused:
            return
        late = end - (attempt.deadline + self.world.config.node_timeout)
        if late > 1e-9:
            self.violate(
                f"c{client.index}'s acquire of {attempt.name} ended {late * 1000:.3f} ms "
                "past its deadline"
            )

    # -- keys on the nodes -----------------------------------------------------------------

    def after_script(self, node: SimNode, now_ms: int) -> None:
        space = node.space
        for key, value in space.data.items():
            if key == _NODE_KEY:
                continue
            when = space.expires.get(key)
            if when is None:
                self.violate(f"{node.label}: key {key!r} has no expiry")
                return
            if now_ms > when:
                continue  # expired, not yet purged
            lock = type(value) is bytes and not key.startswith(_OWNER_KEY)
            bound = self.max_ttl_ms if lock else max(self.max_ttl_ms, self.line_ms)
            if key.startswith(_OWNER_KEY):
                # An owner's record (scripts/lock_key.lua) outlives its locks, by at most
                # twice the longest of them; it holds nothing back.
                bound = 2 * self.max_ttl_ms
            if when - now_ms > bound:
                self.violate(
                    f"{node.label}: key {key!r} lives {when - now_ms} ms more (bound {bound} ms)"
                )
                return

    def sent(self, client: SimClient, index: int, data: bytes) -> None:
        head = data[:120]
        if any(sha in head for sha in _RELEASES):
            from tests.sim.world import parse_command

            _, parts = parse_command(data)
            for arg in parts[3 + int(parts[2]) :]:  # the token is one of its ARGV
                self.released.add((arg.decode(), index))

    def failed_try(
        self,
        client: SimClient,
        token: str,
        clean_up: Sequence[Command | None],
        results: Sequence[Any],
    ) -> None:
        self._leaks(client, token)
        world = self.world
        settle = 5 * world.config.node_timeout + 20 * world.config.latency
        process = client.process
        world.at(world.now + settle, lambda: self._leaks(client, token, process))

    def _leaks(self, client: SimClient, token: str, process: object = None) -> None:
        if process is not None and (client.process is not process or not client.alive):
            return  # the client crashed: nobody is left to clean up
        want = token.encode()
        for node in self.world.nodes:
            if node.state == "down" or (token, node.index) in self.released:
                continue
            space = node.space
            now_ms = node.now_us() // 1000
            for key, value in space.data.items():
                if type(value) is bytes:  # a lock key: "<token> <owner id><acquired_at>"
                    mine = value.split(b" ", 1)[0] == want
                elif type(value) is Hash:
                    mine = value.get(b"t") == want
                elif type(value) is ZSet:  # readers: token -> expiry (ms, node clock)
                    mine = value.get(want, -1.0) >= now_ms
                else:
                    mine = False
                if mine:
                    when = space.expires.get(key)
                    if when is None or now_ms <= when:
                        self.violate(
                            f"{node.label} holds {key!r} for the failed try {token[:8]} of "
                            f"c{client.index}, which sent it no release"
                        )
                        return

    def client_crashed(self, client: SimClient) -> None:
        self.crashed.add(client.index)

    def finish(self) -> None:
        pass


def _end(record: LeaseRecord) -> float:
    return record.end if record.released is None else min(record.end, record.released)
