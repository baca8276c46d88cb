"""The floor at equal work: the minimal Redlock's client sending our exact commands.

``benchmarks/minimal_redlock.py`` is the floor of the algorithm: ``SET NX PX`` and a
compare-and-delete. Our guarantees (restart quarantine, fair wait line, owner record,
hand-off) need node scripts (``scripts/acquire.lua``, ``scripts/release.lua``) that cost the
servers more than ``SET NX PX``. :class:`SameCommandsRedlock` runs the minimal client's code
path (:class:`~benchmarks.minimal_redlock.Rounds`: one command per node, one ``poll()`` loop
that returns at a quorum, no retries, no bookkeeping) but sends, byte for byte, the commands a
``LockManager`` sends for ``acquire(name, blocking=False)`` then ``release()`` with the
default options: the acquire script with the owner record, the place in line (the time in
µs) and the line's lifetime, then each connection's identity (its ``run_id`` and persistence,
see ``wire/setup.py``); the holder's release, identified the same way. So a pair splits in two
measured shares:

- ours / this floor: what our client costs beyond the floor sending the same bytes;
- this floor / the minimal Redlock: what our commands cost (the scripts' server work, the
  longer commands) in a client that does nothing else.

``tests/test_floor.py`` checks, with ``MONITOR``, that the commands are ours (a change to what
the manager sends fails it until this module follows).

What it does not do, as the minimal client: retry, wait in line (a blocking caller sleeps and
tries again, see ``benchmarks/contention.py``), extend, re-enter, reconnect. An acquire a node
answers ``NOSCRIPT`` (scripts flushed after the client connected) counts as a refusal there;
a release gets the script's body, as the minimal client's does.

Units: ``ttl_ms`` in milliseconds, ``validity`` and ``node_timeout`` in seconds.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from benchmarks.minimal_redlock import DRIFT_FACTOR, DRIFT_FLOOR_MS, NODE_TIMEOUT, Rounds
from benchmarks.references import LINE_LIFETIME_MS, QUARANTINE_MS, identity_suffix, owner_parts
from django_redlock.core.owner import base36
from django_redlock.wire.nodes import parse_node
from django_redlock.wire.scripts import GRANTED, RELEASE, acquire_command, release_command


@dataclass(frozen=True)
class Held:
    """A lock this client holds: its key, its token, and the validity (seconds) it had when
    ``acquire`` returned; a waiter's id when it waited in line (``benchmarks/floor_line.py``)."""

    key: str
    token: str
    validity: float
    waiter: str = ""


class SameCommandsRedlock(Rounds):
    """The minimal Redlock's client, sending our acquire and release (module docstring).
    Connects to every node at once; raises what connecting raises. Not thread-safe."""

    def __init__(self, urls: list[str], node_timeout: float = NODE_TIMEOUT) -> None:
        super().__init__(urls, node_timeout)
        try:
            # The identity our connections learn in their hello (this also loads the
            # scripts, as every new connection of ours does).
            self._identities = [identity_suffix(parse_node(url)) for url in urls]
        except BaseException:
            self.close()
            raise
        self._owner_id, self._owner_rest = owner_parts()

    def acquire(self, key: str, ttl_ms: int) -> Held | None:
        """One try at ``key`` (the full key, ``redlock:`` and the name): a :class:`Held` with
        the validity left, or ``None``."""
        token = secrets.token_hex(20)
        start = time.monotonic()
        owner = f"{self._owner_id}{base36(int(time.time() * 1000))}{self._owner_rest}"
        command = acquire_command(
            key, token, ttl_ms, owner, QUARANTINE_MS, "", time.time_ns() // 1000,
            LINE_LIFETIME_MS,
        )[0]  # fmt: skip
        commands = [command + identity for identity in self._identities]
        granted = self._round(commands, GRANTED, stop_at_refusals=True)
        drift = ttl_ms * DRIFT_FACTOR + DRIFT_FLOOR_MS
        validity = (ttl_ms - drift) / 1000 - (time.monotonic() - start)
        if granted >= self.quorum and validity > 0:
            return Held(key, token, validity)
        # A node may have granted (or may yet grant, if its answer was late): free them all.
        self.release(Held(key, token, 0.0))
        return None

    def release(self, held: Held) -> bool:
        """Free ``held`` on every node where it still has its token; True when a quorum did."""
        command = release_command(held.key, held.token, "", identified=True)[0]
        commands = [command + identity for identity in self._identities]
        return self._round(commands, 1, stop_at_refusals=False, held=held) >= self.quorum

    def _noscript(self, held: Held, index: int) -> bytes:
        return RELEASE.eval((held.key,), (held.token, ""), trailing=2) + self._identities[index]
