"""The fast paths of acquire.lua and release.lua (issue 25), on one real node: they write what
the full rules write, and every case they do not prove harmless falls through to those rules.

The acquire's fast path runs only when the connection names the process the marker names
(ARGV[9]) and the marker's quarantine is the caller's, so these tests send the node's real
run_id, as the transport does; the older tests in test_scripts.py mostly send none.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_redlock.wire import scripts
from tests.helpers import OWNER, lock_token, node_client, node_identity, owner_arg

QUARANTINE_MS = 60_000


@pytest.fixture
def node(cluster3):
    with node_client(cluster3[0]) as client:
        run_id = client.info("server")["run_id"]
        client.eval(scripts.DECLARE_FRESH.source, 1, scripts.NODE_KEY, run_id)
        client.hset(scripts.NODE_KEY, "q", QUARANTINE_MS)
        yield client


def run_id_of(client: Any) -> str:
    """The node's identity as a connection appends it (``tests.helpers.node_identity``)."""
    return node_identity(client)


def acquire(
    client: Any,
    key: str,
    token: str,
    *,
    run_id: str | None = None,
    owner: str = OWNER,
    waiter: str = "",
    ticket: int = 0,
    hand_round: int = 0,
    quarantine_ms: int = QUARANTINE_MS,
) -> Any:
    """acquire.lua as a client's connection sends it: with the node's run_id (the fast
    path's condition) unless ``run_id`` says otherwise."""
    if run_id is None:
        run_id = run_id_of(client)
    args = (token, 10_000, owner, quarantine_ms, waiter, ticket, 5_000, hand_round)
    return client.eval(scripts.ACQUIRE.source, 1, key, *args, run_id, "appendonly no")


def release(client: Any, key: str, token: str, waiter: str = "", *identity: str) -> Any:
    return client.eval(scripts.RELEASE.source, 1, key, token, waiter, *identity)


def info_calls(client: Any) -> int:
    """INFO calls so far, this one's excluded (the stats count a command once it returns)."""
    return int(client.info("commandstats").get("cmdstat_info", {}).get("calls", 0))


def test_the_fast_acquire_writes_what_the_full_rules_write(node):
    owner = owner_arg(7, 1_795_000_000_123)
    # The full rules: a connection that does not know its process yet (INFO decides).
    assert acquire(node, "slow", "a" * 40, run_id="", owner=owner) == b"OK"
    node.delete(b"\x00o:" + owner.split()[0][:7].encode() + b":django_redlock:node")
    run_id = run_id_of(node)
    calls = info_calls(node)
    assert acquire(node, "fast", "a" * 40, run_id=run_id, owner=owner) == b"OK"
    assert info_calls(node) == calls + 1  # the fast path: no INFO (+1: the first count's)
    assert node.get("fast") == node.get("slow")
    assert 9_000 < node.pttl("fast") <= 10_000
    owner_key = b"\x00o:" + owner.split()[0][:7].encode() + b":django_redlock:node"
    assert node.get(owner_key) == b'{"pid":7,"acquired_at":'
    assert 19_000 < node.pttl(owner_key) <= 20_000  # twice the lease (lock_write.lua)
    # A malformed owner argument is refused before anything is written, fast path or not.
    with pytest.raises(Exception, match="the owner argument must be"):
        acquire(node, "bad", "b" * 40, owner="short")
    assert node.exists("bad") == 0


def test_the_fast_acquire_refuses_behind_a_line_or_readers(node):
    # A waiter ahead in the line of a free lock: a single try may not jump it.
    node.zadd("k\x00q", {"ahead.n": 1})
    node.hset("k\x00e", "ahead.n", 2**50)
    assert acquire(node, "k", "a" * 40) == 0
    assert node.exists("k") == 0
    # Live readers of the read-write lock of this name (their expiry is their score).
    node.zadd("r\x00r", {"reader": 2**50})
    assert acquire(node, "r", "a" * 40) > 0
    assert node.exists("r") == 0


