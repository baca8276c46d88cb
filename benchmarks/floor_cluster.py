"""The floor at equal work on cluster nodes: the same-commands floor that routes by slot.

``benchmarks/floor.py`` sends our acquire and release to one connection per node. On a node
that is a Redis/Valkey Cluster (``django_redlock/wire/cluster_route.py``) ours sends each
lock's request to the master that serves its slot, in the cluster form: the lock's key
wrapped in its hash tag (``{redlock:name}``) and the shard's variant of the script (its
restart marker and owner records named with the shard's tag). :class:`RoutedSameCommands` does
the least a client can do to send those very bytes:

- once, at start: read each node's slot map (``CLUSTER SHARDS``), and for each master the
  shard's script heads, its scripts loaded, its connection identity (as ``floor.py``);
- per acquire and per release: the tagged key and its slot (CRC16), each node's owner of that
  slot (a binary search in its map), then one round of the minimal client
  (:class:`~benchmarks.minimal_redlock.Rounds`, the very loop the plain floor runs) over the
  owners' connections, the command's head (script id, key count) swapped for each shard's
  and the keys the script derives from the lock's declared after it (``Script.cluster_keys``),
  as a cluster refuses a script that touches an undeclared key of a migrating slot.

The owners of one slot on the N nodes make a *lane*, a ``Rounds`` of its own (connections,
replies owed by earlier rounds), made on first use: with equal slot ranges on every node (as
the benchmark's clusters have) there is one lane per shard. What it does not do, as the
floor: follow ``MOVED``/``ASK`` (a slot that moved counts as a refusal there), re-read the map,
retry, reconnect. ``tests/test_bench_cluster.py`` checks, with ``MONITOR`` on the owning
masters, that it sends what a ``LockManager`` sends on the same cluster nodes.

Units: ``ttl_ms`` in milliseconds, ``validity`` and ``node_timeout`` in seconds.
"""

from __future__ import annotations

import secrets
import time
from urllib.parse import urlsplit

from benchmarks.floor import Held
from benchmarks.minimal_redlock import DRIFT_FACTOR, DRIFT_FLOOR_MS, NODE_TIMEOUT, Rounds
from benchmarks.references import LINE_LIFETIME_MS, QUARANTINE_MS, identity_suffix, owner_parts
from django_redlock.core.owner import base36
from django_redlock.wire.clients import client_for
from django_redlock.wire.cluster import SlotMap, cluster_key, key_slot, marker_tag
from django_redlock.wire.cluster_route import read_map
from django_redlock.wire.nodes import parse_node
from django_redlock.wire.scripts import ACQUIRE, GRANTED, RELEASE, acquire_command, release_command

Endpoint = tuple[str, int]

# The heads of the two commands as ``acquire_command``/``release_command`` build them (plain
# script ids); a shard's head differs only in its script's id, of the same length.
_ACQUIRE_HEAD = ACQUIRE.head(1, 10).encode()
_RELEASE_HEAD = RELEASE.head(1, 4).encode()
_ACQUIRE_SUFFIXES = ("", *ACQUIRE.cluster_keys)


class _Lane(Rounds):
    """One connection to each of N masters, one per node (the owners of some slots), with
    each master's script heads and connection identity."""

    def __init__(self, urls: list[str], tags: list[str], node_timeout: float) -> None:
        super().__init__(urls, node_timeout)
        try:
            self.tags = tags
            self.identities = []
            self.acquire_heads = []
            self.release_heads = []
            for url, tag in zip(urls, tags, strict=True):
                member = parse_node(url)
                acquire, release = ACQUIRE.for_shard(tag), RELEASE.for_shard(tag)
                with client_for(member, 1.0) as client:  # as our connections' hello does
                    client.script_load(acquire.source)
                    client.script_load(release.source)
                self.identities.append(identity_suffix(member))
                self.acquire_heads.append(acquire.head(1 + len(ACQUIRE.cluster_keys), 10).encode())
                self.release_heads.append(release.head(1, 4).encode())
        except BaseException:
            self.close()
            raise

    def _noscript(self, held: Held, index: int) -> bytes:
        body = RELEASE.for_shard(self.tags[index])
        return body.eval((held.key,), (held.token, ""), trailing=2) + self.identities[index]


