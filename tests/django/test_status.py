"""manage.py redlock_status and manager.locks(): node health, quorum, active locks."""

from __future__ import annotations

import io
import json
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redlock import LockManager, get_manager
from django_redlock.core.health import status
from django_redlock.core.listing import escape_glob
from tests.helpers import node_client, released_everywhere


def run_status(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("redlock_status", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_healthy_cluster_exits_0_and_lists_locks(redlock_nodes):
    lease = get_manager().acquire("orders:42", ttl=30.0, origin="view:shop.pay")
    lease.extend()  # every node holds it
    out, _ = run_status()
    assert "Quorum: 3 of 3 nodes vote, 2 needed: healthy" in out
    assert "orders:42  3/3 nodes" in out
    assert "view:shop.pay" in out
    assert lease.token not in out
    lease.release()


def test_json_schema(redlock_nodes):
    lease = get_manager().acquire("report", ttl=30.0)
    lease.extend()
    out, _ = run_status("--json")
    payload = json.loads(out)
    assert payload["healthy"] is True
    assert (payload["quorum"], payload["voting"]) == (2, 3)
    node = payload["nodes"][0]
    assert set(node) >= {
        "node",
        "reachable",
        "votes",
        "latency_ms",
        "server",
        "version",
        "role",
        "run_id",
        "uptime_s",
        "maxmemory_policy",
        "persistence",
        "clock_offset_ms",
        "quarantine_left_s",
        "problems",
        "warnings",
    }
    assert node["role"] == "master"
    assert node["votes"] is True
    (lock,) = payload["locks"]
    assert (lock["name"], lock["nodes"], lock["partial"]) == ("report", 3, False)
    assert lock["owner"]["pid"] > 0
    assert "t" not in lock["owner"]
    lease.release()


def test_no_quorum_exits_1_fast_and_never_hangs(redlock_nodes):
    redlock_nodes[0].pause()
    redlock_nodes[1].kill()
    started = time.monotonic()
    with pytest.raises(CommandError, match="no quorum: 1 of 3 nodes can vote, 2 needed"):
        run_status()
    assert time.monotonic() - started < 5  # each stopped node costs one 0.25 s timeout


def test_an_acl_user_without_the_script_commands_is_a_problem_at_status_time(
    redlock_nodes, settings
):
    for node in redlock_nodes:
        with node_client(node) as client:
            client.execute_command(
                "ACL", "SETUSER", "weak", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval"
            )
    weak = [node.url.replace("unix://", "unix://weak:pw@") for node in redlock_nodes]
    settings.REDLOCK = {"NODES": [*weak[:2], redlock_nodes.urls[2]]}
    with pytest.raises(CommandError, match="no quorum: 1 of 3 nodes can vote"):
        run_status()
    report = status(get_manager())
    problems = [" ".join(node.problems) for node in report.nodes]
    assert all("the ACL user may not run the lock scripts (EVALSHA)" in p for p in problems[:2])
    assert "no permissions to run the 'evalsha' command" in problems[0]
    assert report.nodes[2].votes


def test_a_restarted_node_shows_its_quarantine(redlock_nodes, settings):
    settings.REDLOCK = {"NODES": redlock_nodes.urls, "MAX_TTL": 60.0}
    redlock_nodes[2].restart()  # its new process is judged at once, before any acquire
    out = run_status()[0]
    assert "QUARANTINED until" in out
    assert "Quorum: 2 of 3 nodes vote" in out
    get_manager().acquire("wake").release()  # the other two are a quorum


def test_leftover_keys_on_a_minority_are_partial(redlock_nodes):
    with node_client(redlock_nodes[0]) as client:
        client.hset("redlock:leftover", mapping={"t": "x" * 40, "o": '{"pid": 7}'})
        client.pexpire("redlock:leftover", 30_000)
    listing = get_manager().locks()
    (lock,) = listing.locks
    assert (lock.name, lock.nodes, lock.partial) == ("leftover", 1, True)
    assert lock.owner == {"pid": 7}


def test_prefix_globs_are_escaped(redlock_nodes):
    manager = get_manager()
    leases = [manager.acquire(name, ttl=30.0) for name in ("job*", "job1", "job?x")]
    names = [lock.name for lock in manager.locks("job*").locks]
    assert names == ["job*"]
    assert escape_glob("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"
    for lease in leases:
        lease.release()


def test_the_listing_is_capped(redlock_nodes):
    manager = LockManager(redlock_nodes.urls)
    leases = [manager.acquire(f"many:{index}", ttl=30.0) for index in range(12)]
    listing = manager.locks("many:", limit=5)
    assert listing.truncated
    assert len(listing.locks) <= 5
    for lease in leases:
        lease.release()


def test_a_capped_status_says_how_many_it_shows_and_flags_no_held_lock_partial(redlock_nodes):
    manager = LockManager(redlock_nodes.urls, node_timeout=1.0)
    lease = manager.lock_many([f"many:{index:03d}" for index in range(300)], ttl=60.0)
    lease.extend()  # every node holds every lock
    out = run_status("--limit", "20")[0]
    assert "Active locks: showing 20 of about 300 (280 not shown" in out
    assert "many:019  3/3 nodes" in out
    assert "many:020" not in out  # the first 20 by name
    assert "partial" not in out
    payload = json.loads(run_status("--json", "--limit", "20")[0])
    assert len(payload["locks"]) == 20
    assert not any(lock["partial"] for lock in payload["locks"])
    assert (payload["locks_truncated"], payload["locks_not_shown"]) == (True, 280)
    assert payload["locks_approx_total"] == 300
    everything = json.loads(run_status("--json", "--limit", "all")[0])
    assert len(everything["locks"]) == 300
    assert (everything["locks_truncated"], everything["locks_not_shown"]) == (False, 0)
    assert "Active locks: 300\n" in run_status("--limit", "all")[0]
    lease.release()


def test_a_node_the_locks_could_not_be_read_from_is_named(redlock_nodes):
    manager = get_manager()
    lease = manager.acquire("report", ttl=30.0)
    lease.extend()
    redlock_nodes[2].kill()
    out = run_status()[0]  # 2 of 3 still vote: healthy
    label = manager.addresses[2].label
    assert f"not read from {label}: the node counts below leave it out" in out
    assert "report  2/3 nodes" in out
    payload = json.loads(run_status("--json")[0])
    assert payload["locks_unreachable"] == [label]
    lease.release()


@pytest.mark.parametrize("bad", ["0", "-3", "1.5", "many", ""])
def test_a_bad_limit_is_a_clear_error(redlock_nodes, bad):
    with pytest.raises(CommandError, match="--limit"):
        call_command("redlock_status", "--limit", bad)


def test_an_invalid_setting_is_a_command_error(settings):
    settings.REDLOCK = {"NODES": []}
    with pytest.raises(CommandError, match="REDLOCK is not usable"):
        run_status()


def test_semaphore_slots_and_readers_are_listed_without_tokens(redlock_nodes):
    manager = get_manager()
    slots = [manager.semaphore("api", 3).acquire(ttl=30.0, origin="tests:api") for _ in range(2)]
    readers = [manager.rwlock("table").read(ttl=30.0) for _ in range(2)]
    lock = manager.acquire("plain", ttl=30.0)
    listing = manager.locks()
    seen = [(info.name, info.kind, info.slot, info.partial) for info in listing.locks]
    assert seen == [
        ("api", "semaphore", 0, False),
        ("api", "semaphore", 1, False),
        ("plain", "lock", None, False),
        ("table", "read", None, False),
        ("table", "read", None, False),
    ]
    assert listing.locks[0].owner["origin"] == "tests:api"
    assert listing.locks[0].label == "api [semaphore slot 0]"
    out = run_status()[0]
    assert "api [semaphore slot 1]" in out
    assert "table [read]" in out
    payload = json.loads(run_status("--json")[0])
    text = json.dumps(payload)
    for lease in (*slots, *readers, lock):
        assert lease.token not in text
        assert lease.token not in out
    assert {entry["kind"] for entry in payload["locks"]} == {"lock", "semaphore", "read"}
    for lease in (*slots, *readers, lock):
        lease.release()
    released_everywhere(manager)


@pytest.mark.parametrize("bad", ["nan", "inf", "-1", "0", "soon"])
def test_a_bad_timeout_is_a_clear_error(redlock_nodes, bad):
    # A health check must not crash with a traceback (found by an adversarial test).
    with pytest.raises(CommandError, match="--timeout"):
        call_command("redlock_status", "--timeout", bad)