def test_a_quarantine_other_than_the_markers_takes_the_full_rules(node):
    # Shorter: told the longer one (quarantine_longer.lua), nothing written.
    with pytest.raises(Exception, match=rf"QUARANTINE_LONGER {QUARANTINE_MS} ms"):
        acquire(node, "k", "a" * 40, quarantine_ms=QUARANTINE_MS - 1)
    assert node.exists("k") == 0
    # Longer: granted, and the node remembers it (node_rule.lua).
    assert acquire(node, "k", "a" * 40, quarantine_ms=QUARANTINE_MS + 1) == b"OK"
    assert node.hget(scripts.NODE_KEY, "q") == str(QUARANTINE_MS + 1).encode()


def test_a_first_round_after_a_later_one_is_refused_on_the_fast_path(node):
    # hand_register.lua: round 3 of this waiter already ran here; its round 1, run late
    # (it sat on a replaced connection), must not take the lock.
    node.hset("k\x00h", "w.n", f"3 10000 {'h' * 40} {OWNER}")
    assert acquire(node, "k", "h" * 40, waiter="w.n", ticket=5, hand_round=1) == 0
    assert node.exists("k") == 0
    # Another waiter's first round takes the free lock as usual.
    assert acquire(node, "k", "i" * 40, waiter="v.n", ticket=6, hand_round=1) == b"OK"


def test_a_waiters_release_with_no_line_drops_its_grant_mark(node):
    # A granted waiter (hand_grant.lua marks its entry 'g') holds the lock; nobody waits.
    assert acquire(node, "k", "g" * 40) == b"OK"
    node.hset("k\x00h", mapping={"w.n": f"g1 10000 {'g' * 40} {OWNER}", "x.n": "2 1 t o"})
    assert release(node, "k", "g" * 40, "w.n") == 1
    assert node.exists("k") == 0
    assert node.hkeys("k\x00h") == [b"x.n"]  # its own entry only


def test_a_waiters_release_hands_the_lock_to_the_next_waiter(node):
    assert acquire(node, "k", "a" * 40, waiter="a.n", ticket=1, hand_round=1) == b"OK"
    assert acquire(node, "k", "b" * 40, waiter="b.n", ticket=2, hand_round=1) > 0  # queued
    assert release(node, "k", "a" * 40, "a.n") == 1
    assert lock_token(node, "k") == b"b" * 40  # granted (hand_grant.lua)
    assert node.zrange("k\x00q", 0, -1) == []


def queue_behind(node: Any) -> None:
    assert acquire(node, "k", "a" * 40) == b"OK"
    assert acquire(node, "k", "b" * 40, waiter="b.n", ticket=2, hand_round=1) > 0


def test_a_release_that_names_its_process_grants_without_info(node):
    queue_behind(node)
    run_id = run_id_of(node)
    calls = info_calls(node)
    assert release(node, "k", "a" * 40, "", run_id, "appendonly no") == 1
    assert lock_token(node, "k") == b"b" * 40
    assert info_calls(node) == calls + 1  # +1: the first count's own INFO


def test_a_release_that_names_another_process_than_the_markers_grants_nothing(node):
    # The marker names this process; a connection that reached another one (its run_id)
    # means the marker is not this process's: wake the head, grant nothing.
    queue_behind(node)
    assert release(node, "k", "a" * 40, "", "f" * 40, "appendonly no") == 1
    assert node.exists("k") == 0
    assert node.zrange("k\x00q", 0, -1) == [b"b.n"]
    # Without a run_id the node reads INFO, as before.
    node.delete("k\x00q", "k\x00e", "k\x00h")
    queue_behind(node)
    calls = info_calls(node)
    assert release(node, "k", "a" * 40) == 1
    assert lock_token(node, "k") == b"b" * 40
    # The script's two INFO calls (server and replication: node_identity.lua), and the first
    # count's.
    assert info_calls(node) == calls + 3


def test_the_identified_release_command_counts_the_identity_the_transport_appends(node):
    queue_behind(node)
    # EVALSHA, as a connection sends it once the script is loaded (run alone or first, the
    # node had not seen this script yet: NOSCRIPT).
    node.script_load(scripts.RELEASE.source)
    command, fallback = scripts.release_command("k", "a" * 40, "", identified=True)
    me = run_id_of(node).encode()
    identity = b"$%d\r\n%s\r\n$13\r\nappendonly no\r\n" % (len(me), me)
    connection = node.connection_pool.get_connection()
    try:
        connection.send_packed_command([command + identity])
        assert connection.read_response() == 1
        assert fallback is not None
        assert fallback.identify
        connection.send_packed_command([fallback.build() + identity])
        assert connection.read_response() == 0  # already released
    finally:
        node.connection_pool.release(connection)
    assert lock_token(node, "k") == b"b" * 40


