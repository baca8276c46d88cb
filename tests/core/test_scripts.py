"""The Lua scripts, called directly on one real node, and the wire encoding around them."""

from __future__ import annotations

import json
import time
from typing import Any

import hiredis
import pytest

from django_redlock import redlock
from django_redlock.core.witness import VOTERS_KEY
from django_redlock.wire import scripts
from django_redlock.wire.resp import PythonReader, ReplyError, encode_command
from django_redlock.wire.setup import UNIDENTIFIED
from tests.helpers import OWNER, lock_token, node_client, node_identity, owner_arg, owner_record


@pytest.fixture
def node(cluster3):
    with node_client(cluster3[0]) as client:
        yield client


def acquire(
    client,
    key,
    token,
    ttl_ms=10_000,
    owner=OWNER,
    quarantine_ms=60_000,
    waiter="",
    ticket=0,
    run_id="",
    persistence="",
    hand_round=0,
):
    keys = (key,)  # the script names the marker, line, lapse and readers keys itself
    args = (token, ttl_ms, owner, quarantine_ms, waiter, ticket, 5_000, hand_round)
    args += (run_id, persistence)  # type: ignore[assignment]
    return client.eval(scripts.ACQUIRE.source, len(keys), *keys, *args)


def release(client, key, token, waiter=""):
    return client.eval(scripts.RELEASE.source, 1, key, token, waiter)


def test_acquire_takes_a_free_key_and_reports_the_holders_time_left(node):
    owner = owner_arg(1, 1_795_000_000_123)
    assert acquire(node, "k", "a" * 40, owner=owner) == b"OK"
    # The layout of scripts/lock_key.lua: the token, then the owner id and the time (base 36)
    # in 56 bytes at most...
    tag = owner.split()[0].encode()
    assert tag[7:] == b"mwm0nkaj"  # 1795000000123 ms
    assert node.get("k") == b"a" * 40 + b" " + tag
    assert len(node.get("k")) == 56
    assert 9_000 < node.pttl("k") <= 10_000
    # ... and the owner's record once per owner, kept at least as long as the key.
    owner_key = b"\x00o:" + tag[:7] + b":django_redlock:node"
    assert node.get(owner_key) == b'{"pid":1,"acquired_at":'
    assert node.pttl(owner_key) >= node.pttl("k")
    left = acquire(node, "k", "b" * 40)
    assert 9_000 < left <= 10_000
    assert lock_token(node, "k") == b"a" * 40


def test_acquire_with_the_same_token_renews_instead_of_refusing(node):
    assert acquire(node, "k", "a" * 40, ttl_ms=5_000) == b"OK"
    assert acquire(node, "k", "a" * 40, ttl_ms=20_000) == b"OK"
    assert node.pttl("k") > 15_000


def test_acquire_never_overwrites_foreign_keys(node):
    node.set("plain", "user data")  # a string, but not a lock (no owner after a space)
    assert acquire(node, "plain", "a" * 40) == -1  # held by someone, no expiry
    node.set("word", "x" * 40)  # not even a space: held too
    assert acquire(node, "word", "x" * 40) == -1
    node.hset("hash", "field", "x")  # a hash of someone else's, no expiry
    assert acquire(node, "hash", "a" * 40) == -1
    assert node.get("plain") == b"user data"
    assert node.get("word") == b"x" * 40
    assert node.hgetall("hash") == {b"field": b"x"}


def test_an_owner_argument_of_another_shape_is_refused_before_anything_is_written(node):
    with pytest.raises(Exception, match="owner argument"):
        acquire(node, "k", "a" * 40, owner='{"pid":1}')
    assert node.exists("k") == 0


def test_listing_reads_owner_and_time_left_of_many_keys_and_never_the_token(node):
    assert acquire(node, "held", "a" * 40, ttl_ms=10_000, owner=owner_arg(1)) == b"OK"
    node.set("plain", "user data")  # a user's string under our prefix: no owner, not an error
    node.hset("forever", "o", '{"pid":2}')  # an old-layout lock (a hash), no expiry
    keys = ("held", "gone", "plain", "forever")
    reply = node.eval(scripts.LISTING.source, len(keys), *keys)
    assert reply[0] == owner_record(1)  # its owner (the time to the ms)
    assert 9_000 < reply[1] <= 10_000
    assert reply[2:] == [None, -2, None, -1, b'{"pid":2}', -1]
    assert b"a" * 40 not in reply
    assert node.get("plain") == b"user data"  # read-only


