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
* **No stale write** (the fenced table, ``tests/sim/fence.py``): a write the table accepts
  carries the highest fencing token minted for its row so far. A *defect* whatever happened
  before: it is checked, and never excused, after faults outside the model too (there the
  history goes on past the exclusion it broke, to see whether the fence holds).
* **Fair line** (a lock's wait line, on each node): a lock goes to the live head of its line
  or, with nobody in line, to anyone (``acquire.lua``); and a script that leaves the lock free
  with a live waiter at the head it did not head before (a release, a force release, a waiter
  ahead leaving) wakes that head (``wake_next.lua``'s PUBLISH): a waiter is never skipped,
  nor left to its poll delay while the lock stands free.
* **All or none** (``lock_many``): a try that sets any of its keys on a node sets all of
  them there (``acquire_many.lua``), so a multi-lock never holds part of its names.
* **Hand-off** (``adopt``): once a hand-off round moved a lease to the adopter's token, a
  script run with the giver's token never changes a key the adopter holds.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import TYPE_CHECKING, Any

from django_redlock.wire.primitives import RELEASE_MANY, RW_RELEASE, SEMAPHORE_RELEASE
from django_redlock.wire.scripts import GONE, LEAVE, NODE_KEY, RELEASE
from tests.sim.lua_node import Hash, ZSet

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tests.sim.world import LeaseRecord, SimClient, SimNode, World

_NODE_KEY = NODE_KEY.encode()
_OWNER_KEY = b"\x00o:"  # owner records (scripts/lock_key.lua): "\\0o:<id>:django_redlock:node"
# A finished waiter's gone mark (scripts/hand_gone.lua): "<lock key>\\0x<waiter id>", living
# GONE_MS as that script says (leave.lua includes it); it holds nothing back (it only refuses
# that waiter's late tries).
_GONE = GONE.encode()
_GONE_MS = int(re.findall(rb"^local GONE_MS = (\d+)$", LEAVE.source, re.MULTILINE)[0])
# LEAVE: a waiter taking hand-off grants leaves with its token, which it frees (leave.lua).
_RELEASES = (RELEASE.sha, SEMAPHORE_RELEASE.sha, RW_RELEASE.sha, RELEASE_MANY.sha, LEAVE.sha)


class Violation(AssertionError):
    """An invariant broken by a history (its seed and steps are in the message)."""


class Checker:
    def __init__(self, world: World) -> None:
        self.world = world
        self.leases: dict[str, list[LeaseRecord]] = {}
        self.records: list[LeaseRecord] = []  # every lease granted, in order (for tests)
        self.violations: list[str] = []
        self.defects: list[str] = []  # violations no fault excuses (a stale write)
        self.expected: set[str] = set()  # fault classes outside the model that happened
        self.fence: dict[str, int] = {}  # lock name -> highest fencing token minted
        self.handed: dict[bytes, bytes] = {}  # the giver's token -> the adopter's
        self.forcing: dict[str, int] = {}  # lock name -> force releases still on their way
        self.forced: dict[str, float] = {}  # lock name -> when its last force release landed
        # lock name -> the nodes its latest force release ran on (not those it never reached),
        # each with its process's incarnation then (a restart may restore keys from before)
        self.force_ran: dict[str, dict[int, int]] = {}
        self.fenced_off = 0  # stale writes refused after exclusion broke (outside the model)
        self.wakes = 0  # heads of line woken by a release, a force release or a leave
        self.force_releases = 0
        self.stop = False
        self.released: set[tuple[str, int]] = set()  # (token, node) a release was sent to
        self.crashed: set[int] = set()
        self.grants = 0
        self.failures = 0
        # node index -> (its process's incarnation, the waiter ids whose leave or release ran
        # there since): a hand-off grant to one of them is a phantom holder (hand_gone.lua)
        self.gone: dict[int, tuple[int, set[bytes]]] = {}
        self.max_ttl_ms = math.ceil(world.config.longest_ttl * 1000)
        self.line_ms = math.ceil(max(1.0, 4 * world.config.retry_delay) * 1000)

    def violate(self, text: str, *, defect: bool = False) -> None:
        """Record a broken invariant and stop the history; but after a fault outside the
        model (``expected``), an excused violation lets it go on, so that the invariants no
        fault excuses (``defect``: the fenced table's) are still checked."""
        if len(self.violations) < 20:
            self.world.log("!!", "VIOLATION: " + text)
            self.violations.append(text)
        if defect:
            self.defects.append(text)
        if defect or not self.expected:
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
        began: float,
    ) -> LeaseRecord:
        """A lease granted by a round sent at virtual time ``began``, valid until ``end``."""
        from tests.sim.world import LeaseRecord

        record = LeaseRecord(client.index, name, token, self.world.now, end, claims, began=began)
        self.grants += 1
        self.records.append(record)
        for resource, mode in claims:
            if mode != "x":
                continue
            if self.forcing.get(resource) or (
                began <= self.forced.get(resource, -1.0)
                and not self._holds_after_force(resource, token)
            ):
                # Its keys may have been set before a force release landed (or one is on its
                # way): evicted too, whoever holds them by then.
                record.revoked = self.world.now
        for resource, _ in claims:
            held = self.leases.setdefault(resource, [])
            now = self.world.now
            held[:] = [other for other in held if _end(other) > now]  # the live ones
            held.append(record)
        self._exclusion(record)
        return record

    def _holds_after_force(self, name: str, token: str) -> bool:
        """Whether a quorum of nodes that the latest force release of lock ``name`` ran on
        hold ``token`` now: their keys were set after its DEL there, so the lease they make
        is no evicted one, whenever its round was sent. (Without this, a round sent before
        the last DEL landed counted as evicted, even when each of its keys was set after the
        DEL on its node, as a review of the checker found.)"""
        from tests.sim.world import lock_token

        key = ("redlock:" + name).encode()
        wanted = token.encode()
        holding = 0
        for index, incarnation in self.force_ran.get(name, {}).items():
            node = self.world.nodes[index]
            if node.state == "down" or node.incarnation != incarnation:
                continue  # down, or restarted since: it may have loaded a key from before the DEL
            space = node.space
            expires = space.expires.get(key)
            if expires is not None and node.now_us() // 1000 > expires:
                continue
            if lock_token(space.data.get(key)) == wanted:
                holding += 1
        return holding >= self.world.flow_nodes.quorum

    def renewed(self, record: LeaseRecord, end: float) -> None:
        record.end = end
        if record.revoked is not None and all(
            not self.forcing.get(resource) and self._holds_after_force(resource, record.token)
            for resource, mode in record.claims
            if mode == "x"
        ):
            # Evicted, but its renewal (extend.lua re-creates a missing key) left a quorum of
            # keys set after the force release ran: a lease like any other from here on, and
            # watched as one (the checker used to look away for the rest of its renewals).
            record.revoked = None
            for resource, _ in record.claims:
                held = self.leases.setdefault(resource, [])
                if record not in held:  # dropped as ended while it was evicted
                    held.append(record)
        self._exclusion(record)

    def releasing(self, record: LeaseRecord) -> None:
        record.released = self.world.now

    def lost(self, record: LeaseRecord, cause: str) -> None:
        pass  # strict: the window still runs to the end of the validity

    def force_released(self, name: str) -> None:
        """An operator force-released lock ``name``: the exclusive leases on it end now."""
        now = self.world.now
        self.force_releases += 1
        for record in self.leases.get(name, ()):
            if dict(record.claims).get(name) == "x" and record.revoked is None:
                record.revoked = now

    def _exclusion(self, record: LeaseRecord) -> None:
        """The leases live now beside ``record`` (every window holds ``now``: a grant starts
        now, a renewal only moves the end of a live one, so ``now`` is where the most
        windows meet) must fit its claims."""
        now = self.world.now
        if _end(record) <= now:
            return  # evicted by a force release before it was granted: nothing is owed to it
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

    def gave_up(
        self, client: SimClient, name: str, deadline: float | None, end: float, paused: bool
    ) -> None:
        self.failures += 1
        self.ended(client, name, deadline, end, paused)

    def ended(
        self, client: SimClient, name: str, deadline: float | None, end: float, paused: bool
    ) -> None:
        """An acquire of ``name`` with ``deadline`` ended (granted or given up) at ``end``, on
        its client's clock."""
        if deadline is None or paused:
            return
        late = end - (deadline + self.world.config.node_timeout)
        if late > 1e-9:
            self.violate(
                f"c{client.index}'s acquire of {name} ended {late * 1000:.3f} ms past its deadline"
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
            if _GONE in key:
                bound = _GONE_MS
            elif key.startswith(_OWNER_KEY):
                # An owner's record (scripts/lock_key.lua) outlives its locks, by at most
                # twice the longest of them; it holds nothing back.
                bound = 2 * self.max_ttl_ms
            if when - now_ms > bound:
                self.violate(
                    f"{node.label}: key {key!r} lives {when - now_ms} ms more (bound {bound} ms)"
                )
                return

    def sent(self, client: SimClient, index: int, data: bytes) -> None:
        # A round sends the same bytes to every node: what a command releases is found once.
        tokens = _SENT.get(data)
        if tokens is None:
            if len(_SENT) > 256:
                _SENT.clear()
            tokens = _SENT[data] = _released_tokens(data)
        for token in tokens:
            self.released.add((token, index))

    def failed_try(self, client: SimClient, token: str) -> None:
        """A try of ``token`` failed (or its waiter left the line): soon nothing of it is left
        on a node that is up, unless the client crashed."""
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

    # -- the fenced table --------------------------------------------------------------------

    def minted(self, name: str, token: int) -> None:
        self.fence[name] = max(self.fence.get(name, 0), token)

    def written(self, who: str, name: str, token: int, accepted: bool) -> None:
        """The table took (``accepted``) or refused a write of ``name``'s row under
        ``token``."""
        high = self.fence.get(name, 0)
        if not accepted and self.violations:
            self.fenced_off += 1
        if accepted and token < high:
            self.violate(
                f"{name}: the table accepted {who}'s write under fencing token {token} after "
                f"token {high} was minted",
                defect=True,
            )

    # -- the fair line -----------------------------------------------------------------------

    def line_state(self, space: Any, key: bytes, now_ms: int) -> tuple[bool, bytes | None]:
        """(whether lock ``key`` is held on this keyspace at ``now_ms``, the live head of its
        wait line or None), read without changing anything (as the scripts would find it)."""
        when = space.expires.get(key)
        held = key in space.data and (when is None or now_ms <= when)
        line = _live(space, key + b"\0q", now_ms)
        lapse = _live(space, key + b"\0e", now_ms)
        head = None
        if type(line) is ZSet and type(lapse) is Hash:
            for member, _ in line.ordered():
                if int(lapse.get(member, b"0")) > now_ms:
                    head = member
                    break
        return held, head

    def live_order(self, space: Any, key: bytes, now_ms: int) -> list[bytes]:
        """The live members of lock ``key``'s wait line, in ticket order (read only)."""
        line = _live(space, key + b"\0q", now_ms)
        lapse = _live(space, key + b"\0e", now_ms)
        if type(line) is not ZSet or type(lapse) is not Hash:
            return []
        return [m for m, _ in line.ordered() if int(lapse.get(m, b"0")) > now_ms]

    def granted_on_node(
        self, node: SimNode, key: bytes, head: bytes | None, waiter: bytes, token: bytes
    ) -> None:
        """An acquire script gave ``key`` to ``token`` (waiter id ``waiter``, b"" for a
        single try) on ``node``, the live head of the line being ``head`` before it ran."""
        if head is not None and head != waiter:
            self.violate(
                f"{node.label}: {key!r} went to {token[:8]!r} (waiter {waiter!r}) past the "
                f"live head of its line {head!r}"
            )

    def freed_on_node(
        self,
        node: SimNode,
        key: bytes,
        before: tuple[bool, bytes | None],
        after: tuple[bool, bytes | None],
        published: Sequence[tuple[bytes, bytes]],
        order: tuple[list[bytes], list[bytes]] = ([], []),
    ) -> None:
        """A release, force release or leave ran on ``node``: ``before`` and ``after`` are
        :meth:`line_state` around it, ``published`` its PUBLISHes, ``order`` the live line
        (:meth:`live_order`) before and after it. A hand-off grant (``hand_grant.lua``:
        "<waiter> <round>") goes to a waiter live in line before the script, none of those
        ahead of it still live in line after it, and leaves the lock held."""
        for _, message in published:
            waiter, space, _ = message.partition(b" ")
            if not space:
                continue
            ahead = order[0][: order[0].index(waiter)] if waiter in order[0] else None
            if ahead is None or any(m in order[1] for m in ahead) or not after[0]:
                self.violate(
                    f"{node.label}: {key!r} granted to {waiter!r} past the live head of its "
                    f"line (before: {order[0]!r}, after: {order[1]!r}, held: {after[0]})"
                )
        held, head = after
        if held or head is None or (not before[0] and before[1] == head):
            return  # held, nobody waits, or the free lock's head did not change
        waiter = head.split(b"|", 1)[1] if head[:2] in (b"r|", b"w|") else head
        if any(message == waiter for _, message in published):
            self.wakes += 1
        else:
            self.violate(
                f"{node.label}: {key!r} left free with {waiter!r} at the head of its line, "
                "not woken"
            )

    def ended_on_node(self, node: SimNode, waiter: bytes) -> None:
        """``waiter``'s leave or release (its acquire is over) ran on ``node``."""
        incarnation, waiters = self.gone.get(node.index, (node.incarnation, set()))
        if incarnation != node.incarnation:
            waiters = set()  # a restart may restore a place from before the leave: not judged
        waiters.add(waiter)
        self.gone[node.index] = (node.incarnation, waiters)

    def granted_after_end(
        self, node: SimNode, key: bytes, published: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """A script ran on ``node`` and published ``published``: no hand-off grant
        ("<waiter> <round>", hand_grant.lua) names a waiter whose acquire is over there. Its
        place came back with a try the node ran late (scripts/hand_gone.lua), and nobody
        would use the lock for the grant's whole ttl."""
        incarnation, waiters = self.gone.get(node.index, (-1, set()))
        if incarnation != node.incarnation:
            return
        for _, message in published:
            waiter, space, _ = message.partition(b" ")
            if space and waiter in waiters:
                self.violate(
                    f"{node.label}: {key!r} granted to {waiter!r}, whose leave or release "
                    "already ran here: a phantom holder"
                )
                return

    # -- lock_many: all or none --------------------------------------------------------------

    def took_many(
        self,
        node: SimNode,
        keys: Sequence[bytes],
        before: frozenset[bytes],
        after: frozenset[bytes],
    ) -> None:
        """``acquire_many.lua`` ran on ``node``: the keys of the lease holding its token
        ``before`` and ``after``. Setting any of them sets every one."""
        if after - before and len(after) != len(keys):
            self.violate(
                f"{node.label}: a lock_many try took {sorted(after)} of {sorted(keys)}: not all"
            )

    # -- hand-off ----------------------------------------------------------------------------

    def handed_off(self, old: str, new: str) -> None:
        self.handed[old.encode()] = new.encode()

    def giver_ran(
        self, node: SimNode, key: bytes, old: bytes, before: object, after: object
    ) -> None:
        """A script carrying the giver's token ``old`` ran on ``node``: the adopter's key
        ``key`` (its value ``before`` and ``after``, with expiry) must not have changed."""
        new = self.handed[old]
        from tests.sim.world import lock_token

        if before is not None and lock_token(before[0]) == new and before != after:  # type: ignore[index]
            self.violate(
                f"{node.label}: the giver's token {old[:8]!r} changed {key!r}, which the "
                f"adopter's {new[:8]!r} held"
            )

    def client_crashed(self, client: SimClient) -> None:
        self.crashed.add(client.index)

    def finish(self) -> None:
        pass


_SENT: dict[bytes, tuple[str, ...]] = {}


def _released_tokens(data: bytes) -> tuple[str, ...]:
    """The ARGV of a release command (its token is one of them); () for any other."""
    from tests.sim.world import parse_command

    head = data[:120]
    evaluated = b"$4\r\nEVAL\r\n" in head[:16]  # a fallback, or a clean-up sent as EVAL at once
    if not evaluated and not any(sha in head for sha in _RELEASES):
        return ()  # most commands: found without parsing them
    _, parts = parse_command(data)
    if evaluated:
        sha = hashlib.sha1(parts[1], usedforsecurity=False).hexdigest().encode()
        if sha not in _RELEASES:
            return ()
    return tuple(arg.decode() for arg in parts[3 + int(parts[2]) :])


def _end(record: LeaseRecord) -> float:
    end = record.end if record.released is None else min(record.end, record.released)
    return end if record.revoked is None else min(end, record.revoked)


def _live(space: Any, key: bytes, now_ms: int) -> Any:
    when = space.expires.get(key)
    return space.data.get(key) if when is None or now_ms <= when else None
