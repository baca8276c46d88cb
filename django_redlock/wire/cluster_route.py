"""Where a lock node's commands go when the node is a Redis/Valkey Cluster, and in what form.

A node URL that reaches a cluster member is a cluster node. Plain or cluster is a fact about
the server *process* a connection reaches, not about its address (an endpoint may be switched
between the modes, or a port re-used, while clients run): every new connection asks
(``INFO cluster``, ``CLUSTER SHARDS``, pipelined in its set-up: see
``Handshake.classifying`` in wire/setup.py) and holds every command until the answer, so a
lock's keys never take their plain form on a cluster member, nor their cluster form on a
plain server (two forms of one lock on one server would be two locks: two holders). A
transport whose connection finds the other mode switches the node before anything is sent
on it. What connections learned is kept for the process as a hint (:func:`known`), for the
helpers that ask nothing (a wake-up channel, a multi-lock's early refusal, the operators'
views); the transports never route by it. A :class:`ClusterRoute` places each command on
the master that serves its lock's slot, in the cluster form (:meth:`ClusterRoute.place`):

- every key the command names takes its cluster form (:func:`~django_redlock.wire.cluster.
  cluster_key`: one slot per lock), and a node's own record (``NODE_KEY``) the shard's;
- an EVALSHA or EVAL runs the shard's variant of its script
  (:meth:`~django_redlock.wire.scripts.Script.for_shard`: the shard's restart marker and
  owner records, in a slot it serves);
- a command that names no key (PING, a node-wide script) goes to the member the URL names.

The transport follows a ``MOVED`` (the slot has a new owner: :meth:`ClusterRoute.moved`) or
an ``ASK`` (this one command, after ``ASKING``) within the round's node timeout. No I/O here
but :func:`probe`'s, which the transport calls, blocking, within the node timeout.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import redis

from django_redlock.wire.cluster import (
    SlotMap,
    cluster_key,
    cluster_key_bytes,
    cross_slot_message,
    hash_tag,
    key_slot,
    lock_slots,
    marker_tag,
    parse_shards,
    parse_slots,
)
from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.resp import encode_command
from django_redlock.wire.scripts import NODE_KEY, SCRIPTS_BY_SHA, Fallback, Script

__all__ = [
    "ASKING",
    "ASKING_REPLY",
    "MAP_AFTER_FAILURE",
    "MAX_HOPS",
    "REDIRECT_WATCH",
    "ClusterRoute",
    "CrossSlot",
    "NotCluster",
    "Routed",
    "channel_on",
    "current_map",
    "known",
    "plain_form",
    "probe",
    "read_map",
    "refuse_across_slots",
    "remember",
    "shards_reply_map",
]

ASKING = encode_command(b"ASKING")
ASKING_REPLY = -20
"""The set-up step of an ``ASKING`` reply (see wire/setup.py's steps: nothing to
learn from its ``OK``)."""
MAP_AFTER_FAILURE = 1.0
"""Seconds since the slot map was read after which a failed connection to a shard master
has the map read again before the next round (:meth:`ClusterRoute.failed`): a master that
died is replaced by a promoted replica, which no MOVED announces while the old address
answers nothing. At most once a second, so a shard down for long costs no round more than
one map read a second."""
MAX_HOPS = 5
"""Redirections one command may follow in one round: more means the cluster is being
reconfigured faster than it answers; the node counts as failed for that round."""
REDIRECT_WATCH = 60.0
"""Seconds after a ``MOVED`` or ``ASK`` from one of a cluster node's members during which a
clean-up's reply still owed when its round ends is watched by a courier thread (so that a
redirect that comes then still takes the clean-up to the shard named, see
``ConnectionSet._owes``): a resharding moves slot after slot, each redirect announcing more.
Outside it, such a reply is read by the thread's next operation, as a plain node's late
``NOSCRIPT`` is."""

Endpoint = tuple[str, int]


def read_map(client: redis.Redis, asked_host: str) -> SlotMap:
    """The slot map a member gives: ``CLUSTER SHARDS``, or ``CLUSTER SLOTS`` where the server
    has no SHARDS (before Redis 7).

    Raises:
        redis.RedisError: the member failed or refused both.
        ValueError: a reply of an unexpected shape.
    """
    try:
        shards = client.execute_command("CLUSTER", "SHARDS")  # type: ignore[no-untyped-call]
    except redis.ResponseError:
        slots = client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        return parse_slots(slots, asked_host)
    return parse_shards(shards, asked_host)


def probe(address: NodeAddress, timeout: float) -> SlotMap | None:
    """Whether the node at ``address`` is a cluster member (``INFO cluster``:
    ``cluster_enabled:1``) and, if it is, its slot map; None for a plain node.

    Blocking, one connection of its own, within ``timeout`` seconds per reply.

    Raises:
        NodeError: the node could not be asked (unreachable, timed out, refused): whether it
            is a cluster is not known, so nothing may be sent to it yet.
    """
    from django_redlock.wire.clients import client_for  # clients imports sentinel: no cycle

    try:
        with client_for(address, timeout) as client:
            info = client.info("cluster")
            if not int(info.get("cluster_enabled", 0)):
                return None
            return read_map(client, address.host or "127.0.0.1")
    except (redis.RedisError, OSError, ValueError) as exc:
        raise NodeError(f"could not tell whether the node is a cluster: {exc}") from None


# What this process's connections last found at each node address, by identity: plain, or a
# cluster with its slot map. A hint only (see the module docstring): each connection asks
# its own server, and the last answer wins (remember drops the other kind).
_PLAIN: set[tuple[object, ...]] = set()
_MAPS: dict[tuple[object, ...], SlotMap] = {}


def known(address: NodeAddress) -> tuple[bool, SlotMap | None]:
    """What this process last learned of the node at ``address``: ``(False, None)`` nothing
    yet, ``(True, None)`` plain, ``(True, map)`` a cluster, with the slot map it had then
    (MOVED answers correct it). A hint, as old as the last connection that asked: the server
    there may have changed mode since."""
    identity = address.identity
    if identity in _PLAIN:
        return True, None
    slot_map = _MAPS.get(identity)
    return slot_map is not None, slot_map


def remember(address: NodeAddress, slot_map: SlotMap | None) -> None:
    """Record that the node at ``address`` was found plain (None) or a cluster with
    ``slot_map`` (the hint :func:`known` gives, in any thread or event loop)."""
    identity = address.identity
    if slot_map is None:
        _MAPS.pop(identity, None)
        _PLAIN.add(identity)
    else:
        _PLAIN.discard(identity)
        _MAPS[identity] = slot_map


def current_map(address: NodeAddress, timeout: float) -> SlotMap | None:
    """For operators (a status, a listing): the slot map of the node at ``address`` as its
    members give it now, or None for a plain node; a node this process has not classified
    yet is asked (:func:`probe`). A cluster's map is read afresh each time (a failover since
    the process learned it moved a shard's master), from the seed or, when it does not
    answer, another member; the last one known when none answers.

    Raises:
        NodeError: a node not classified yet could not be asked.
    """
    found, slot_map = known(address)
    if not found:
        slot_map = probe(address, timeout)
        remember(address, slot_map)
        return slot_map
    if slot_map is None:
        return None
    route = ClusterRoute(address, slot_map)
    try:
        route.refresh(route.read(timeout))
    except NotCluster:  # the server there is plain now
        remember(address, None)
        return None
    except NodeError:  # none answered: the last map known
        pass
    return route.map


def refuse_across_slots(
    addresses: Sequence[NodeAddress], keys: Sequence[str], timeout: float, ask: bool = True
) -> None:
    """Refuse a multi-lock over lock ``keys`` in more than one slot when a node of
    ``addresses`` is a cluster: a cluster runs one script on one slot's keys only, so such a
    node could never vote for it (names without one hash tag land in different slots).
    Nothing is sent for it then.

    Free when every node is known plain (no slot is computed: the hint :func:`known`; a node
    that became a cluster since is refused by the transport, :class:`CrossSlot`). Only when
    the keys span slots, each other node is asked (``ask``: :func:`probe`, blocking, within
    ``timeout``): one not classified yet, or known as a cluster (the hint is confirmed before
    a refusal: its endpoint may be plain now); one that cannot be asked is taken as the hint
    says (one never classified is left to the transport, which refuses the command there
    alone). Without ``ask`` the hint decides.

    Raises:
        ValueError: the keys span slots and a node is a cluster; the text names the slots and
            the hash-tag fix.
    """
    kinds = [known(address) for address in addresses]
    if all(found and slot_map is None for found, slot_map in kinds):
        return
    if len(lock_slots(keys)) < 2:
        return
    cluster = False
    for address, (found, slot_map) in zip(addresses, kinds, strict=True):
        if found and slot_map is None:
            continue
        if ask:
            try:
                slot_map = probe(address, timeout)
            except NodeError:
                pass
            else:
                remember(address, slot_map)
        if slot_map is not None:
            cluster = True
            break
    if cluster:
        raise ValueError(cross_slot_message(keys))


def channel_on(address: NodeAddress, channel: str) -> str:
    """Wake-up ``channel`` (a lock key, NUL, ``w``, a listener id: wire/waking.py) as the
    node at ``address`` publishes it: in cluster form on a cluster node, whose scripts name
    it after the lock's tagged key. A node this process has not classified yet is taken as
    plain (its releases then go unheard: the waiter's poll covers it). Classic pub/sub
    reaches every member of a cluster, so the node's own address hears every shard."""
    return channel if known(address)[1] is None else cluster_key(channel)


def shards_reply_map(address: NodeAddress, reply: object, timeout: float) -> SlotMap:
    """The slot map of cluster node ``address`` from the ``CLUSTER SHARDS`` reply of its
    first connection, or, when that was refused (before Redis 7), read with ``CLUSTER
    SLOTS`` (blocking, within ``timeout``).

    Raises:
        NodeError: neither could be had.
    """
    if isinstance(reply, list):
        try:
            return parse_shards(reply, address.host or "127.0.0.1")
        except ValueError:
            pass
    return ClusterRoute(address, SlotMap.of([])).read(timeout)


class NotCluster(NodeError):
    """The server at a cluster node's own address answered as a plain server (its cluster
    support disabled): the endpoint was switched out of cluster mode, and the node must be
    used as a plain node from now on."""


class CrossSlot(NodeError):
    """A command whose lock keys lie in more than one slot of a cluster node: never sent
    (the node would answer CROSSSLOT). The text names the slots and the hash-tag fix."""


class Routed(Fallback):
    """The NOSCRIPT fallback of a command placed on a shard: the original command's
    fallback, built in the form of that shard (:meth:`ClusterRoute.rewrite`). Also what a
    MOVED or ASK re-sends (``original`` is built in the form of the shard named), with the
    redirections followed so far (``hops``)."""

    __slots__ = ("acked_yes", "endpoint", "hops", "original", "route")
    acked_yes: tuple[object, ...]
    endpoint: Endpoint
    hops: int
    original: Fallback
    route: ClusterRoute

    @classmethod
    def of(
        cls, original: Fallback, route: ClusterRoute, endpoint: Endpoint, hops: int = 0
    ) -> Routed:
        if isinstance(original, Routed):
            original = original.original
        routed = cls(
            lambda: route.rewrite(original.build(), endpoint),
            original.when_over,
            original.eager,
            original.identify,
        )
        routed.original = original
        routed.route = route
        routed.endpoint = endpoint
        routed.hops = hops
        routed.acked_yes = original.acked_yes
        return routed


# How a server with cluster support disabled refuses CLUSTER SHARDS and CLUSTER SLOTS (Redis
# and Valkey alike).
_NOT_CLUSTER = "cluster support disabled"


def plain_form(
    data: bytes, fallback: Fallback | None, identify: bool
) -> tuple[bytes, Fallback | None, bool] | None:
    """A command a cluster node's shard connection held, ``data`` with reply ``fallback``
    (completed with the identity when ``identify``), as a plain server runs it: the node
    turned out to be plain (its endpoint's cluster mode switched off). The original
    command's EVAL (its fallback's build), that fallback and whether the identity completes
    it (the fallback's own rule, as for a NOSCRIPT); a command that names no lock key (not
    EVAL or EVALSHA) as it is. None when it cannot be had (an ``ASKING``: it was for the
    shard alone; a script command with no fallback)."""
    if isinstance(fallback, Routed):
        original = fallback.original
        return original.build(), original, original.identify
    if data == ASKING or _parse(data) is not None:
        return None
    return data, fallback, identify


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _read_bulk(data: bytes, at: int) -> tuple[bytes, int]:
    """The bulk string at ``data[at:]`` and the offset after it.

    Raises:
        ValueError: not a complete bulk string there.
    """
    if data[at : at + 1] != b"$":
        raise ValueError("not a bulk string")
    end = data.index(b"\r\n", at)
    size = int(data[at + 1 : end])
    start = end + 2
    if len(data) < start + size + 2:
        raise ValueError("bulk string cut short")
    return data[start : start + size], start + size + 2


class ClusterRoute:
    """One cluster node's slot map, and how its commands are placed on its shards.

    Args:
        seed: the node's address as configured (its login, TLS and database settings are
            every member's).
        slot_map: the map :func:`probe` read.
    """

    def __init__(self, seed: NodeAddress, slot_map: SlotMap) -> None:
        self.seed = seed
        self.endpoint: Endpoint = (seed.host or "127.0.0.1", seed.port or 6379)
        self.map = slot_map
        # Owners learned from MOVED since the map was read, by slot.
        self.moved_to: dict[int, Endpoint] = {}
        # A MOVED named a master the map does not have: the map is read again before the
        # next round (by the transport), and until then that slot's commands fail.
        self.stale = False
        self._tags: dict[Endpoint, str] = {}
        self._members: dict[Endpoint, NodeAddress] = {}
        self.read_at = time.monotonic()
        # When a member last answered MOVED or ASK (time.monotonic; see REDIRECT_WATCH).
        self.redirected_at = float("-inf")
        self._learn_tags()

    def _learn_tags(self) -> None:
        self._tags = {shard.master: marker_tag(shard) for shard in self.map.shards}

    def read(self, timeout: float) -> SlotMap:
        """The slot map as the seed member gives it now, or when it does not answer (a master
        that died, say) the first other member of the map that does (blocking, ``timeout``
        seconds per member asked).

        Raises:
            NotCluster: the seed answered as a plain server.
            NodeError: no member gave it.
        """
        from django_redlock.wire.clients import client_for

        others = [
            endpoint
            for shard in self.map.shards
            for endpoint in (shard.master, *shard.replicas)
            if endpoint != self.endpoint
        ]
        failure: Exception | None = None
        for address in (self.seed, *(self.member(endpoint) for endpoint in others)):
            try:
                with client_for(address, timeout) as client:
                    return read_map(client, address.host or self.endpoint[0])
            except redis.ResponseError as exc:
                if address is self.seed and _NOT_CLUSTER in str(exc):
                    # Not a member that lost its way: the node's own address serves a plain
                    # server now. Its other members, still a cluster perhaps, are no longer
                    # this node (a process that asked now would take it for a plain node).
                    raise NotCluster("the node's server is not a cluster member now") from None
                failure = failure or exc
            except (redis.RedisError, OSError, ValueError) as exc:
                failure = failure or exc
        raise NodeError(f"could not read the cluster's slot map: {failure}") from None

    def failed(self) -> None:
        """A connection to one of this node's shard masters failed (refused, lost, stalled):
        the map is read again before the next round, unless it was read less than
        :data:`MAP_AFTER_FAILURE` seconds ago."""
        if time.monotonic() - self.read_at >= MAP_AFTER_FAILURE:
            self.stale = True

    def refresh(self, slot_map: SlotMap) -> None:
        """Take a newly read slot map (MOVED owners learned before it are dropped)."""
        self.map = slot_map
        self.moved_to.clear()
        self.stale = False
        self.read_at = time.monotonic()
        self._learn_tags()
        remember(self.seed, slot_map)  # a connection set made later starts from this one

    def member(self, endpoint: Endpoint) -> NodeAddress:
        """The address of the member at ``endpoint``, with the seed's login and TLS."""
        address = self._members.get(endpoint)
        if address is None:
            address = self._members[endpoint] = replace(
                self.seed, host=endpoint[0], port=endpoint[1], path=None
            )
        return address

    def owner(self, slot: int | None) -> Endpoint | None:
        """The master that serves ``slot`` (None: a command with no key, for the seed), or
        None when no master does."""
        if slot is None:
            # The member the URL names when it is a master, else any master: a command
            # with no lock key reads or writes only the records of the shard it reaches.
            if self.endpoint in self._tags or not self.map.shards:
                return self.endpoint
            return self.map.shards[0].master
        return self.moved_to.get(slot) or self.map.master_of(slot)

    def tag_of(self, endpoint: Endpoint) -> str | None:
        """The hash tag of the records of the shard whose master is at ``endpoint`` (None:
        not a master of the map)."""
        return self._tags.get(endpoint)

    def redirected(self) -> None:
        """A member answered MOVED or ASK: the cluster is resharding (see
        :data:`REDIRECT_WATCH`)."""
        self.redirected_at = time.monotonic()

    def resharding(self) -> bool:
        """Whether a member answered MOVED or ASK less than :data:`REDIRECT_WATCH` seconds
        ago."""
        return time.monotonic() - self.redirected_at < REDIRECT_WATCH

    def moved(self, slot: int, endpoint: Endpoint) -> None:
        """A member answered MOVED: ``slot`` is served at ``endpoint`` from now on."""
        self.moved_to[slot] = endpoint
        if endpoint not in self._tags:
            self.stale = True

    def place(self, data: bytes) -> tuple[Endpoint, bytes, int | None]:
        """Where command ``data`` goes and its bytes there: ``(master, bytes, slot)``.

        Raises:
            NodeError: no master serves the command's slot, or the map does not know the
                master that does (read it again first).
            CrossSlot: as :func:`cluster_form`.
        """
        # Read once: the keys' cluster form gives the slot and then the shard's bytes.
        parsed = _parse(data)
        slot = None if parsed is None else _slot_of(parsed[3])
        endpoint = self.owner(slot)
        if endpoint is None:
            raise NodeError(f"no master of the cluster serves slot {slot}")
        return endpoint, self._formed(data, parsed, endpoint), slot

    def rewrite(self, data: bytes, endpoint: Endpoint) -> bytes:
        """``data`` in the form the master at ``endpoint`` runs it (see the module
        docstring).

        Raises:
            NodeError: the map does not know that master (it is read again first).
            CrossSlot: as :func:`cluster_form`.
        """
        return self._formed(data, _parse(data), endpoint)

    def _formed(self, data: bytes, parsed: _Parsed | None, endpoint: Endpoint) -> bytes:
        global _LAST_FORM
        tag = self.tag_of(endpoint)
        if tag is None:
            self.stale = True
            raise NodeError("the cluster's slot map is out of date; reading it again")
        if parsed is None:
            return data
        last = _LAST_FORM  # read once: another thread may replace it (never change it)
        if last[0] is data and last[1] == tag:
            return last[2]
        formed = _form(data, parsed, tag)
        _LAST_FORM = (data, tag, formed)
        return formed


# An EVALSHA or EVAL read once (_parse): its name (upper case), its sha or source, the
# array's length, its keys in cluster form (None for the node's own record), and the offset
# of what follows the keys.
_Parsed = tuple[bytes, bytes, int, tuple[bytes | None, ...], int]

# The last command read and the last one formed, with what came of them: a round sends one
# command (the very same bytes object) to every node, so a round over N cluster nodes reads
# it once, and forms it once for each shard tag (N clusters laid out alike share their tags).
# Matched by identity (the entry holds the bytes, so they cannot be another object's); each
# entry is one tuple, replaced whole, so a thread reads an entry of one command.
_LAST_PARSE: tuple[bytes, _Parsed | None] = (b"", None)
_LAST_FORM: tuple[bytes, str, bytes] = (b"", "", b"")


def _parse(data: bytes) -> _Parsed | None:
    """``data`` read as an EVALSHA or EVAL (see :data:`_Parsed`), or None for any other
    command."""
    global _LAST_PARSE
    last = _LAST_PARSE
    if last[0] is data:
        return last[1]
    parsed = _read_command(data)
    _LAST_PARSE = (data, parsed)
    return parsed


def _read_command(data: bytes) -> _Parsed | None:
    if not data.startswith(b"*"):
        return None
    head_end = data.index(b"\r\n")
    count = int(data[1:head_end])
    name, at = _read_bulk(data, head_end + 2)
    name = name.upper()
    if name not in (b"EVALSHA", b"EVAL"):
        return None
    script, at = _read_bulk(data, at)
    count_text, at = _read_bulk(data, at)
    tagged: list[bytes | None] = []
    for _ in range(int(count_text)):
        # _read_bulk inlined (once per key of every command placed).
        if not data.startswith(b"$", at):
            raise ValueError("not a bulk string")
        end = data.index(b"\r\n", at)
        start = end + 2
        stop = start + int(data[at + 1 : end])
        if len(data) < stop + 2:
            raise ValueError("bulk string cut short")
        key = data[start:stop]
        at = stop + 2
        tagged.append(None if key == _NODE_KEY else cluster_key_bytes(key))
    return name, script, count, tuple(tagged), at


def _slot_of(tagged: tuple[bytes | None, ...]) -> int | None:
    """The slot of the first lock key of ``tagged`` (a node's own record does not route: it
    has the form of whichever shard the command reaches); None when there is none."""
    for key in tagged:
        if key is not None:
            return key_slot(key)
    return None


def command_slot(data: bytes) -> int | None:
    """The slot that routes command ``data``: its first key's, in cluster form (a node's own
    record does not route: it has the form of whichever shard the command reaches); None for
    a command with no lock key."""
    parsed = _parse(data)
    return None if parsed is None else _slot_of(parsed[3])


_NODE_KEY = NODE_KEY.encode()


def cluster_form(data: bytes, tag: str) -> bytes:
    """Command ``data`` as the shard whose records carry ``tag`` runs it: the script
    variant of that shard, every key in cluster form. Anything after the keys (the
    arguments, and those the transport appends later, counted in the array header) is kept
    byte for byte. A command that is not EVALSHA or EVAL is returned as it is.

    The node's marker among the KEYS of a command that names lock keys too takes the form
    ``{<the lock's tag>}`` then NODE_KEY, in the lock's slot (a cluster refuses a command
    whose KEYS span slots), which the shard's variant reads as its own marker
    (:meth:`~django_redlock.wire.scripts.Script.for_shard`); alone, it is the shard's marker
    itself.

    Raises:
        NodeError: an EVALSHA of a script this process never loaded.
        CrossSlot: the command's lock keys are in more than one slot (a multi-lock over
            names without one hash tag): a cluster could not run it.
    """
    parsed = _parse(data)
    return data if parsed is None else _form(data, parsed, tag)


def _form(data: bytes, parsed: _Parsed, tag: str) -> bytes:
    """:func:`cluster_form` of ``data``, read already (``parsed``)."""
    name, script_field, count, tagged, at = parsed
    if name == b"EVALSHA":
        script = SCRIPTS_BY_SHA.get(script_field)
        if script is None:
            raise NodeError(f"unknown script {script_field.decode(errors='replace')}")
        body = script.for_shard(tag).sha
    else:
        script = Script(script_field.decode(), register=False)
        # The loaded script of that text, whose variants know how a cluster sends it.
        script = SCRIPTS_BY_SHA.get(script.sha, script)
        body = script.for_shard(tag).source
    count_text = b"%d" % len(tagged)
    if script.cluster_keys and tagged and tagged[0] is not None:
        # Declared too (Script.cluster_keys); the script still reads only KEYS[1].
        first = tagged[0]
        tagged = (*tagged, *(first + suffix.encode() for suffix in script.cluster_keys))
        count += len(script.cluster_keys)
        count_text = b"%d" % len(tagged)
    lock_tag = _lock_tag([key for key in tagged if key is not None])
    marker = (
        _NODE_KEY + b"{" + tag.encode() + b"}"
        if lock_tag is None
        else b"{" + lock_tag + b"}" + _NODE_KEY
    )
    keys = [
        b"$%d\r\n%s\r\n" % (len(key), key) if key is not None else _bulk(marker) for key in tagged
    ]
    if script.cluster_one_key and len(keys) > 1:
        # The first key declared; the others, after their count, lead the arguments
        # (Script.cluster_one_key: the shard variant reads them as keys again).
        more = len(keys) - 1
        count += 1
        count_text = b"1"
        keys = [keys[0], _bulk(b"%d" % more), *keys[1:]]
    return b"".join(
        (
            b"*%d\r\n" % count,
            _bulk(name),
            _bulk(body),
            _bulk(count_text),
            *keys,
            data[at:],
        )
    )


def _lock_tag(keys: list[bytes]) -> bytes | None:
    """:func:`_one_tag` of ``keys``, found without hashing when every key starts with the
    first one's tag in braces (a lock's keys, wrapped by cluster_key: the usual command)."""
    if keys:
        first = keys[0]
        end = first.find(b"}")
        if end > 1 and first.startswith(b"{"):
            head = first[: end + 1]
            for key in keys:
                if not key.startswith(head):
                    return _one_tag(keys)
            return first[1:end]
    return _one_tag(keys)


def _one_tag(keys: list[bytes]) -> bytes | None:
    """The hash tag every key of ``keys`` (in cluster form: each has one) shares, or None
    when there is no key.

    Raises:
        CrossSlot: keys of more than one slot (two tags that hash alike share one).
    """
    # One key per tag: derived keys (a lock's line, a semaphore's slots) share their lock's
    # tag, so a command of one lock hashes one key, not all of them.
    by_tag = {hash_tag(key) or key: key for key in keys}
    if not by_tag:
        return None
    if len(by_tag) > 1 and len({key_slot(key) for key in by_tag.values()}) > 1:
        raise CrossSlot(cross_slot_message(keys))
    return next(iter(by_tag))
