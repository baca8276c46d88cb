"""Redis/Valkey Cluster arithmetic, with no I/O: key slots, the lock keys on a cluster node,
the slot map, and ``MOVED``/``ASK`` redirections.

A cluster spreads keys over 16384 slots by ``CRC16(key) mod 16384`` (the XMODEM CRC), hashing
only the hash tag when the key has one: the text between its first ``{`` and the first ``}``
after it, if not empty (the Redis Cluster specification, "Hash tags"). A script may only touch
keys of one slot (CROSSSLOT otherwise) that its shard owns, so on a cluster node every key of
one lock must share a slot: :func:`cluster_key` gives a lock key a hash tag, and every key a
script derives from it (by a suffix after a NUL byte, see ``scripts/*.lua``) keeps that tag.

The slot map says which shard's master serves each slot (:func:`parse_shards` reads
``CLUSTER SHARDS``, Redis >= 7 and Valkey; :func:`parse_slots` reads ``CLUSTER SLOTS``, the
older form); :func:`parse_redirect` reads the error a member answers for a slot it does not
serve.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "SLOTS",
    "Redirect",
    "Shard",
    "SlotMap",
    "cluster_key",
    "cluster_key_bytes",
    "cross_slot_message",
    "hash_tag",
    "key_slot",
    "lock_slots",
    "parse_redirect",
    "parse_shards",
    "parse_slots",
]

SLOTS = 16384
"""How many hash slots a cluster has (fixed by the protocol)."""


def _crc16_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16 = _crc16_table()


def _crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as the cluster computes it."""
    crc = 0
    table = _CRC16
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[((crc >> 8) ^ byte) & 0xFF]
    return crc


def hash_tag(key: bytes) -> bytes | None:
    """The hash tag of ``key``: the bytes between its first ``{`` and the first ``}`` after
    it, or None when there is no such pair or it encloses nothing (the whole key is hashed)."""
    start = key.find(b"{")
    if start < 0:
        return None
    end = key.find(b"}", start + 1)
    if end <= start + 1:  # no closing brace, or "{}": no tag
        return None
    return key[start + 1 : end]


def key_slot(key: bytes | str) -> int:
    """The slot (0..16383) of ``key``, as ``CLUSTER KEYSLOT`` answers (a ``str`` is UTF-8)."""
    data = key.encode() if isinstance(key, str) else key
    tag = hash_tag(data)
    return _crc16(data if tag is None else tag) % SLOTS


def cluster_key(key: str) -> str:
    """The form of lock key ``key`` (or of a key a script derives from it) on a cluster node:
    every key of one lock in one slot.

    A lock key is the key prefix and the name; the keys of the same lock add a suffix that
    starts with a NUL byte (names hold no control character). The part before the first NUL,
    the base, decides the slot:

    - a base that has a hash tag already (a ``{…}`` in the name, or in ``KEY_PREFIX``) is
      kept as it is: the user chose which locks share a slot (``lock_many`` needs it);
    - any other base is wrapped in braces, ``{<base>}``: the lock's whole base is its tag.

    The suffix never changes the tag (it comes after the base's first ``{…}``), so every key
    of one lock lands in the slot of its base. A key that starts with NUL (a node-wide record,
    not a lock's key) is returned as it is.

    Two bases can meet only when one is another wrapped, ``{x}`` and ``x``: possible with an
    empty ``KEY_PREFIX`` only. They are then one lock on cluster nodes (a false conflict,
    never two holders of one key).
    """
    cut = key.find("\x00")
    base, rest = (key, "") if cut < 0 else (key[:cut], key[cut:])
    if not base or hash_tag(base.encode()) is not None:
        return key
    return "{" + base + "}" + rest


def cluster_key_bytes(key: bytes) -> bytes:
    """:func:`cluster_key` of ``key`` as bytes (UTF-8, as a command carries it), without
    decoding it: the rule reads ASCII bytes only (NUL, the braces)."""
    cut = key.find(b"\x00")
    base, rest = (key, b"") if cut < 0 else (key[:cut], key[cut:])
    if not base or hash_tag(base) is not None:
        return key
    return b"{" + base + b"}" + rest


def lock_slots(keys: Sequence[str]) -> dict[int, list[str]]:
    """The lock keys ``keys`` by the slot each takes on a cluster node (its cluster form's),
    in slot order; each key's list keeps the order of ``keys``."""
    slots: dict[int, list[str]] = {}
    for key in keys:
        slots.setdefault(key_slot(cluster_key(key)), []).append(key)
    return dict(sorted(slots.items()))