class RoutedSameCommands:
    """The same-commands floor on cluster nodes (module docstring). Reads every node's slot
    map at once; raises what connecting or reading raises. Not thread-safe."""

    def __init__(self, urls: list[str], node_timeout: float = NODE_TIMEOUT) -> None:
        self.node_timeout = node_timeout
        self.quorum = len(urls) // 2 + 1
        self._urls = urls
        self._maps: list[SlotMap] = []
        for url in urls:
            seed = parse_node(url)
            with client_for(seed, max(node_timeout, 1.0)) as client:
                self._maps.append(read_map(client, seed.host or "127.0.0.1"))
        self._lanes: dict[tuple[Endpoint | None, ...], _Lane] = {}
        self._owner_id, self._owner_rest = owner_parts()

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()

    def _lane(self, slot: int) -> _Lane:
        owners = tuple(slot_map.master_of(slot) for slot_map in self._maps)
        lane = self._lanes.get(owners)
        if lane is None:
            lane = self._lanes[owners] = self._open(owners)
        return lane

    def _open(self, owners: tuple[Endpoint | None, ...]) -> _Lane:
        members, tags = [], []
        for url, slot_map, owner in zip(self._urls, self._maps, owners, strict=True):
            shard = next((s for s in slot_map.shards if s.master == owner), None)
            if owner is None or shard is None:
                raise RuntimeError(f"no master of the cluster at {url} serves the slot")
            # The seed's URL (login, options) at the master's address.
            parts = urlsplit(url)
            login = parts.netloc.rpartition("@")[0]
            netloc = f"{login}@" if login else ""
            members.append(parts._replace(netloc=f"{netloc}{owner[0]}:{owner[1]}").geturl())
            tags.append(marker_tag(shard))
        return _Lane(members, tags, self.node_timeout)

    def acquire(self, key: str, ttl_ms: int) -> Held | None:
        """One try at ``key`` (the full key, ``redlock:`` and the name, without a tag): a
        :class:`~benchmarks.floor.Held` (its key in cluster form) with the validity left, or
        ``None``."""
        token = secrets.token_hex(20)
        start = time.monotonic()
        key = cluster_key(key)
        lane = self._lane(key_slot(key))
        owner = f"{self._owner_id}{base36(int(time.time() * 1000))}{self._owner_rest}"
        command = acquire_command(
            key, token, ttl_ms, owner, QUARANTINE_MS, "", time.time_ns() // 1000,
            LINE_LIFETIME_MS,
        )[0]  # fmt: skip
        # The keys a cluster node's acquire declares: the lock's, then those the script
        # derives from it (its line, lapse times, readers: Script.cluster_keys), each tagged.
        keys = "".join(
            f"${len(key) + len(suffix)}\r\n{key}{suffix}\r\n" for suffix in _ACQUIRE_SUFFIXES
        ).encode()
        rest = keys + command[len(_ACQUIRE_HEAD) + len(key) + len(str(len(key))) + 5 :]
        commands = [
            head + rest + identity
            for head, identity in zip(lane.acquire_heads, lane.identities, strict=True)
        ]
        granted = lane._round(commands, GRANTED, stop_at_refusals=True)
        drift = ttl_ms * DRIFT_FACTOR + DRIFT_FLOOR_MS
        validity = (ttl_ms - drift) / 1000 - (time.monotonic() - start)
        if granted >= self.quorum and validity > 0:
            return Held(key, token, validity)
        # A node may have granted (or may yet grant, if its answer was late): free them all.
        self.release(Held(key, token, 0.0))
        return None

    def release(self, held: Held) -> bool:
        """Free ``held`` on every node where it still has its token; True when a quorum did."""
        lane = self._lane(key_slot(held.key))
        rest = release_command(held.key, held.token, "", identified=True)[0][len(_RELEASE_HEAD) :]
        commands = [
            head + rest + identity
            for head, identity in zip(lane.release_heads, lane.identities, strict=True)
        ]
        return lane._round(commands, 1, stop_at_refusals=False, held=held) >= self.quorum