def test_release_deletes_only_its_own_token(node):
    acquire(node, "k", "a" * 40)
    assert release(node, "k", "b" * 40) == 0
    assert node.exists("k") == 1
    assert release(node, "k", "a" * 40) == 1
    assert node.exists("k") == 0
    assert release(node, "k", "a" * 40) == 0


def extend(node, key: str, token: str, ttl_ms: int, owner: str = OWNER) -> Any:
    return node.eval(scripts.EXTEND.source, 2, key, key + "\x00r", token, ttl_ms, owner)


def test_extend_renews_its_own_key_and_never_overwrites_another(node):
    acquire(node, "k", "a" * 40, ttl_ms=2_000)
    assert extend(node, "k", "a" * 40, 30_000) == 1
    assert node.pttl("k") > 25_000
    assert extend(node, "k", "b" * 40, 30_000) == -1  # a's, not b's
    assert lock_token(node, "k") == b"a" * 40
    node.set("user-key", "x")  # not a lock of ours: never overwritten
    assert extend(node, "user-key", "a" * 40, 30_000) == -1
    assert node.get("user-key") == b"x"


def test_extend_re_creates_a_key_the_node_lost(node):
    """Answered 2, so the client can tell a renewal from a re-creation (procedures/flow.py)."""
    acquire(node, "k", "a" * 40, ttl_ms=2_000)
    node.delete("k")  # this node lost it (a restart without data, an eviction)
    assert extend(node, "k", "a" * 40, 30_000, owner=owner_arg(9)) == 2
    assert lock_token(node, "k") == b"a" * 40
    reply = node.eval(scripts.HOLDER.source, 1, "k")
    assert reply[0] == owner_record(9)  # with its owner
    assert node.pttl("k") > 25_000
    # Live readers of the read-write lock of the same name hold it back: taken by them.
    node.delete("k")
    far = int(time.time() * 1000) + 60_000
    node.zadd("k\x00r", {"r" * 40: far})
    assert extend(node, "k", "a" * 40, 30_000) == -1
    assert node.exists("k") == 0


def test_a_lock_written_by_the_previous_layout_is_held_by_another_holder(node):
    """A rolling upgrade: a node holds hash locks (t = token, o = owner) written by the
    version before scripts/lock_key.lua. The new scripts never grant over such a key, never
    release or renew it (even with its very token), never crash on it, and still show its
    owner to operators (the hand-off: tests/core/test_primitive_scripts.py)."""
    old_token = "a" * 40
    node.hset("old", mapping={"t": old_token, "o": '{"pid":7}'})
    node.pexpire("old", 20_000)
    before = node.pttl("old")
    assert 0 < acquire(node, "old", "b" * 40) <= before  # held: its time left
    assert 0 < acquire(node, "old", old_token) <= before  # not even its own token re-enters
    assert release(node, "old", old_token) == 0
    assert extend(node, "old", old_token, 60_000) == -1
    assert node.eval(scripts.OWNS.source, 1, "old", old_token) == 0
    assert node.hgetall("old") == {b"t": old_token.encode(), b"o": b'{"pid":7}'}
    assert 0 < node.pttl("old") <= before
    reply = node.eval(scripts.HOLDER.source, 1, "old")
    assert reply[0] == b'{"pid":7}'
    assert 0 < reply[1] <= before


def test_hostile_names_are_data_not_code(cluster3):
    manager = redlock.LockManager(cluster3.urls)
    for name in ("']]; redis.call('FLUSHALL') --", "a\\\\b", "job*?[x]", "Ünï😀", "]]"):
        with manager.lock(name, ttl=5.0) as lease, node_client(cluster3[0]) as client:
            assert lock_token(client, lease.key) == lease.token.encode()
    with node_client(cluster3[0]) as client:
        # No lock key is left; only the marker, the owner's record (which expires), the
        # record of the other nodes seen voting (core/witness.py) and each waiter's gone mark
        # (which expires; scripts/hand_gone.lua), named after its lock key.
        left = [key for key in client.scan_iter() if not key.startswith(b"\x00o:")]
        marks = [key for key in left if scripts.GONE.encode() in key]
        assert len(marks) == 5
        assert all(0 < client.pttl(key) <= 60_000 for key in marks)
        rest = set(left) - set(marks)
        # The voters record is written by the vote recorder's thread, maybe not yet.
        assert scripts.NODE_KEY.encode() in rest
        assert rest <= {scripts.NODE_KEY.encode(), VOTERS_KEY.encode()}