# What a hot script costs the node is mostly its redis.calls (issue 25: W3, one key passed
# from waiter to waiter, spends its server time in the queueing try and the granting
# release): their counts are pinned here, read from INFO commandstats, so a change that adds
# one fails. Both scripts' headers list these calls.
_NOT_NESTED = {"eval", "evalsha", "info", "config|resetstat"}


def nested_calls(client: Any) -> dict[str, int]:
    """The commands run since the stats were reset, by name, the scripts themselves and the
    stats' own commands excluded: what the scripts called (redis.call)."""
    counts: dict[str, int] = {}
    for name, fields in client.info("commandstats").items():
        command = name.removeprefix("cmdstat_")
        if command not in _NOT_NESTED and fields["calls"]:
            counts[command] = int(fields["calls"])
    return counts


def new_acquires(node: Any) -> None:
    """The tests reuse their few tokens for acquires that in life each draw a new one: the
    gone marks earlier releases left for them (``scripts/hand_gone.lua``, refusing a finished
    acquire's late tries) are dropped first."""
    marks = list(node.scan_iter(match="k\x00x*"))
    if marks:
        node.delete(*marks)


def steady_hand_off(node: Any) -> str:
    """W3's steady state on one node: ``b.n`` holds the lock by a grant (its place in line
    gone, its registration marked 'g'), ``c.n`` waits behind it, registered. Returns the
    node's run_id."""
    new_acquires(node)
    assert acquire(node, "k", "a" * 40, waiter="a.n", ticket=1, hand_round=1) == b"OK"
    assert acquire(node, "k", "b" * 40, waiter="b.n", ticket=2, hand_round=1) > 0
    assert acquire(node, "k", "c" * 40, waiter="c.n", ticket=3, hand_round=1) > 0
    run_id = run_id_of(node)
    assert release(node, "k", "a" * 40, "a.n", run_id, "appendonly no") == 1
    assert lock_token(node, "k") == b"b" * 40
    assert node.hget("k\x00h", "b.n").startswith(b"g1 ")
    assert node.zrange("k\x00q", 0, -1) == [b"c.n"]
    return run_id


def test_the_queueing_try_takes_13_redis_calls(node):
    steady_hand_off(node)
    # The registrations' hash was renewed to the lease length by the last registration; its
    # PTTL is below that once a millisecond passed, so the try renews it (as in W3): made
    # certain here.
    node.pexpire("k\x00h", 5_000)
    node.config_resetstat()
    assert acquire(node, "k", "d" * 40, waiter="d.n", ticket=4, hand_round=1) > 0
    assert nested_calls(node) == {
        "hmget": 1,  # the marker
        "hget": 1,  # its registration: the late-round check, reused by register_hand
        "exists": 1,
        "get": 1,
        "zadd": 1,
        "time": 1,
        "hset": 2,  # its lapse time, its registration
        "pexpire": 3,  # the line, the lapse times, the registrations
        "pttl": 2,  # the registrations, the holder's key
    }
    assert node.zrange("k\x00q", 0, -1) == [b"c.n", b"d.n"]
    assert node.hget("k\x00h", "d.n") == f"1 10000 {'d' * 40} {OWNER}".encode()
    assert 9_000 < node.pttl("k\x00h") <= 10_000


def test_the_granting_release_of_a_granted_holder_takes_15_redis_calls(node):
    run_id = steady_hand_off(node)
    node.config_resetstat()
    assert release(node, "k", "b" * 40, "b.n", run_id, "appendonly no") == 1
    assert nested_calls(node) == {
        "get": 1,  # no DEL: the grant's SET writes over the released key
        "exists": 1,  # the line, the registrations and the readers, weighted, in one call
        "zrem": 1,  # the head's place and its own (none here), in one call
        "hdel": 2,  # its registration; the head's lapse time and its own, in one call
        "time": 1,
        "zrange": 1,  # the head (no look at the readers: the EXISTS found none)
        "hget": 3,  # the head's lapse time, its registration, the marker's run
        "set": 2,  # the grant, over the released key; the holder's gone mark (hand_gone.lua)
        "pttl": 1,  # the owner key
        "hset": 1,  # the head's 'g' mark
        "publish": 1,
    }
    assert lock_token(node, "k") == b"c" * 40
    assert node.hkeys("k\x00h") == [b"c.n"]
    assert node.zrange("k\x00q", 0, -1) == []
    assert node.hkeys("k\x00e") == []


