"""The node side of semaphores, read-write locks, multi-locks and hand-off
(``django_redlock/scripts/*.lua`` through ``wire/primitives.py``), on real nodes.

Commands are built by the builders of ``wire.primitives`` and sent as built (EVALSHA, with the
connection identity the transport would append), so the builders and the scripts are tested
together. The multi-node stories drive the scripts node by node, as a client would, with node
states that differ (a node a client did not reach, a release that reached only some nodes).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from django_redlock.core.witness import VOTERS_KEY
from django_redlock.wire import primitives as p
from django_redlock.wire import scripts
from django_redlock.wire.resp import PythonReader, encode_parts
from tests.helpers import (
    OWNER,
    lock_token,
    node_client,
    node_identity,
    owner_arg,
    owner_record,
    put_lock,
    stored_owner,
)

FOREVER = 10**12  # a quarantine no node outlives (ms)
Q = 60_000  # the quarantine of ordinary calls (ms); the fixtures declare every node fresh
KEY = "redlock:k"


def token(char: str) -> str:
    return char * 40


def run(client: redis.Redis, command: scripts.Command, identity: Sequence[str] = ("", "")) -> Any:
    """Send ``command`` as built. A granting command ends with the connection's identity,
    appended by the transport: here ``identity`` (run_id, persistence)."""
    data, _ = command
    reader = PythonReader()
    reader.feed(data)
    parts = reader.gets()
    if parts is False:  # counted in the header, left for the transport
        reader.feed(encode_parts(list(identity)))
        parts = reader.gets()
    return client.execute_command(*parts)


@pytest.fixture
def nodes(cluster3):
    clients = [node_client(node) for node in cluster3]
    for client in clients:
        for script in (*p.PRIMITIVE_SCRIPTS, *scripts.HOT_SCRIPTS):
            client.script_load(script.source)
    yield clients
    for client in clients:
        client.close()


@pytest.fixture
def node(nodes):
    return nodes[0]


def user_keys(client: redis.Redis) -> list[bytes]:
    """The keys under names (not the marker, nor the record of the nodes seen voting
    (core/witness.py), nor the owners' records: scripts/lock_key.lua)."""
    keys = set(client.scan_iter()) - {scripts.NODE_KEY.encode(), VOTERS_KEY.encode()}
    return sorted(key for key in keys if not key.startswith(b"\x00o:"))


# -- every granting script: headers, and the node rule of acquire.lua ---------------------

# Each new script, and whether it grants (so must apply the node rule). The extend scripts
# re-create keys a node lost, but only for a lease that is valid, whose keys the node rule
# exists to protect (scripts/extend.lua): no node rule there.
SCRIPTS = {
    "semaphore_acquire": True,
    "semaphore_release": False,
    "rw_acquire": True,
    "rw_release": False,
    "rw_extend": False,
    "rw_owns": False,
    "acquire_many": True,
    "release_many": False,
    "extend_many": False,
    "owns_many": False,
    "handoff": True,
}


def test_the_module_loads_every_script_once():
    loaded = {script.sha for script in p.PRIMITIVE_SCRIPTS}
    assert loaded == {scripts.load_script(name).sha for name in SCRIPTS}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_has_a_header_and_granting_ones_apply_the_node_rule(name):
    source = scripts.load_script(name).source.decode()
    assert re.search(r"^-- KEYS\[", source, re.MULTILINE)
    assert re.search(r"^-- ARGV\[1\]", source, re.MULTILINE)
    assert "-- Returns" in source
    assert "-- @include" not in source  # every include was expanded
    assert ("local function node_rule" in source) == SCRIPTS[name]
    assert ("vote_gate(KEYS" in source) == SCRIPTS[name]


def granting_commands(quarantine_ms: int) -> dict[str, scripts.Command]:
    return {
        "semaphore": p.semaphore_acquire_command(KEY, 2, token("a"), 10_000, OWNER, quarantine_ms),
        "read": p.rw_acquire_command(KEY, "r", token("a"), 10_000, OWNER, quarantine_ms),
        "write": p.rw_acquire_command(KEY, "w", token("a"), 10_000, OWNER, quarantine_ms),
        "many": p.acquire_many_command([KEY, KEY + "2"], token("a"), 10_000, OWNER, quarantine_ms),
        "handoff": p.handoff_command([KEY], token("z"), token("a"), OWNER, quarantine_ms),
    }


@pytest.mark.parametrize("what", ["semaphore", "read", "write", "many", "handoff"])
def test_a_quarantined_node_refuses_every_granting_script_like_acquire(node, what):
    """A fresh, non-durable node not declared fresh may have forgotten grants: refuse."""
    if what == "handoff":
        run(node, scripts.acquire_command(KEY, token("z"), 10_000, OWNER, Q))
    node.delete(scripts.NODE_KEY)  # as after a restart without persistence
    before = {key: node.dump(key) for key in user_keys(node)}
    for run_id in ("", node_identity(node)):
        identity = (run_id, "appendonly no")
        with pytest.raises(redis.ResponseError, match=r"QUARANTINED up \d+ s, not proven durable"):
            run(node, granting_commands(FOREVER)[what], identity)
    assert {key: node.dump(key) for key in user_keys(node)} == before  # nothing written
    # A refusal records no vote (no process named: '' once the refusing client knew the
    # node's persistence), only the quarantine it was asked for: a longer one than this
    # process has heard of must still hold after a later, shorter request.
    assert node.hget(scripts.NODE_KEY, "run") in (None, b"")
    assert int(node.hget(scripts.NODE_KEY, "q")) > 0
    # Declared fresh for this very process: it votes at once, even under a long quarantine,
    # and the connection that names the process takes the hot path.
    run_id = node.info("server")["run_id"]
    node.eval(scripts.DECLARE_FRESH.source, 1, scripts.NODE_KEY, run_id)
    answer = run(node, granting_commands(FOREVER)[what], (node_identity(node), "appendonly no"))
    assert answer not in (0, -2, [0, 0])
    assert node.hget(scripts.NODE_KEY, "q") == str(FOREVER).encode()  # the longest q kept


def test_the_eval_fallback_is_completed_with_the_connections_identity(node):
    """The EVAL sent after a NOSCRIPT ends, like its EVALSHA, with the identity the transport
    appends (issue 23: sent without it, a brand-new durable node refused every first use of
    a script it had not loaded yet as "durability not checked yet"). An unknown identity
    makes the node check itself: with no marker and an endless quarantine, QUARANTINED."""
    node.delete(scripts.NODE_KEY)
    for command in granting_commands(FOREVER).values():
        fallback = command[1]
        assert fallback is not None
        assert not fallback.when_over
        assert fallback.identify
        reader = PythonReader()
        reader.feed(fallback.build())
        assert reader.gets() is False  # counted in the header, left for the transport
        reader.feed(encode_parts(["", ""]))
        with pytest.raises(redis.ResponseError, match="QUARANTINED"):
            node.execute_command(*reader.gets())
    # Releases are idempotent: their fallback is sent even when the round is over.
    for command in (
        p.semaphore_release_command(KEY, 2, token("a")),
        p.rw_release_command(KEY, "w", token("a")),
        p.release_many_command([KEY], token("a")),
    ):
        assert command[1] is not None
        assert command[1].when_over


# -- semaphore ----------------------------------------------------------------------------


def sem_acquire(client, tok, limit=2, waiter="", ticket=0, prefer=-1, ttl_ms=10_000, owner=OWNER):
    command = p.semaphore_acquire_command(
        KEY, limit, tok, ttl_ms, owner, Q, waiter, ticket, 5_000, prefer
    )
    return run(client, command)


def sem_release(client, tok, limit=2, waiter=""):
    return run(client, p.semaphore_release_command(KEY, limit, tok, waiter))


def test_a_semaphore_grants_the_lowest_free_slot_and_a_retry_the_same_one(node):
    assert sem_acquire(node, token("a"), owner=owner_arg(1)) == [1, 0]
    assert (lock_token(node, p.slot_key(KEY, 0)), stored_owner(node, p.slot_key(KEY, 0))) == (
        token("a").encode(),
        owner_record(1),
    )
    assert sem_acquire(node, token("b")) == [1, 1]
    assert sem_acquire(node, token("a"), ttl_ms=30_000) == [1, 0]  # retry: same slot, renewed
    assert node.pttl(p.slot_key(KEY, 0)) > 20_000
    refused, left = sem_acquire(node, token("c"))
    assert refused == 0
    assert 0 < left <= 10_000
    assert user_keys(node) == [p.slot_key(KEY, 0).encode(), p.slot_key(KEY, 1).encode()]


def test_a_semaphore_release_frees_whichever_slot_the_token_holds_and_nothing_else(node):
    sem_acquire(node, token("a"))
    sem_acquire(node, token("b"))
    assert sem_release(node, token("c")) == 0
    assert sem_release(node, token("b")) == 1
    assert node.exists(p.slot_key(KEY, 1)) == 0
    assert node.exists(p.slot_key(KEY, 0)) == 1
    assert sem_release(node, token("b")) == 0
    # Extend and owns of a slot are those of a lock (the slot is one): a renewal of a slot
    # this node lost re-creates it (extend.lua), one held by another is refused.
    assert run(node, p.semaphore_extend_command(KEY, 0, token("a"), 30_000, OWNER)) == 1
    assert run(node, p.semaphore_extend_command(KEY, 0, token("b"), 30_000, OWNER)) == -1
    assert run(node, p.semaphore_extend_command(KEY, 1, token("b"), 30_000, OWNER)) == 2
    assert lock_token(node, p.slot_key(KEY, 1)) == token("b").encode()
    assert sem_release(node, token("b")) == 1
    assert run(node, p.semaphore_owns_command(KEY, 0, token("a"))) == 1
    assert run(node, p.semaphore_owns_command(KEY, 0, token("b"))) == 0


def test_a_semaphore_takes_the_preferred_slot_when_free_and_never_foreign_keys(node):
    assert sem_acquire(node, token("a"), limit=3, prefer=2) == [1, 2]
    assert sem_acquire(node, token("b"), limit=3, prefer=2) == [1, 0]  # taken: lowest free
    node.set(p.slot_key(KEY, 1), "user data")  # a key of another type under our name
    refused, left = sem_acquire(node, token("c"), limit=3)
    assert refused == 0
    assert 0 < left <= 10_000  # the first slot to run out (the foreign key never does)
    node.set(p.slot_key(KEY, 0), "user data")
    assert sem_acquire(node, token("c"), limit=1) == [0, -1]  # none of them runs out
    assert node.get(p.slot_key(KEY, 1)) == b"user data"
    assert sem_release(node, token("c"), limit=3) == 0


def test_semaphore_waiters_take_free_slots_in_ticket_order(node):
    sem_acquire(node, token("a"))
    sem_acquire(node, token("b"))
    assert sem_acquire(node, token("c"), waiter="late.1", ticket=300)[0] == 0
    assert sem_acquire(node, token("d"), waiter="mid.1", ticket=200)[0] == 0
    assert sem_acquire(node, token("e"), waiter="early.1", ticket=100)[0] == 0
    sem_release(node, token("a"))  # one slot free: only the head of the line may take it
    assert sem_acquire(node, token("f")) == [0, 0]  # a single try never jumps the line
    assert sem_acquire(node, token("d"), waiter="mid.1", ticket=200) == [0, 0]
    assert sem_acquire(node, token("e"), waiter="early.1", ticket=100) == [1, 0]
    sem_release(node, token("b"))
    sem_release(node, token("e"), waiter="early.1")  # two slots free: the next two may
    assert sem_acquire(node, token("c"), waiter="late.1", ticket=300) == [1, 0]
    assert sem_acquire(node, token("d"), waiter="mid.1", ticket=200) == [1, 1]
    assert node.exists(p.semaphore_base(KEY) + scripts.LINE) == 0  # the line is empty
    # A place whose waiter stopped trying lapses and holds nobody back.
    sem_release(node, token("c"))
    sem_acquire(node, token("g"), waiter="gone.1", ticket=50)
    sem_release(node, token("g"), waiter="gone.1")
    sem_acquire(node, token("h"))  # full again
    assert sem_acquire(node, token("i"), waiter="gone.2", ticket=10)[0] == 0
    node.hset(p.semaphore_base(KEY) + scripts.LAPSE, "gone.2", "0")  # its place lapsed
    sem_release(node, token("h"))
    assert sem_acquire(node, token("j")) == [1, 0]


def published(pubsub, node, marker: str) -> list[tuple[bytes, bytes]]:
    """Every (channel, payload) published before ``marker`` (one connection's messages keep
    their order, so once the marker arrives nothing earlier is still in flight)."""
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


def test_a_semaphore_release_wakes_the_waiter_it_lets_in(node):
    base = p.semaphore_base(KEY)
    sem_acquire(node, token("a"))
    sem_acquire(node, token("b"))
    for ticket, waiter in ((100, "aaaa.1"), (200, "bbbb.2"), (300, "cccc.3")):
        assert sem_acquire(node, token("z"), waiter=waiter, ticket=ticket)[0] == 0
    pubsub = node.pubsub()
    pubsub.psubscribe(KEY + "*")
    assert pubsub.get_message(timeout=5.0)["type"] == "psubscribe"
    assert sem_release(node, token("a")) == 1  # one free: the first waiter
    assert published(pubsub, node, KEY + "-m") == [(f"{base}\x00waaaa".encode(), b"aaaa.1")]
    assert sem_release(node, token("b")) == 1  # two free: the second (the first may already)
    assert published(pubsub, node, KEY + "-m") == [(f"{base}\x00wbbbb".encode(), b"bbbb.2")]
    # A waiter that gives up lets the next one into the first two: it is woken.
    run(node, p.semaphore_leave_command(KEY, 2, "aaaa.1"))
    assert published(pubsub, node, KEY + "-m") == [(f"{base}\x00wcccc".encode(), b"cccc.3")]
    pubsub.close()


def test_a_failed_rounds_clean_up_frees_the_slot_and_keeps_the_place_under_its_ticket(node):
    """The clean-up of a failed round of a waiter that goes on (semaphore_yield_command):
    the slot its try took here is freed and its place is put back under its ticket, ahead of
    those queued after it, so the line keeps the order the nodes that refused the try have.
    It wakes nobody when the place it frees a slot for is its own, and wakes the waiter let
    in when that is another."""
    base = p.semaphore_base(KEY)
    line = base + scripts.LINE
    sem_acquire(node, token("a"))
    sem_acquire(node, token("b"))
    assert sem_acquire(node, token("z"), waiter="bbbb.2", ticket=200)[0] == 0  # queued
    assert sem_acquire(node, token("w"), waiter="aaaa.1", ticket=100)[0] == 0  # queued first
    sem_release(node, token("b"))
    # aaaa.1, first in line, is granted the slot freed: its place goes with the grant.
    assert sem_acquire(node, token("w"), waiter="aaaa.1", ticket=100) == [1, 1]
    assert node.zrange(line, 0, -1) == [b"bbbb.2"]
    pubsub = node.pubsub()
    pubsub.psubscribe(KEY + "*")
    assert pubsub.get_message(timeout=5.0)["type"] == "psubscribe"
    yielded = p.semaphore_yield_command(KEY, 2, token("w"), "aaaa.1", 100, 5_000)
    assert run(node, yielded) == 1
    assert node.exists(p.slot_key(KEY, 1)) == 0
    assert node.zrange(line, 0, -1, withscores=True) == [(b"aaaa.1", 100.0), (b"bbbb.2", 200.0)]
    seconds, micros = node.time()
    lapses = int(node.hget(base + scripts.LAPSE, "aaaa.1"))
    assert 0 < lapses - (seconds * 1000 + micros // 1000) <= 5_000  # renewed for its lifetime
    assert published(pubsub, node, KEY + "-m") == []  # the one let in is aaaa.1 itself
    # Again, with the other slot free too: two are let in, and the second is bbbb.2.
    assert sem_acquire(node, token("w"), waiter="aaaa.1", ticket=100) == [1, 1]
    assert sem_release(node, token("a")) == 1
    published(pubsub, node, KEY + "-m")  # the release's own wake-up
    assert run(node, yielded) == 1
    assert published(pubsub, node, KEY + "-m") == [(f"{base}\x00wbbbb".encode(), b"bbbb.2")]
    assert run(node, yielded) == 0  # freed already: nothing to free, nobody woken
    assert published(pubsub, node, KEY + "-m") == []
    pubsub.close()


class SemaphoreClient:
    """A client of a semaphore, driving the script node by node as the manager would: slot s
    is held when a quorum answered s; otherwise every grant is released (the failed try)."""

    def __init__(self, name: str, limit: int) -> None:
        self.token = token(name)
        self.limit = limit
        self.slot: int | None = None

    def acquire(self, nodes, reached, prefer=-1) -> int | None:
        replies = [
            sem_acquire(client, self.token, limit=self.limit, prefer=prefer)
            if i in reached
            else None
            for i, client in enumerate(nodes)
        ]
        slot = p.quorum_slot(replies, len(nodes) // 2 + 1)
        for i, reply in enumerate(replies):
            granted = p.slot_granted(reply)
            if granted is not None and granted != slot:
                sem_release(nodes[i], self.token, limit=self.limit)  # a stray grant
        if slot is None:
            for i in reached:
                sem_release(nodes[i], self.token, limit=self.limit)
        self.slot = slot
        return slot

    def release(self, nodes, reached) -> None:
        for i in reached:
            sem_release(nodes[i], self.token, limit=self.limit)
        self.slot = None


def test_a_semaphore_on_three_nodes_in_different_states_grants_at_most_limit(nodes):
    """N = 3, limit = 2: a per-node counter capped at 2 would grant a third client here."""
    c1, c2, c3 = (SemaphoreClient(name, 2) for name in "abc")
    assert c1.acquire(nodes, {0, 1}) == 0  # node 2 unreachable
    # Node 1 has slot 0 taken, node 2 is empty: they answer slots 1 and 0, no quorum.
    assert c2.acquire(nodes, {1, 2}) is None
    assert c2.acquire(nodes, {1, 2}, prefer=1) == 1  # the retry converges on one slot
    # Each node has one slot of two free, yet no slot is free on a quorum.
    for prefer in (-1, 0, 1):
        assert c3.acquire(nodes, {0, 1, 2}, prefer=prefer) is None
    assert [int(client.exists(*p.slot_keys(KEY, 2))) for client in nodes] == [1, 2, 1]
    assert not any(
        lock_token(client, k) == c3.token.encode() for client in nodes for k in p.slot_keys(KEY, 2)
    )
    c1.release(nodes, {0, 1, 2})
    assert c3.acquire(nodes, {0, 1, 2}) == 0


def test_a_semaphore_never_has_more_valid_holders_than_slots_whatever_reaches_where(nodes):
    """Random partial reaches (a node down for one client's try or release) leave the nodes in
    states that differ; the invariant holds after every step: at most one holder per slot, so
    at most ``limit``, and every holder's slot still holds its token on a quorum."""
    rng = random.Random(16)
    limit = 2
    clients = [SemaphoreClient(f"{i:x}", limit) for i in range(5)]
    for step in range(250):
        client = rng.choice(clients)
        reached = set(rng.sample(range(3), rng.choice((1, 2, 2, 3, 3))))
        if client.slot is None:
            client.acquire(nodes, reached, prefer=rng.choice((-1, 0, 1)))
        else:
            client.release(nodes, reached)
        holders = [c for c in clients if c.slot is not None]
        assert len(holders) <= limit, step
        assert len({c.slot for c in holders}) == len(holders), step
        for holder in holders:
            assert holder.slot is not None
            key = p.slot_key(KEY, holder.slot)
            held = sum(lock_token(client, key) == holder.token.encode() for client in nodes)
            assert held >= 2, step


# -- read-write lock ----------------------------------------------------------------------


def rw_acquire(client, kind, tok, waiter="", ticket=0, ttl_ms=10_000, owner=OWNER):
    return run(
        client, p.rw_acquire_command(KEY, kind, tok, ttl_ms, owner, Q, waiter, ticket, 5_000)
    )


def rw_release(client, kind, tok, waiter=""):
    return run(client, p.rw_release_command(KEY, kind, tok, waiter))


def test_readers_share_and_exclude_a_writer_and_a_writer_excludes_everyone(node):
    assert rw_acquire(node, "r", token("a"), owner=owner_arg(1)) == b"OK"
    assert rw_acquire(node, "r", token("b")) == b"OK"
    assert node.zcard(KEY + p.READERS) == 2
    assert node.hget(KEY + p.READER_OWNERS, token("a")) == owner_record(1)
    left = rw_acquire(node, "w", token("c"))
    assert 0 < left <= 10_000  # the last reader's time left
    assert node.exists(KEY) == 0
    assert rw_release(node, "r", token("a")) == 1
    assert rw_release(node, "r", token("a")) == 0
    assert rw_release(node, "w", token("b")) == 0  # a reader's token is no writer
    assert rw_release(node, "r", token("b")) == 1
    assert node.exists(KEY + p.READERS, KEY + p.READER_OWNERS) == 0  # nothing left behind
    assert rw_acquire(node, "w", token("c"), owner=owner_arg(3)) == b"OK"
    assert (lock_token(node, KEY), stored_owner(node, KEY)) == (
        token("c").encode(),
        owner_record(3),
    )  # a lock
    assert 0 < rw_acquire(node, "r", token("d")) <= 10_000
    assert 0 < rw_acquire(node, "w", token("e")) <= 10_000
    assert rw_acquire(node, "w", token("c"), ttl_ms=30_000) == b"OK"  # a retry renews
    assert node.pttl(KEY) > 20_000


def test_a_waiting_writer_holds_back_new_readers_but_not_those_queued_before_it(node):
    assert rw_acquire(node, "w", token("a")) == b"OK"
    assert rw_acquire(node, "r", token("b"), waiter="rb.1", ticket=100) > 0  # queued first
    assert rw_acquire(node, "w", token("c"), waiter="wc.1", ticket=200) > 0  # then a writer
    rw_release(node, "w", token("a"))
    assert rw_acquire(node, "r", token("d")) == 0  # a new reader: held back (single try)
    assert rw_acquire(node, "r", token("d"), waiter="rd.1", ticket=300) == 0  # and queued
    assert rw_acquire(node, "w", token("c"), waiter="wc.1", ticket=200) == 0  # a reader first
    assert rw_acquire(node, "r", token("b"), waiter="rb.1", ticket=100) == b"OK"
    assert rw_acquire(node, "w", token("c"), waiter="wc.1", ticket=200) > 0  # reader live
    rw_release(node, "r", token("b"), waiter="rb.1")
    assert rw_acquire(node, "r", token("d"), waiter="rd.1", ticket=300) == 0  # still behind
    assert rw_acquire(node, "w", token("c"), waiter="wc.1", ticket=200) == b"OK"
    rw_release(node, "w", token("c"), waiter="wc.1")
    assert rw_acquire(node, "r", token("d"), waiter="rd.1", ticket=300) == b"OK"
    assert node.exists(KEY + scripts.LINE) == 0


def test_a_writers_place_lapses_when_it_stops_trying(node):
    rw_acquire(node, "r", token("a"))
    assert rw_acquire(node, "w", token("b"), waiter="wb.1", ticket=100) > 0
    assert rw_acquire(node, "r", token("c")) == 0
    node.hset(KEY + scripts.LAPSE, "w|wb.1", "0")  # as after its lifetime without a try
    assert rw_acquire(node, "r", token("c")) == b"OK"
    assert node.exists(KEY + scripts.LINE) == 0  # the lapsed place was dropped


def test_an_expired_reader_is_purged_and_never_renewed(node):
    rw_acquire(node, "r", token("a"))
    rw_acquire(node, "r", token("b"))
    node.zadd(KEY + p.READERS, {token("a"): 1})  # its expiry is in the past on the node clock
    assert run(node, p.rw_owns_command(KEY, "r", token("a"))) == 0
    assert run(node, p.rw_owns_command(KEY, "r", token("b"))) == 1
    # A renewal purges it, then re-creates it (no writer holds the lock).
    assert run(node, p.rw_extend_command(KEY, "r", token("a"), 30_000, owner_arg(7))) == 2
    assert node.zscore(KEY + p.READERS, token("a")) > 1
    assert node.hget(KEY + p.READER_OWNERS, token("a")) == owner_record(7)
    assert rw_release(node, "r", token("a")) == 1
    assert run(node, p.rw_extend_command(KEY, "r", token("b"), 30_000, OWNER)) == 1
    assert node.pttl(KEY + p.READERS) > 20_000
    assert node.pttl(KEY + p.READER_OWNERS) > 20_000
    node.zadd(KEY + p.READERS, {token("b"): 1})
    assert rw_release(node, "r", token("b")) == 0  # it was lost, not released
    assert rw_acquire(node, "w", token("c")) == b"OK"  # no live reader holds it back
    assert run(node, p.rw_extend_command(KEY, "w", token("c"), 30_000, OWNER)) == 1
    assert run(node, p.rw_extend_command(KEY, "w", token("a"), 30_000, OWNER)) == -1  # c's
    assert run(node, p.rw_extend_command(KEY, "r", token("d"), 30_000, OWNER)) == -1  # a writer
    assert run(node, p.rw_owns_command(KEY, "w", token("c"))) == 1


def test_releases_wake_the_readers_at_the_head_or_the_writer_once_readers_are_gone(node):
    rw_acquire(node, "w", token("a"))
    waiters = (
        ("r", "aaaa.1", 100),
        ("r", "bbbb.2", 200),
        ("w", "cccc.3", 300),
        ("r", "dddd.4", 400),
    )
    for kind, waiter, ticket in waiters:
        assert rw_acquire(node, kind, token("z"), waiter=waiter, ticket=ticket) != b"OK"
    pubsub = node.pubsub()
    pubsub.psubscribe(KEY + "*")
    assert pubsub.get_message(timeout=5.0)["type"] == "psubscribe"
    assert rw_release(node, "w", token("a")) == 1
    assert published(pubsub, node, KEY + "-m") == [
        (f"{KEY}\x00waaaa".encode(), b"aaaa.1"),
        (f"{KEY}\x00wbbbb".encode(), b"bbbb.2"),
    ]
    assert rw_acquire(node, "r", token("p"), waiter="aaaa.1", ticket=100) == b"OK"
    assert rw_acquire(node, "r", token("q"), waiter="bbbb.2", ticket=200) == b"OK"
    assert rw_release(node, "r", token("p"), waiter="aaaa.1") == 1
    assert published(pubsub, node, KEY + "-m") == []  # a reader is left: the writer waits
    assert rw_release(node, "r", token("q"), waiter="bbbb.2") == 1
    assert published(pubsub, node, KEY + "-m") == [(f"{KEY}\x00wcccc".encode(), b"cccc.3")]
    pubsub.close()


def test_a_bad_mode_is_refused_by_the_builders_and_the_scripts(node):
    with pytest.raises(ValueError, match="mode"):
        p.rw_acquire_command(KEY, "x", token("a"), 1000, OWNER, Q)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mode"):
        p.rw_release_command(KEY, None, token("a"))  # type: ignore[arg-type]
    with pytest.raises(redis.ResponseError, match="mode must be r or w"):
        node.eval(p.RW_EXTEND.source, 3, KEY, KEY + p.READERS, KEY + p.READER_OWNERS, "x", "t", 1)


def test_readers_and_a_writer_never_both_hold_a_quorum_whatever_reaches_where(nodes):
    """Random reaches over three nodes; a client holds when a quorum granted it, and releases
    everywhere it reached otherwise. After every step: no writer beside a reader or another
    writer, and every holder's grant is still on a quorum."""
    rng = random.Random(2016)
    holders: dict[str, p.Mode] = {}  # token -> mode
    names = [token(c) for c in "abcdef"]
    for step in range(250):
        tok = rng.choice(names)
        reached = set(rng.sample(range(3), rng.choice((1, 2, 2, 3, 3))))
        if tok in holders:
            for i in reached:
                rw_release(nodes[i], holders[tok], tok)
            del holders[tok]
        else:
            mode: p.Mode = rng.choice(("r", "r", "w"))
            votes = sum(rw_acquire(nodes[i], mode, tok) == b"OK" for i in reached)
            if votes >= 2:
                holders[tok] = mode
            else:
                for i in reached:
                    rw_release(nodes[i], mode, tok)
        writers = [t for t, k in holders.items() if k == "w"]
        assert len(writers) <= 1, step
        assert not writers or len(holders) == 1, step
        for tok_, mode in holders.items():
            owned = sum(run(c, p.rw_owns_command(KEY, mode, tok_)) for c in nodes)
            assert owned >= 2, step


# -- multi-lock ---------------------------------------------------------------------------

MANY = ["redlock:b", "redlock:a", "redlock:c", "redlock:a"]


def many(client, tok, keys=MANY, ttl_ms=10_000, owner=OWNER):
    return run(client, p.acquire_many_command(keys, tok, ttl_ms, owner, Q))


def test_many_keys_are_sorted_once_and_bad_names_are_refused():
    assert p.many_keys(MANY) == ["redlock:a", "redlock:b", "redlock:c"]
    with pytest.raises(TypeError, match="names"):
        p.many_keys("redlock:a")
    with pytest.raises(TypeError, match="names"):
        p.many_keys(["redlock:a", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="names"):
        p.many_keys([])
    with pytest.raises(ValueError, match="names"):
        p.many_keys(f"k{i}" for i in range(p.MAX_MANY + 1))
    with pytest.raises(TypeError, match="limit"):
        p.slot_keys(KEY, 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        p.slot_keys(KEY, 0)


def test_a_multi_lock_takes_all_or_nothing(node):
    run(node, scripts.acquire_command("redlock:b", token("x"), 10_000, OWNER, Q))
    left = many(node, token("a"))
    assert 0 < left <= 10_000
    assert user_keys(node) == [b"redlock:b"]  # nothing else was written
    assert lock_token(node, "redlock:b") == token("x").encode()
    run(node, scripts.release_command("redlock:b", token("x")))
    assert many(node, token("a"), owner=owner_arg(1)) == b"OK"
    assert user_keys(node) == [b"redlock:a", b"redlock:b", b"redlock:c"]
    for key in user_keys(node):
        assert (lock_token(node, key), stored_owner(node, key)) == (
            token("a").encode(),
            owner_record(1),
        )
    assert many(node, token("a"), ttl_ms=30_000) == b"OK"  # a retry renews them all
    assert min(node.pttl(k) for k in user_keys(node)) > 20_000
    # The keys are those of single locks: a single lock of one of its names is refused.
    single = run(node, scripts.acquire_command("redlock:c", token("y"), 10_000, OWNER, Q))
    assert 0 < single <= 30_000


def test_a_multi_lock_extends_all_or_none_and_releases_only_its_own(node):
    many(node, token("a"))
    assert run(node, p.owns_many_command(MANY, token("a"))) == 1
    assert run(node, p.owns_many_command(MANY, token("b"))) == 0
    assert run(node, p.extend_many_command(MANY, token("a"), 30_000, OWNER)) == 1
    assert min(node.pttl(k) for k in user_keys(node)) > 20_000
    assert run(node, p.extend_many_command(MANY, token("b"), 60_000, OWNER)) == -1  # a's
    node.delete("redlock:b")  # as if this node lost it: the renewal re-creates it
    assert run(node, p.extend_many_command(MANY, token("a"), 60_000, owner_arg(3))) == 2
    assert (lock_token(node, "redlock:b"), stored_owner(node, "redlock:b")) == (
        token("a").encode(),
        owner_record(3),
    )
    assert min(node.pttl(k) for k in user_keys(node)) > 50_000
    put_lock(node, "redlock:b", token("z"))  # another holder's now
    assert run(node, p.extend_many_command(MANY, token("a"), 90_000, OWNER)) == -1
    assert max(node.pttl(k) for k in user_keys(node)) <= 60_000  # none was renewed
    assert run(node, p.release_many_command(MANY, token("a"))) == 2
    assert user_keys(node) == [b"redlock:b"]


def test_a_multi_lock_never_jumps_the_line_of_one_of_its_locks(node):
    acquire = scripts.acquire_command
    run(node, acquire("redlock:b", token("x"), 10_000, OWNER, Q))
    waiting = acquire("redlock:b", token("w"), 10_000, OWNER, Q, "wwww.1", 100, 5_000)
    assert run(node, waiting) > 0  # a blocking single lock waits in line
    pubsub = node.pubsub()
    pubsub.psubscribe("redlock:*")
    assert pubsub.get_message(timeout=5.0)["type"] == "psubscribe"
    assert run(node, scripts.release_command("redlock:b", token("x"))) == 1
    assert many(node, token("a")) == 0  # free, but the waiter goes first
    assert run(node, waiting) == b"OK"
    # The multi-lock's release wakes the head of each line it frees.
    run(node, scripts.release_command("redlock:b", token("w"), "wwww.1"))
    published(pubsub, node, "redlock:-m")
    assert many(node, token("a")) == b"OK"
    run(node, acquire("redlock:c", token("v"), 10_000, OWNER, Q, "vvvv.1", 200, 5_000))
    assert run(node, p.release_many_command(MANY, token("a"))) == 3
    assert published(pubsub, node, "redlock:-m") == [(b"redlock:c\x00wvvvv", b"vvvv.1")]
    pubsub.close()


def test_two_multi_locks_over_overlapping_names_never_both_hold_a_quorum(nodes):
    """Each client reaches a different majority; the overlap decides, no one waits on the
    other while holding anything (a failed try is released at once)."""
    first, second = ["redlock:a", "redlock:b"], ["redlock:b", "redlock:c"]
    votes_a = [many(nodes[i], token("a"), first) for i in (0, 1)]
    assert votes_a == [b"OK", b"OK"]
    votes_b = [many(nodes[i], token("b"), second) for i in (1, 2)]
    assert votes_b[0] != b"OK"
    assert votes_b[1] == b"OK"
    run(nodes[2], p.release_many_command(second, token("b")))
    assert user_keys(nodes[2]) == []  # nothing held while it waits


# -- hand-off -----------------------------------------------------------------------------


def test_a_hand_off_keeps_the_time_left_and_the_old_token_loses_the_lease(node):
    run(node, scripts.acquire_command(KEY, token("a"), 10_000, owner_arg(1), Q))
    left = run(node, p.handoff_command([KEY], token("a"), token("b"), owner_arg(2), Q))
    assert 0 < left <= 10_000
    assert (lock_token(node, KEY), stored_owner(node, KEY)) == (
        token("b").encode(),
        owner_record(2),
    )
    assert node.pttl(KEY) <= 10_000  # the expiry was kept, not renewed
    # The first process no longer owns it: its release and extend are refused here.
    assert run(node, scripts.release_command(KEY, token("a"))) == 0
    assert run(node, scripts.extend_command(KEY, token("a"), 60_000, OWNER)) == -1  # b's now
    assert run(node, scripts.owns_command(KEY, token("a"))) == 0
    # A retry of the same adoption answers the same; another adoption of the old one fails.
    assert 0 < run(node, p.handoff_command([KEY], token("a"), token("b"), OWNER, Q)) <= 10_000
    assert (
        run(node, p.handoff_command([KEY], token("a"), token("c"), OWNER, Q)) == p.HANDOFF_REFUSED
    )
    assert lock_token(node, KEY) == token("b").encode()
    assert run(node, scripts.extend_command(KEY, token("b"), 60_000, OWNER)) == 1
    assert run(node, scripts.release_command(KEY, token("b"))) == 1
    assert (
        run(node, p.handoff_command([KEY], token("b"), token("c"), OWNER, Q)) == p.HANDOFF_REFUSED
    )
    assert node.exists(KEY) == 0  # never re-created


def test_a_hand_off_of_a_multi_lock_or_a_slot_is_all_or_nothing(node):
    many(node, token("a"))
    put_lock(node, "redlock:c", token("z"))  # one key lost to another holder here
    assert run(node, p.handoff_command(MANY, token("a"), token("b"), OWNER, Q)) == p.HANDOFF_REFUSED
    assert lock_token(node, "redlock:a") == token("a").encode()  # nothing was handed over
    put_lock(node, "redlock:c", token("a"))
    assert 0 < run(node, p.handoff_command(MANY, token("a"), token("b"), OWNER, Q)) <= 10_000
    assert {lock_token(node, k) for k in user_keys(node)} == {token("b").encode()}
    assert sem_acquire(node, token("s")) == [1, 0]
    slot = [p.slot_key(KEY, 0)]
    assert run(node, p.handoff_command(slot, token("s"), token("t"), OWNER, Q)) > 0
    assert sem_release(node, token("s")) == 0
    assert sem_release(node, token("t")) == 1
    with pytest.raises(ValueError, match="new"):
        p.handoff_command([KEY], token("a"), token("a"), OWNER, Q)


def owner_key_of(client: redis.Redis, key: str) -> bytes:
    """The owner key named by the lock key ``key`` (scripts/lock_key.lua)."""
    value = client.get(key)
    assert isinstance(value, bytes)
    return b"\x00o:" + value.split(b" ")[1][:7] + b":django_redlock:node"


def test_a_hand_off_keeps_the_expiry_and_the_adopters_owner_outlives_the_keys(node):
    run(node, scripts.acquire_command(KEY, token("a"), 10_000, owner_arg(1), Q))
    node.pexpire(KEY, 8_000)  # some of the lease has gone by
    assert run(node, p.handoff_command([KEY], token("a"), token("b"), owner_arg(2), Q)) > 0
    assert 0 < node.pttl(KEY) <= 8_000  # kept, not renewed (SET ... KEEPTTL)
    assert stored_owner(node, KEY) == owner_record(2)
    assert node.pttl(owner_key_of(node, KEY)) >= node.pttl(KEY)
    # A hand-back (no owner) restores the token and keeps the adopter's owner and the expiry.
    assert 0 < run(node, p.handback_command([KEY], token("b"), token("a"), Q)) <= 8_000
    assert lock_token(node, KEY) == token("a").encode()
    assert stored_owner(node, KEY) == owner_record(2)
    assert 0 < node.pttl(KEY) <= 8_000


def test_the_primitives_never_take_release_renew_or_hand_off_an_old_layout_key(node):
    """A rolling upgrade: hash locks (t = token, o = owner) written by the previous version
    are held by another holder for every new script, even for their own token, and are
    never changed (tests/core/test_scripts.py covers the mutex scripts)."""
    old = token("a")
    slot = p.slot_key(KEY, 0)
    for key in (KEY, slot, *MANY):
        node.hset(key, mapping={"t": old, "o": '{"pid":7}'})
        node.pexpire(key, 20_000)
    before = {key: node.hgetall(key) for key in (KEY, slot, *MANY)}
    assert sem_acquire(node, old, limit=1)[0] == 0
    assert run(node, p.semaphore_extend_command(KEY, 0, old, 60_000, OWNER)) == -1
    assert sem_release(node, old, limit=1) == 0
    assert 0 < rw_acquire(node, "w", old) <= 20_000
    assert 0 < rw_acquire(node, "r", token("r")) <= 20_000  # no reader beside a writer
    assert run(node, p.rw_extend_command(KEY, "w", old, 60_000, OWNER)) == -1
    assert run(node, p.rw_owns_command(KEY, "w", old)) == 0
    assert rw_release(node, "w", old) == 0
    assert 0 < many(node, old) <= 20_000
    assert run(node, p.extend_many_command(MANY, old, 60_000, OWNER)) == -1
    assert run(node, p.owns_many_command(MANY, old)) == 0
    assert run(node, p.release_many_command(MANY, old)) == 0
    assert run(node, p.handoff_command([KEY], old, token("b"), OWNER, Q)) == p.HANDOFF_REFUSED
    assert {key: node.hgetall(key) for key in (KEY, slot, *MANY)} == before
    assert all(0 < node.pttl(key) <= 20_000 for key in before)