@pytest.mark.parametrize("key", ["redlock:plain", "redlock:Ünï😀"])
def test_hot_path_encoders_match_the_generic_encoder(key):
    owner = json.dumps({"thread": "Ünï"})  # json escapes non-ASCII: stays ASCII
    token = "f" * 40
    keys = (key,)
    args = (token, 1500, owner, 60000, "w1", 123, 4000, 2)
    identity = UNIDENTIFIED  # the transport appends each connection's own
    assert (
        scripts.acquire_command(key, token, 1500, owner, 60000, "w1", 123, 4000, 2)[0] + identity
        == scripts.ACQUIRE.evalsha(keys, args, trailing=2) + identity
        == encode_command(b"EVALSHA", scripts.ACQUIRE.sha, 1, *keys, *args, "", "")
    )
    assert scripts.release_command(key, token, "w1")[0] == scripts.RELEASE.evalsha(
        (key,), (token, "w1")
    )
    assert scripts.extend_command(key, token, 7, owner)[0] == encode_command(
        b"EVALSHA", scripts.EXTEND.sha, 2, key, key + "\x00r", token, 7, owner
    )


@pytest.mark.parametrize("key", ["redlock:plain", "redlock:Ünï😀"])
def test_the_acquire_encoder_matches_the_generic_one_for_any_numbers_and_cached_ones(key):
    """The acquire's constant numbers (ttl, quarantine, line lifetime, hand-off round) are
    encoded once and cached: every value, seen first or again, and the EVAL fallback (built
    only on NOSCRIPT) still encode as the generic encoder does."""
    token = "e" * 40
    keys = (key,)
    for _ in range(2):  # the second time from the cache
        for ttl, quarantine, waiter, ticket, lifetime, hand_round in (
            (1, 0, "", 0, 0, 0),
            (10_000, 60_000, "", 1_700_000_000_123_456, 4000, 0),
            (999_999_999, 10**12, "waiter-1", 7, 1, 12),
        ):
            args = (token, ttl, "abcdefg0 {}", quarantine, waiter, ticket, lifetime, hand_round)
            command, fallback = scripts.acquire_command(key, *args)
            assert command + UNIDENTIFIED == encode_command(
                b"EVALSHA", scripts.ACQUIRE.sha, 1, *keys, *args, "", ""
            )
            assert fallback is not None
            assert fallback.build() == encode_command(
                b"EVAL", scripts.ACQUIRE.source, 1, *keys, *args, "", ""
            )


@pytest.mark.parametrize("key", ["redlock:plain", "redlock:\u00e9t\u00e9"])
def test_the_hot_commands_fallbacks_say_when_and_how_their_eval_is_sent(key):
    """The acquire's and the release's NOSCRIPT fallbacks (made without Fallback.__init__):
    an acquire's EVAL is never sent once its round is over (a late grant would be a key
    nobody releases), a release's always is (freeing our own key late is right), neither is
    eager (both scripts are preloaded), and only the holder's release takes the identity."""
    token = "f" * 40
    _, acquire = scripts.acquire_command(key, token, 10_000, "abcdefg0 {}", 60_000)
    assert acquire is not None
    assert (acquire.when_over, acquire.eager, acquire.identify) == (False, False, False)
    for identified in (False, True):
        command = scripts.release_command(key, token, "w", identified=identified)
        release = command[1]
        assert release is not None
        assert (release.when_over, release.eager, release.identify) == (True, False, identified)
        assert scripts.fire_and_forget(command) is command  # the short EVALSHA, not the source
        assert release.build() == scripts.RELEASE.eval(
            (key,), (token, "w"), trailing=2 if identified else 0
        )