def test_a_granting_release_still_looks_at_readers_when_their_key_exists(node):
    run_id = steady_hand_off(node)
    # A live reader of the read-write lock of this name (its expiry is its score): the
    # lock is not granted, the head is woken instead (hand_grant.lua).
    node.zadd("k\x00r", {"reader": 2**50})
    assert release(node, "k", "b" * 40, "b.n", run_id, "appendonly no") == 1
    assert node.exists("k") == 0
    assert node.zrange("k\x00q", 0, -1) == [b"c.n"]
    # A readers key whose last reader's time ran out does not hold the grant back.
    node.delete("k\x00q", "k\x00e", "k\x00h", "k\x00r")
    run_id = steady_hand_off(node)
    node.zadd("k\x00r", {"reader": 1})
    assert release(node, "k", "b" * 40, "b.n", run_id, "appendonly no") == 1
    assert lock_token(node, "k") == b"c" * 40


def test_a_waiters_release_keeps_its_registration_count_apart_from_the_readers(node):
    # No line: the weighted EXISTS (2*line + registrations + 2*readers) finds a registration
    # of ours (1): dropped, and nothing more to do; a readers key without a line (2, or 3
    # with a registration) takes the full rules, which find nobody in line.
    assert acquire(node, "k", "a" * 40) == b"OK"
    node.hset("k\x00h", mapping={"w.n": f"g1 10000 {'a' * 40} {OWNER}", "x.n": "2 1 t o"})
    node.config_resetstat()
    assert release(node, "k", "a" * 40, "w.n") == 1
    # ... and its gone mark (scripts/hand_gone.lua), after the DEL.
    assert nested_calls(node) == {"get": 1, "del": 1, "exists": 1, "hdel": 1, "set": 1}
    assert node.hkeys("k\x00h") == [b"x.n"]
    assert 0 < node.pttl("k\x00x" + "a" * 40) <= 60_000
    for registered in (False, True):
        token = ("b" if registered else "c") * 40  # a fresh token: one per acquire
        assert acquire(node, "k", token) == b"OK"
        node.zadd("k\x00r", {"reader": 1})
        if registered:
            node.hset("k\x00h", "w.n", f"g1 10000 {token} {OWNER}")
        assert release(node, "k", token, "w.n") == 1
        assert node.exists("k", "k\x00q") == 0
        assert node.hkeys("k\x00h") == [b"x.n"]


