"""``wire/cluster.py`` against the servers themselves: the key slot as ``CLUSTER KEYSLOT``
computes it, the lock keys of one lock in one slot, the slot map as both commands give it,
and the redirections the members really send."""

from __future__ import annotations

import random

import pytest
import redis

from django_redlock.localshards import LocalShardedNode
from django_redlock.wire.cluster import (
    SLOTS,
    Redirect,
    Shard,
    SlotMap,
    cluster_key,
    cluster_key_bytes,
    hash_tag,
    key_slot,
    parse_redirect,
    parse_shards,
    parse_slots,
)
from django_redlock.wire.primitives import READER_OWNERS, SEMAPHORE, slot_key
from django_redlock.wire.scripts import GONE, LAPSE, LINE, NODE_STATE, READERS


def _keys(count: int) -> list[bytes]:
    """Keys a user could make, and the edge cases of hash tags: braces in every place,
    empty tags, non-ASCII text, NUL-suffixed derived keys."""
    rng = random.Random(42)
    alphabet = "ab{}:\x00é中 -_0123456789"
    keys = [
        b"",
        b"{",
        b"}",
        b"{}",
        b"{}{a}",
        b"{a}{b}",
        b"a{b}c",
        b"a{{b}}",
        b"a{}b{c}",
        b"redlock:orders:42",
        "redlock:{tenant-é}:x".encode(),
        b"123456789",  # the CRC16/XMODEM check value's input
    ]
    for _ in range(count):
        length = rng.randrange(1, 24)
        keys.append("".join(rng.choice(alphabet) for _ in range(length)).encode())
    return keys


def test_key_slot_is_the_servers_keyslot_on_many_keys(sharded3: list[LocalShardedNode]) -> None:
    keys = _keys(2000)
    with sharded3[0].client(sharded3[0].masters[0]) as client:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.execute_command("CLUSTER", "KEYSLOT", key)
        expected = pipe.execute()
    mismatched = [
        (key, key_slot(key), want)
        for key, want in zip(keys, expected, strict=True)
        if key_slot(key) != want
    ]
    assert mismatched == []
    assert key_slot(b"123456789") == 0x31C3 % SLOTS  # the XMODEM check value


def test_hash_tag_rules() -> None:
    assert hash_tag(b"a{b}c") == b"b"
    assert hash_tag(b"{}{a}") is None  # the first { meets } at once: no tag
    assert hash_tag(b"a{{b}}") == b"{b"
    assert hash_tag(b"a{b") is None
    assert hash_tag(b"plain") is None
    assert key_slot("é") == key_slot("é".encode())


_SUFFIXES = [LINE, LAPSE, READERS, GONE + "0" * 40, READER_OWNERS, SEMAPHORE + LINE, "\x00h"]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("redlock:orders:42", "{redlock:orders:42}"),
        ("redlock:{tenant}:42", "redlock:{tenant}:42"),  # the user's tag is kept
        ("{app}redlock:x", "{app}redlock:x"),  # a tag in KEY_PREFIX too
        ("redlock:a{}b", "{redlock:a{}b}"),  # an empty tag is no tag
        ("redlock:a{b", "{redlock:a{b}"),
        ("redlock:a}b", "{redlock:a}b}"),
        ("redlock:x\x00q", "{redlock:x}\x00q"),  # a derived key keeps its lock's tag
        ("\x00django_redlock:node", "\x00django_redlock:node"),  # not a lock key
    ],
)
def test_cluster_key(key: str, expected: str) -> None:
    assert cluster_key(key) == expected
    assert cluster_key(cluster_key(key)) == cluster_key(key)  # applied twice: the same


def test_cluster_key_bytes_is_cluster_key_on_many_keys() -> None:
    """The transport tags a command's keys as bytes (without decoding them): the same keys
    as :func:`cluster_key` makes of their text (keys are UTF-8 text), on every edge case of
    ``_keys`` and their NUL-suffixed forms."""
    for key in _keys(2000):
        for form in (key, key + b"\x00q", b"\x00" + key):
            assert cluster_key_bytes(form) == cluster_key(form.decode()).encode()