def test_the_python_reader_parses_like_hiredis_even_byte_by_byte():
    wire = (
        b"+OK\r\n-ERR wrong\r\n:42\r\n:-1\r\n$5\r\nhello\r\n$-1\r\n$0\r\n\r\n"
        b"*3\r\n:1\r\n$2\r\nab\r\n*1\r\n+x\r\n*-1\r\n*0\r\n"
    )
    fast = hiredis.Reader(replyError=ReplyError)
    fast.feed(wire)
    expected = []
    while (reply := fast.gets()) is not False:
        expected.append(reply)
    slow = PythonReader()
    got = []
    for byte in wire:
        slow.feed(bytes([byte]))
        while (reply := slow.gets()) is not False:
            got.append(reply)
    assert [type(r) for r in got] == [type(r) for r in expected]
    assert [str(r) if isinstance(r, ReplyError) else r for r in got] == [
        str(r) if isinstance(r, ReplyError) else r for r in expected
    ]
    assert len(got) == 10


FOREVER = 10**12  # a quarantine no node outlives (ms)


def run_id_of(client):
    """The node's identity as a connection appends it (``tests.helpers.node_identity``)."""
    return node_identity(client)


def test_a_process_not_yet_known_is_quarantined_unless_up_long_enough(node):
    node.delete(scripts.NODE_KEY)  # as after a restart without persistence
    with pytest.raises(Exception, match=r"QUARANTINED up \d+ s, not proven durable"):
        acquire(node, "k", "a" * 40, quarantine_ms=FOREVER, persistence="appendonly no")
    # A refusal records no vote (the marker names no process: ''), only the quarantine asked
    # for (node_rule.lua: a longer one must outlive a later, shorter request): a client
    # sending less is told so.
    assert node.hget(scripts.NODE_KEY, "run") == b""
    assert node.hget(scripts.NODE_KEY, "q") == str(FOREVER).encode()
    with pytest.raises(Exception, match=rf"QUARANTINE_LONGER {FOREVER} ms"):
        acquire(node, "k", "a" * 40, quarantine_ms=0)
    node.delete(scripts.NODE_KEY)
    # Up longer than the quarantine: votes, and the marker names this process.
    assert acquire(node, "k", "a" * 40, quarantine_ms=0) == b"OK"
    assert node.hget(scripts.NODE_KEY, "run") == run_id_of(node).encode()
    assert node.hget(scripts.NODE_KEY, "why") == b"uptime"


def test_a_marker_that_names_another_process_proves_nothing(node):
    # A marker restored from a snapshot names the process that wrote it, not this one.
    node.hset(scripts.NODE_KEY, mapping={"run": "f" * 40, "q": "0", "why": "declared"})
    # A connection to this process names this process (or nothing yet), never the old one.
    for run_id in ("", run_id_of(node)):
        with pytest.raises(Exception, match="QUARANTINED"):
            acquire(node, "k", "a" * 40, quarantine_ms=FOREVER, run_id=run_id)
    # Declared fresh for this very process: votes at once, even under a long quarantine.
    node.eval(scripts.DECLARE_FRESH.source, 1, scripts.NODE_KEY, node.info("server")["run_id"])
    assert acquire(node, "k", "a" * 40, quarantine_ms=FOREVER) == b"OK"


def test_declaring_a_process_that_is_gone_declares_nothing(node):
    node.delete(scripts.NODE_KEY)
    with pytest.raises(Exception, match="RESTARTED"):
        node.eval(scripts.DECLARE_FRESH.source, 1, scripts.NODE_KEY, "0" * 40)
    assert node.exists(scripts.NODE_KEY) == 0


def test_durable_persistence_is_checked_on_the_node_itself(node):
    node.delete(scripts.NODE_KEY)
    # The client says "always", but INFO persistence on this node shows AOF off.
    with pytest.raises(Exception, match="AOF is off in INFO persistence"):
        acquire(node, "k", "a" * 40, quarantine_ms=FOREVER, persistence="always")