def cross_slot_message(keys: Sequence[str] | Sequence[bytes]) -> str:
    """Why the lock keys ``keys`` (plain or in cluster form: the slot is the same) cannot be
    taken together on a cluster node, naming their slots and the hash-tag fix."""
    texts = [key.decode("utf-8", "replace") if isinstance(key, bytes) else key for key in keys]
    # A command's keys include those derived from each lock key (its line, after a NUL).
    slots = lock_slots([key for key in texts if "\x00" not in key] or texts)
    shown = "; ".join(
        f"slot {slot}: {', '.join(repr(key) for key in found[:3])}"
        + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        for slot, found in list(slots.items())[:5]
    )
    more = f"; and {len(slots) - 5} more slots" if len(slots) > 5 else ""
    return (
        f"the locks are in {len(slots)} slots of a cluster node ({shown}{more}), and a "
        "cluster runs one script on the keys of one slot only: give the names one hash "
        "tag, the same text in braces, e.g. '{order-42}:items' and '{order-42}:invoice'"
    )


@dataclass(frozen=True)
class Redirect:
    """A member's ``MOVED`` or ``ASK`` answer: ``slot`` is served at ``host``:``port``.

    ``host`` is None when the member left it empty (it does not know its own address, as a
    member with no ``cluster-announce-hostname`` behind some proxies): the host the client
    asked, then. ``ask``: only this one command goes there, after ``ASKING`` (a slot being
    migrated); otherwise the slot has moved for good and the map is stale.
    """

    ask: bool
    slot: int
    host: str | None
    port: int


def parse_redirect(message: str) -> Redirect | None:
    """The redirection in an error reply's text (``MOVED 3999 127.0.0.1:6381``, ``ASK 3999
    [::1]:6381``), or None when the error is not one (or is malformed)."""
    parts = message.split()
    if len(parts) != 3 or parts[0] not in ("MOVED", "ASK"):
        return None
    host, colon, port = parts[2].rpartition(":")
    if not colon or not port.isdigit() or not parts[1].isdigit():
        return None
    slot = int(parts[1])
    if slot >= SLOTS:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return Redirect(parts[0] == "ASK", slot, host or None, int(port))


@dataclass(frozen=True)
class Shard:
    """One shard: its master's address, its replicas' addresses, and the slot ranges it
    serves (inclusive ``(low, high)`` pairs)."""

    master: tuple[str, int]
    replicas: tuple[tuple[str, int], ...] = ()
    ranges: tuple[tuple[int, int], ...] = ()
    node_id: str = ""


