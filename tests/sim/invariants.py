"""The invariants a history must keep, checked as it runs, on virtual time.

* **One holder**: no two leases of one lock whose validity windows overlap. A lease's window
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
from django_redlock.wire.scripts import NODE_KEY, RELEASE
from tests.sim.lua_node import Hash

if TYPE_CHECKING:
    from collections.abc import Sequence

    from django_redlock.wire.scripts import Command
    from tests.sim.world import LeaseRecord, SimClient, SimNode, World

_NODE_KEY = NODE_KEY.encode()
_RELEASE_SHA = RELEASE.sha


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

    # -- one holder ------------------------------------------------------------------------

    def granted(self, client: SimClient, name: str, token: str, end: float) -> LeaseRecord:
        from tests.sim.world import LeaseRecord

        record = LeaseRecord(client.index, name, token, self.world.now, end)
        self.grants += 1
        self.leases.setdefault(name, []).append(record)
        self._overlaps(record)
        return record

    def renewed(self, record: LeaseRecord, end: float) -> None:
        record.end = end
        self._overlaps(record)

    def releasing(self, record: LeaseRecord) -> None:
        record.released = self.world.now

    def lost(self, record: LeaseRecord, cause: str) -> None:
        pass  # strict: the window still runs to the end of the validity

    def _overlaps(self, record: LeaseRecord) -> None:
        until = _end(record)
        for other in self.leases[record.name]:
            if other is record or other.token == record.token:
                continue
            if max(record.start, other.start) < min(until, _end(other)):
                self.violate(
                    f"two holders of {record.name}: c{other.client} {other.token[:8]} valid "
                    f"{other.start:.6f}..{_end(other):.6f} and c{record.client} "
                    f"{record.token[:8]} valid {record.start:.6f}..{until:.6f}"
                )
                return

    # -- deadlines -------------------------------------------------------------------------

    def tried(self, client: SimClient, attempt: flow.Acquire, results: Sequence[Any]) -> None:
        pass

    def gave_up(self, client: SimClient, attempt: flow.Acquire, end: float, paused: bool) -> None:
        self.failures += 1
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
            lock = type(value) is Hash and b"t" in value
            bound = self.max_ttl_ms if lock else max(self.max_ttl_ms, self.line_ms)
            if when - now_ms > bound:
                self.violate(
                    f"{node.label}: key {key!r} lives {when - now_ms} ms more (bound {bound} ms)"
                )
                return

    def sent(self, client: SimClient, index: int, data: bytes) -> None:
        if _RELEASE_SHA in data[:120]:
            from tests.sim.world import parse_command

            _, parts = parse_command(data)
            self.released.add((parts[6].decode(), index))

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
                if type(value) is Hash and value.get(b"t") == want:
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