def test_the_longest_quarantine_any_client_sent_is_kept(node):
    run_id = run_id_of(node)
    node.eval(scripts.DECLARE_FRESH.source, 1, scripts.NODE_KEY, node.info("server")["run_id"])
    assert acquire(node, "k1", "a" * 40, quarantine_ms=9_000, run_id=run_id) == b"OK"
    # A client with a shorter quarantine is refused and told the longer one
    # (quarantine_longer.lua): it would bring only its own to a node that restarts empty.
    with pytest.raises(Exception, match=r"QUARANTINE_LONGER 9000 ms"):
        acquire(node, "k2", "a" * 40, quarantine_ms=3_000, run_id=run_id)
    assert node.exists("k2") == 0
    assert acquire(node, "k2", "a" * 40, quarantine_ms=9_000, run_id=run_id) == b"OK"
    assert node.hget(scripts.NODE_KEY, "q") == b"9000"
    # A client with a short quarantine is judged by the longest one stored.
    node.hset(scripts.NODE_KEY, "run", "f" * 40)  # as if restored into a new process
    verdict = node.eval(scripts.NODE_STATE.source, 1, scripts.NODE_KEY, 0, "appendonly no")
    assert verdict[0] in (b"votes", b"quarantined")
    assert verdict[3] == b"9000"


def test_a_free_lock_goes_to_the_head_of_the_line(node):
    acquire(node, "k", "a" * 40)  # held by a
    assert acquire(node, "k", "b" * 40, waiter="late", ticket=200) > 0  # queues
    assert acquire(node, "k", "c" * 40, waiter="early", ticket=100) > 0  # queues ahead
    release(node, "k", "a" * 40)
    assert acquire(node, "k", "d" * 40) == 0  # a single try may not jump the line
    assert acquire(node, "k", "b" * 40, waiter="late", ticket=200) == 0  # not first in line
    assert acquire(node, "k", "c" * 40, waiter="early", ticket=100) == b"OK"
    assert node.zrange("k\x00q", 0, -1) == [b"late"]
    release(node, "k", "c" * 40)
    assert node.eval(scripts.LEAVE.source, 3, "k", "k\x00q", "k\x00e", "late") == 1
    assert acquire(node, "k", "d" * 40) == b"OK"  # the line is empty again


def published_until_marker(pubsub, node, marker: str) -> list[tuple[bytes, bytes]]:
    """Every (channel, payload) published before ``marker``: pub/sub keeps the order of one
    connection's messages, so once the marker arrives nothing earlier is still in flight."""
    node.publish(marker, "end")
    seen: list[tuple[bytes, bytes]] = []
    while True:
        message = pubsub.get_message(timeout=5.0)
        assert message is not None, "the marker never arrived"
        if message["type"] != "pmessage":
            continue
        if message["channel"] == marker.encode():
            return seen
        seen.append((message["channel"], message["data"]))


def test_a_release_wakes_only_the_head_of_the_line_on_its_own_channel(node):
    acquire(node, "k", "a" * 40)
    for ticket, waiter in ((100, "aaaa.1"), (200, "bbbb.2"), (300, "cccc.3")):
        assert acquire(node, "k", "z" * 40, waiter=waiter, ticket=ticket) > 0
    pubsub = node.pubsub()
    pubsub.psubscribe("k*")
    assert pubsub.get_message(timeout=5.0)["type"] == "psubscribe"
    assert release(node, "k", "a" * 40) == 1
    # One message, to the head's listener, naming the head: the others are not woken.
    assert published_until_marker(pubsub, node, "k-marker") == [(b"k\x00waaaa", b"aaaa.1")]
    # A waiter whose place lapsed is skipped: the next live one is woken.
    node.hset("k\x00e", "aaaa.1", "0")
    acquire(node, "k", "y" * 40, waiter="bbbb.2", ticket=200)
    node.eval(scripts.FORCE_RELEASE.source, 3, "k", "k\x00q", "k\x00e")
    assert published_until_marker(pubsub, node, "k-marker") == [(b"k\x00wcccc", b"cccc.3")]
    pubsub.close()