@dataclass(frozen=True)
class SlotMap:
    """Which shard serves each slot.

    Built by :meth:`of` from the shards; :meth:`shard_of` finds a slot's shard with a binary
    search over the ranges' starts (a few microseconds; no 16384-entry table per node).
    A slot no shard serves (a cluster not fully covered) has no shard.
    """

    shards: tuple[Shard, ...]
    _starts: tuple[int, ...] = field(default=(), repr=False, compare=False)
    _ends: tuple[tuple[int, int], ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def of(cls, shards: Sequence[Shard]) -> SlotMap:
        """The map of ``shards``.

        Raises:
            ValueError: a range outside 0..16383, reversed, or overlapping another.
        """
        ranges = sorted(
            (low, high, index) for index, shard in enumerate(shards) for low, high in shard.ranges
        )
        # Each range with the next one (None after the last; no range at all: an empty map,
        # which a transport starts from when it reads the map itself, see shards_reply_map).
        for (low, high, _), after in zip(ranges, [*ranges[1:], None][: len(ranges)], strict=True):
            if not 0 <= low <= high < SLOTS:
                raise ValueError(f"slot range {low}-{high} is not within 0..{SLOTS - 1}")
            if after is not None and after[0] <= high:
                raise ValueError(f"slot ranges {low}-{high} and {after[0]}-{after[1]} overlap")
        return cls(
            tuple(shards),
            tuple(low for low, _, _ in ranges),
            tuple((high, index) for _, high, index in ranges),
        )

    def shard_of(self, slot: int) -> Shard | None:
        """The shard serving ``slot``, or None if none does."""
        at = bisect.bisect_right(self._starts, slot) - 1
        if at < 0:
            return None
        high, index = self._ends[at]
        return self.shards[index] if slot <= high else None

    def master_of(self, slot: int) -> tuple[str, int] | None:
        """The address of the master serving ``slot``, or None if none does."""
        shard = self.shard_of(slot)
        return None if shard is None else shard.master


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _pairs(flat: object) -> dict[str, object]:
    """A RESP2 flat list ``[name, value, name, value, …]`` (or a RESP3 map) as a dict."""
    if isinstance(flat, dict):
        return {_text(name): value for name, value in flat.items()}
    if not isinstance(flat, list | tuple) or len(flat) % 2:
        raise ValueError(f"not a list of name/value pairs: {flat!r}")
    return {_text(flat[index]): flat[index + 1] for index in range(0, len(flat), 2)}


def _member_address(member: dict[str, object], fallback_host: str) -> tuple[str, int] | None:
    # 'endpoint' is what clients are told to use (cluster-preferred-endpoint-type): an IP, a
    # hostname, or '?' when unknown; '' or '?' falls back to the ip, then to the host asked.
    port = member.get("port") or member.get("tls-port")
    if port is None:
        return None
    host = _text(member.get("endpoint") or "")
    if host in ("", "?"):
        host = _text(member.get("ip") or "") or fallback_host
    return host, int(_text(port))


def parse_shards(reply: object, asked_host: str) -> SlotMap:
    """The slot map in a ``CLUSTER SHARDS`` reply (Redis >= 7, Valkey).

    ``asked_host``: the host of the member asked, for one that does not know its address.
    A shard without a master online (its master failed, no replica promoted yet) is left out
    (its slots have no owner until the cluster promotes one), as are shards serving no slot.

    Raises:
        ValueError: the reply is not of that shape.
    """
    if not isinstance(reply, list | tuple):
        raise ValueError(f"CLUSTER SHARDS: expected a list, got {reply!r}")
    shards = []
    for entry in reply:
        fields = _pairs(entry)
        flat = [int(_text(bound)) for bound in fields.get("slots") or ()]  # type: ignore[attr-defined]
        ranges = tuple((flat[index], flat[index + 1]) for index in range(0, len(flat) - 1, 2))
        master: tuple[str, int] | None = None
        node_id = ""
        replicas = []
        for raw in fields.get("nodes") or ():  # type: ignore[attr-defined]
            member = _pairs(raw)
            address = _member_address(member, asked_host)
            if address is None or _text(member.get("health") or "online") != "online":
                continue
            if _text(member.get("role")) == "master":
                master, node_id = address, _text(member.get("id") or "")
            else:
                replicas.append(address)
        if master is not None and ranges:
            shards.append(Shard(master, tuple(replicas), ranges, node_id))
    return SlotMap.of(shards)


def parse_slots(reply: object, asked_host: str) -> SlotMap:
    """The slot map in a ``CLUSTER SLOTS`` reply (every server version with cluster mode):
    ``[[low, high, [host, port, id, …], [replica…]…]…]``; ranges of one master are merged
    into one shard.

    Raises:
        ValueError: the reply is not of that shape.
    """
    if not isinstance(reply, list | tuple):
        raise ValueError(f"CLUSTER SLOTS: expected a list, got {reply!r}")
    by_master: dict[tuple[str, int], tuple[list[tuple[int, int]], list[tuple[str, int]], str]] = {}
    for entry in reply:
        if not isinstance(entry, list | tuple) or len(entry) < 3:
            raise ValueError(f"CLUSTER SLOTS: bad entry {entry!r}")
        low, high = int(_text(entry[0])), int(_text(entry[1]))
        members = []
        for raw in entry[2:]:
            host = _text(raw[0]) if raw[0] not in (None, b"", "", b"?", "?") else asked_host
            members.append(((host, int(_text(raw[1]))), _text(raw[2]) if len(raw) > 2 else ""))
        (master, node_id), replicas = members[0], [address for address, _ in members[1:]]
        ranges, known, _ = by_master.setdefault(master, ([], [], node_id))
        ranges.append((low, high))
        known.extend(address for address in replicas if address not in known)
    return SlotMap.of(
        [
            Shard(master, tuple(replicas), tuple(sorted(ranges)), node_id)
            for master, (ranges, replicas, node_id) in by_master.items()
        ]
    )


_TAG_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
_SLOT_TAGS: dict[int, str] = {}


def _base36(number: int) -> str:
    digits = ""
    while True:
        number, digit = divmod(number, 36)
        digits = _TAG_ALPHABET[digit] + digits
        if not number:
            return digits


def slot_tag(slot: int) -> str:
    """The canonical hash tag of ``slot``: the first of ``0``, ``1``, …, ``z``, ``10``, …
    (the numbers 0, 1, 2… in base 36) whose slot it is. Every client computes the same one,
    so every client names a shard's records alike (see :func:`marker_tag`). Found by trying
    them in turn (some 16,000 tries, milliseconds) once per slot and process.

    Raises:
        ValueError: ``slot`` is not in 0..16383.
    """
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot must be in 0..{SLOTS - 1}, not {slot!r}")
    tag = _SLOT_TAGS.get(slot)
    if tag is None:
        number = 0
        while _crc16(_base36(number).encode()) % SLOTS != slot:
            number += 1
        tag = _SLOT_TAGS[slot] = _base36(number)
    return tag


def marker_tag(shard: Shard) -> str:
    """The hash tag of ``shard``'s own records (the restart marker, owner records): the
    canonical tag of the lowest slot it serves, so they live on the shard they describe (a
    script may read keys of any slot its shard serves, not of another shard's).

    A shard's lowest slot changes only when resharding moves it away; its records then move
    with that slot, and the shard's new records start empty: the restart rule judges it
    afresh (it votes when its process has been up for the quarantine, or when declared
    fresh again), which is never less safe.
    """
    return slot_tag(min(low for low, _ in shard.ranges))