def test_a_release_that_grants_nothing_still_deletes_its_key(node):
    # The released key is written over only by a grant (hand_grant.lua, `holder`); every
    # other way out of a release that found a line deletes it.
    run_id = run_id_of(node)
    identity = (run_id, "appendonly no")
    # The only place in line has lapsed: nobody to wake.
    assert acquire(node, "k", "a" * 40, waiter="a.n", ticket=1, hand_round=1) == b"OK"
    node.zadd("k\x00q", {"gone.n": 1})
    node.hset("k\x00e", "gone.n", 1)
    assert release(node, "k", "a" * 40, "a.n", *identity) == 1
    assert node.exists("k", "k\x00q", "k\x00e") == 0
    # A head with no hand-off registration: woken, not granted.
    new_acquires(node)
    assert acquire(node, "k", "a" * 40, waiter="a.n", ticket=1, hand_round=1) == b"OK"
    node.zadd("k\x00q", {"b.n": 2})
    node.hset("k\x00e", "b.n", 2**50)
    assert release(node, "k", "a" * 40, "a.n", *identity) == 1
    assert node.exists("k") == 0
    assert node.zrange("k\x00q", 0, -1) == [b"b.n"]
    # The holder's own place heads the line (a node that queued it, then the others gave it
    # a quorum): never taken for the head, dropped; the next waiter is granted the lock.
    node.delete("k\x00q", "k\x00e", "k\x00h")
    new_acquires(node)
    assert acquire(node, "k", "a" * 40, waiter="a.n", ticket=1, hand_round=1) == b"OK"
    assert acquire(node, "k", "b" * 40, waiter="b.n", ticket=2, hand_round=1) > 0
    node.zadd("k\x00q", {"a.n": 1})
    node.hset("k\x00e", "a.n", 2**50)
    assert release(node, "k", "a" * 40, "a.n", *identity) == 1
    assert lock_token(node, "k") == b"b" * 40
    assert node.zrange("k\x00q", 0, -1) == []
    assert node.hkeys("k\x00e") == []
    # Its place behind the head: dropped with the head's, in one ZREM.
    assert acquire(node, "k", "c" * 40, waiter="c.n", ticket=3, hand_round=1) > 0
    node.zadd("k\x00q", {"b.n": 9})
    node.hset("k\x00e", "b.n", 2**50)
    assert release(node, "k", "b" * 40, "b.n", *identity) == 1
    assert lock_token(node, "k") == b"c" * 40
    assert node.zrange("k\x00q", 0, -1) == []
    assert node.hkeys("k\x00e") == []
    # Its place in a line of lapsed places only: dropped, nobody granted or woken.
    node.zadd("k\x00q", {"c.n": 3, "gone.n": 1})
    node.hset("k\x00e", mapping={"c.n": 2**50, "gone.n": 1})
    assert release(node, "k", "c" * 40, "c.n", *identity) == 1
    assert node.exists("k", "k\x00q", "k\x00e") == 0
    # A registration whose owner argument is malformed: set_lock raises, the pcall catches it.
    node.delete("k\x00q", "k\x00e", "k\x00h")
    new_acquires(node)
    assert acquire(node, "k", "a" * 40, waiter="a.n", ticket=1, hand_round=1) == b"OK"
    assert acquire(node, "k", "b" * 40, waiter="b.n", ticket=2, hand_round=1) > 0
    node.hset("k\x00h", "b.n", f"1 10000 {'b' * 40} short")
    assert release(node, "k", "a" * 40, "a.n", *identity) == 1
    assert node.exists("k") == 0
    assert node.zrange("k\x00q", 0, -1) == [b"b.n"]


@pytest.mark.parametrize("waiter", ["", "a.n"], ids=["single-try", "waiter"])
def test_a_release_on_a_node_out_of_memory_still_grants(node, waiter):
    # The grant's SET needs memory, and a full node (maxmemory, noeviction) refuses a
    # script's first write that does: the release's DEL (a single try's) or the HDEL of its
    # registration (a waiter's HDEL; its key the grant then writes over) comes first, needing none.
    if waiter:
        run_id, holder, head = steady_hand_off(node), "b" * 40, "c"
    else:
        queue_behind(node)
        run_id, holder, head = run_id_of(node), "a" * 40, "b"
    node.config_set("maxmemory-policy", "noeviction")
    node.config_set("maxmemory", "1")  # every write that needs memory is refused
    try:
        assert release(node, "k", holder, waiter and "b.n", run_id, "appendonly no") == 1
    finally:
        node.config_set("maxmemory", "0")
    assert lock_token(node, "k") == head.encode() * 40
    assert node.zrange("k\x00q", 0, -1) == []


@pytest.mark.parametrize("foreign", ["k\x00q", "k\x00e", "k\x00h", "k\x00r"])
def test_a_waiters_release_that_fails_midway_still_frees_its_key(node, foreign):
    # A waiter's release no longer deletes its key before it looks at the line (a grant
    # writes over it): whatever fails on the way (here a foreign string under one of the
    # lock's names, which no client of ours writes) still frees the key, as the DEL that came
    # first did, and the error is answered, not hidden. Without the pcall in release.lua the
    # key stayed held for its whole ttl (review of issue 25's cuts).
    run_id = run_id_of(node)
    assert acquire(node, "k", "a" * 40, waiter="a.n", ticket=1, hand_round=1) == b"OK"
    assert acquire(node, "k", "b" * 40, waiter="b.n", ticket=2, hand_round=2) > 0
    assert node.zrange("k\x00q", 0, -1) == [b"b.n"]
    node.delete(foreign)
    node.set(foreign, "not ours")
    with pytest.raises(Exception, match="WRONGTYPE"):
        release(node, "k", "a" * 40, "a.n", run_id, "appendonly no")
    assert node.exists("k") == 0