def test_a_place_leaving_the_head_of_a_free_lock_wakes_the_next_waiter(node):
    """A waiter refused behind a place that then goes away (its acquire gave up, or its
    lease's release arrives here late) would otherwise wait for its poll: no release comes."""
    acquire(node, "k", "a" * 40)
    for ticket, waiter in ((100, "aaaa.1"), (200, "bbbb.2"), (300, "cccc.3")):
        acquire(node, "k", "z" * 40, waiter=waiter, ticket=ticket)
    pubsub = node.pubsub()
    pubsub.psubscribe("k*")
    assert pubsub.get_message(timeout=5.0)["type"] == "psubscribe"
    leave = scripts.LEAVE.source
    # Held: leaving wakes nobody (the holder's release will).
    assert node.eval(leave, 3, "k", "k\x00q", "k\x00e", "cccc.3") == 1
    assert published_until_marker(pubsub, node, "k-marker") == []
    node.delete("k")  # the holder's lease ran out here
    # A late release of the head's own (unheld) lease drops its place and wakes the next.
    assert release(node, "k", "b" * 40, waiter="aaaa.1") == 0
    assert published_until_marker(pubsub, node, "k-marker") == [(b"k\x00wbbbb", b"bbbb.2")]
    # The head giving up on a free lock wakes the next in line too (none is left here).
    acquire(node, "k", "z" * 40, waiter="dddd.4", ticket=400)
    assert node.eval(leave, 3, "k", "k\x00q", "k\x00e", "bbbb.2") == 1
    assert published_until_marker(pubsub, node, "k-marker") == [(b"k\x00wdddd", b"dddd.4")]
    pubsub.close()


def test_an_owner_record_goes_to_the_node_and_comes_back_whole(node):
    """core/owner.py's owner argument, through acquire.lua and holder.lua: the same JSON
    record as the manager builds, acquired_at to the millisecond."""
    from django_redlock.core.owner import OwnerRecords, base36

    before = time.time()
    owner = OwnerRecords("web-1").record("view orders.checkout")
    tag, record = owner.split(" ", 1)
    assert len(tag) == 15  # 7-character owner id, then the time in ms in base 36
    assert abs(int(tag[7:], 36) / 1000 - before) < 1.0
    assert base36(1_795_000_000_123) == "mwm0nkaj"
    assert acquire(node, "k", "a" * 40, owner=owner) == b"OK"
    assert len(node.get("k")) <= 56  # a size class below what 57+ bytes cost (lock_key.lua)
    shown = json.loads(node.eval(scripts.HOLDER.source, 1, "k")[0])
    assert shown == {
        **json.loads(record + "0}"),
        "acquired_at": round(int(tag[7:], 36) / 1000, 3),
    }
    assert shown["host"] == "web-1"
    assert shown["origin"] == "view orders.checkout"
    # Another lock of the same owner shares its record: one owner key for both.
    assert acquire(node, "k2", "b" * 40, owner=owner) == b"OK"
    owners = list(node.scan_iter(match="\x00o:*"))
    assert len(owners) == 1


def test_the_owner_records_time_is_each_acquires_own_millisecond(monkeypatch):
    """Records made in one millisecond share its base-36 text (kept from the last one);
    the next millisecond gets its own: a kept text never outlives its millisecond."""
    from django_redlock.core.owner import OwnerRecords, base36

    times = iter([1_795_000_000.1231, 1_795_000_000.1234, 1_795_000_000.1241, 1_795_000_000.1231])
    monkeypatch.setattr(time, "time", lambda: next(times))  # the module owner.py reads
    records = OwnerRecords("web-1")
    stamps = [records.record(None).split(" ", 1)[0][7:] for _ in range(4)]
    assert stamps == [
        base36(ms)
        for ms in (1_795_000_000_123, 1_795_000_000_123, 1_795_000_000_124, 1_795_000_000_123)
    ]


def test_a_full_node_still_renews_a_lock_whose_owner_record_it_cannot_write(node):
    """A renewal on a node out of memory (maxmemory, noeviction) renews the lock even when
    the owner's record must be written again: the script writes the lock's expiry first, and a
    node lets a script that has written go on (it refuses only a first write needing memory)."""
    owner = owner_arg(1)
    acquire(node, "k", "a" * 40, ttl_ms=2_000, owner=owner)
    node.delete(b"\x00o:" + owner[:7].encode() + b":django_redlock:node")  # e.g. deleted
    node.config_set("maxmemory-policy", "noeviction")
    node.config_set("maxmemory", "1")  # every write that needs memory is refused
    try:
        assert extend(node, "k", "a" * 40, 30_000, owner=owner) == 1
    finally:
        node.config_set("maxmemory", "0")
    assert node.pttl("k") > 25_000