def test_every_key_of_a_lock_shares_its_slot_on_the_server(
    sharded3: list[LocalShardedNode],
) -> None:
    """Hundreds of names, with every suffix the scripts derive: one slot per lock, as the
    server computes it, and one command naming all of a lock's keys is not CROSSSLOT."""
    node = sharded3[0]
    names = [f"redlock:name-{index}" for index in range(300)] + [
        "redlock:{t}:1",
        "redlock:a{}b",
        "redlock:é中",
    ]
    for name in names:
        base = cluster_key(name)
        derived = [cluster_key(name + suffix) for suffix in _SUFFIXES]
        derived += [cluster_key(slot_key(name, slot)) for slot in (0, 7)]
        slot = key_slot(base)
        assert {key_slot(key) for key in derived} == {slot}
        owner = node.owner_of(slot)
        with node.client(owner) as client:
            assert client.exists(base, *derived) == 0  # served here, one slot: no error
        assert key_slot(name) == slot or "{" in name  # untagged names keep their own slot


def test_slot_map_from_both_commands_agrees(sharded3: list[LocalShardedNode]) -> None:
    node = sharded3[1]
    with node.client(node.masters[2]) as client:
        shards = parse_shards(client.execute_command("CLUSTER", "SHARDS"), "127.0.0.1")
        slots = parse_slots(client.execute_command("CLUSTER", "SLOTS"), "127.0.0.1")
    for slot in range(0, SLOTS, 97):
        expected = ("127.0.0.1", node.owner_of(slot).port)
        assert shards.master_of(slot) == expected
        assert slots.master_of(slot) == expected


def test_redirects_the_members_send_are_parsed(sharded3: list[LocalShardedNode]) -> None:
    node = sharded3[2]
    key = "redlock:moved-probe"
    slot = key_slot(key)
    owner = node.owner_of(slot)
    other = next(master for master in node.masters if master is not owner)
    with node.client(other) as client, pytest.raises(redis.ResponseError) as moved:
        client.get(key)
    # redis-py keeps the error text after its first word for MOVED: rebuild it as sent.
    text = str(moved.value)
    message = text if text.startswith("MOVED") else f"MOVED {text}"
    assert owner.port is not None
    assert parse_redirect(message) == Redirect(False, slot, "127.0.0.1", owner.port)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("MOVED 3999 127.0.0.1:6381", Redirect(False, 3999, "127.0.0.1", 6381)),
        ("ASK 3999 127.0.0.1:6381", Redirect(True, 3999, "127.0.0.1", 6381)),
        ("MOVED 1 :6380", Redirect(False, 1, None, 6380)),  # the member knows no host
        ("MOVED 1 ::1:6380", Redirect(False, 1, "::1", 6380)),
        ("MOVED 1 [::1]:6380", Redirect(False, 1, "::1", 6380)),
        ("MOVED 1 cache.example.com:6379", Redirect(False, 1, "cache.example.com", 6379)),
        ("MOVED 16384 h:1", None),
        ("MOVED x h:1", None),
        ("MOVED 1 h", None),
        ("CROSSSLOT Keys in request don't hash to the same slot", None),
        ("ERR something", None),
    ],
)
def test_parse_redirect(message: str, expected: Redirect | None) -> None:
    assert parse_redirect(message) == expected


def test_slot_map_refuses_overlaps_and_finds_gaps() -> None:
    a = Shard(("h", 1), ranges=((0, 99), (200, 299)))
    b = Shard(("h", 2), ranges=((100, 150),))
    slot_map = SlotMap.of([a, b])
    assert slot_map.master_of(0) == ("h", 1)
    assert slot_map.master_of(150) == ("h", 2)
    assert slot_map.master_of(151) is None  # nobody serves it
    assert slot_map.master_of(299) == ("h", 1)
    assert slot_map.master_of(300) is None
    with pytest.raises(ValueError, match="overlap"):
        SlotMap.of([a, Shard(("h", 3), ranges=((50, 60),))])
    with pytest.raises(ValueError, match="within"):
        SlotMap.of([Shard(("h", 3), ranges=((0, SLOTS),))])


def test_an_empty_slot_map_serves_no_slot() -> None:
    """What a transport starts from when it reads the map itself (a cluster without CLUSTER
    SHARDS, before Redis 7: shards_reply_map)."""
    empty = SlotMap.of([])
    assert empty.shards == ()
    assert empty.master_of(0) is None


def test_cluster_form_of_a_command() -> None:
    """An acquire as a shard runs it: the shard's variant of the script (its own marker and
    owner records), the key tagged, every argument byte for byte; its EVAL fallback too."""
    from django_redlock.wire.cluster_route import cluster_form, command_slot
    from django_redlock.wire.scripts import ACQUIRE, acquire_command

    command, fallback = acquire_command("redlock:x", "a" * 40, 1000, "own er", 60_000)
    tag = "1bz"
    variant = ACQUIRE.for_shard(tag)
    formed = cluster_form(command, tag)
    assert variant.sha in formed
    assert ACQUIRE.sha not in formed
    # The lock key, then the keys the acquire reads that the cluster must see declared
    # (a split migration is refused: TRYAGAIN), all in the lock's slot.
    declared = b"".join(
        b"$%d\r\n%s\r\n" % (len(key), key)
        for key in (b"{redlock:x}", b"{redlock:x}\x00q", b"{redlock:x}\x00e", b"{redlock:x}\x00r")
    )
    assert b"$1\r\n4\r\n" + declared + b"$40\r\n" + b"a" * 40 in formed
    assert formed.endswith(command[command.index(b"$40\r\n" + b"a" * 40) :])
    assert formed.startswith(b"*17\r\n")
    assert command.startswith(b"*14\r\n")  # three more arguments, the identity's counted
    assert command_slot(command) == key_slot("{redlock:x}")
    evaled = cluster_form(fallback.build() if fallback else b"", tag)
    assert variant.source in evaled
    assert b"'\\0django_redlock:node{1bz}'" in variant.source
    assert b"'\\0django_redlock:node'" not in variant.source
    assert cluster_form(b"*1\r\n$4\r\nPING\r\n", tag) == b"*1\r\n$4\r\nPING\r\n"


def test_cluster_form_names_the_marker_in_the_locks_slot() -> None:
    """A command that takes the node's marker among its KEYS (a semaphore's acquire) names it
    in the lock's slot, so that its KEYS share one (the cluster refuses them otherwise); the
    shard's variant of the script reads its own marker there. Lock keys of several slots in
    one command (a multi-lock without one hash tag) are never sent: CrossSlot names them."""
    from django_redlock.wire.cluster_route import CrossSlot, cluster_form
    from django_redlock.wire.primitives import (
        SEMAPHORE_ACQUIRE,
        acquire_many_command,
        semaphore_acquire_command,
    )
    from django_redlock.wire.scripts import NODE_KEY

    command, _ = semaphore_acquire_command("redlock:s", 2, "a" * 40, 1000, "o", 60_000)
    formed = cluster_form(command, "1bz")
    marker = ("{redlock:s}" + NODE_KEY).encode()
    assert b"$%d\r\n%s\r\n" % (len(marker), marker) in formed
    assert key_slot(marker) == key_slot("{redlock:s}\x00s0")
    variant = SEMAPHORE_ACQUIRE.for_shard("1bz")
    assert variant.sha in formed
    assert variant.source.startswith(b"local KEYS = KEYS\n")
    assert b"'\\0django_redlock:node{1bz}'" in variant.source
    alone = cluster_form(NODE_STATE.evalsha((NODE_KEY,), (1, "")), "1bz")
    assert b"\x00django_redlock:node{1bz}\r\n" in alone
    tagged, _ = acquire_many_command(["redlock:{t}a", "redlock:{t}b"], "a" * 40, 1000, "o", 1)
    assert b"$%d\r\n{t}%s\r\n" % (3 + len(NODE_KEY), NODE_KEY.encode()) in cluster_form(
        tagged, "1bz"
    )
    spread, _ = acquire_many_command(["redlock:a", "redlock:b"], "a" * 40, 1000, "o", 1)
    with pytest.raises(CrossSlot, match=r"slot 3573: '\{redlock:a\}'.*hash tag"):
        cluster_form(spread, "1bz")


def test_cluster_form_of_a_renewal_declares_the_lock_key_alone() -> None:
    """A renewal on a cluster node declares the lock key alone (the server then sends it
    where that key is during a migration); its readers' key leads the arguments, after its
    count, in the EVALSHA and in its EVAL fallback, and the shard's variant reads them as the
    plain script's KEYS and ARGV."""
    from django_redlock.wire.cluster_route import cluster_form
    from django_redlock.wire.scripts import EXTEND, extend_command

    command, fallback = extend_command("redlock:x", "a" * 40, 1000, "own")
    assert command.startswith(b"*8\r\n")
    tail = b"$1\r\n1\r\n$11\r\n{redlock:x}\r\n$1\r\n1\r\n$13\r\n{redlock:x}\x00r\r\n$40\r\n"
    formed = cluster_form(command, "0")
    assert formed.startswith(b"*9\r\n")
    assert EXTEND.for_shard("0").sha + b"\r\n" + tail in formed
    evaled = cluster_form(fallback.build() if fallback else b"", "0")
    assert EXTEND.for_shard("0").source + b"\r\n" + tail in evaled
    assert EXTEND.for_shard("0").source.startswith(b"local KEYS, ARGV = KEYS, ARGV\n")
