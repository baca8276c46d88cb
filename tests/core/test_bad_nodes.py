"""Nodes that refuse us: wrong password, an ACL without EVALSHA, a full node, an interrupt."""

from __future__ import annotations

import time

import pytest
import redis

from django_redlock import LockManager, QuorumUnreachable
from django_redlock.core.health import status
from django_redlock.localnodes import LocalCluster
from tests.helpers import FakeClock, node_client


@pytest.fixture(scope="module")
def guarded():
    """Three nodes that require a password ("s3cret") for the default user."""
    with LocalCluster(3, password="s3cret") as cluster:
        yield cluster


def url_with(cluster, index: int, password: str) -> str:
    return str(cluster[index].url).replace(":s3cret@", f":{password}@")


def test_a_wrong_password_is_a_clear_node_error_never_shown(guarded):
    manager = LockManager([url_with(guarded, i, "wrong") for i in range(3)])
    started = time.monotonic()
    with pytest.raises(QuorumUnreachable) as info:
        manager.acquire("x", blocking=False)
    assert time.monotonic() - started < 1.0
    text = str(info.value)
    assert "login refused" in text
    assert "WRONGPASS" in text or "invalid password" in text
    assert "wrong" not in text.replace("wrong number", "").replace("WRONGPASS", "")
    report = status(manager)
    assert not report.healthy
    assert all(not node.reachable for node in report.nodes)


def test_the_right_password_works(guarded):
    manager = LockManager([url_with(guarded, i, "s3cret") for i in range(3)])
    manager.declare_fresh()
    manager.acquire("x", ttl=5.0).release()


def test_an_acl_user_without_evalsha_fails_clearly(cluster3):
    for node in cluster3:
        with node_client(node) as client:
            client.execute_command(
                "ACL", "SETUSER", "weak", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval"
            )
    manager = LockManager([node.url.replace("unix://", "unix://weak:pw@") for node in cluster3])
    with pytest.raises(QuorumUnreachable, match=r"NOPERM|no permissions"):
        manager.acquire("x", blocking=False)


def test_a_full_node_still_lets_the_holder_release(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("full", ttl=30.0)
    lease.extend()
    for node in cluster3:
        with node_client(node) as client:
            client.config_set("maxmemory", "1")  # every write that needs memory is refused
            client.config_set("maxmemory-policy", "noeviction")
    try:
        with pytest.raises(QuorumUnreachable, match="OOM"):
            LockManager(cluster3.urls).acquire("other", blocking=False)
        lease.release()  # DEL needs no memory: release.lua has no shebang, so it runs
    finally:
        for node in cluster3:
            with node_client(node) as client:
                client.config_set("maxmemory", "0")
    # The release returns at a quorum: node 0's own answer may still be on its way.
    deadline = time.monotonic() + 5.0
    with node_client(cluster3[0]) as client:
        while client.exists(lease.key) != 0:
            assert time.monotonic() < deadline, "node 0 never applied the release"
            time.sleep(0.005)


def test_an_interrupt_during_acquire_leaves_no_key_behind(cluster3):
    clock = FakeClock()
    calls = 0

    def interrupting_clock() -> float:
        nonlocal calls
        calls += 1
        if calls == 2:  # right after the nodes answered: the SETs have landed
            raise KeyboardInterrupt
        return clock()

    manager = LockManager(cluster3.urls, clock=interrupting_clock)
    with pytest.raises(KeyboardInterrupt):
        manager.acquire("interrupted", ttl=30.0, blocking=False)
    deadline = time.monotonic() + 5
    while True:
        keys = []
        for node in cluster3:
            with node_client(node) as client:
                keys.extend(client.keys("redlock:interrupted*"))
        if not keys:
            break
        assert time.monotonic() < deadline, f"left behind: {keys}"


def test_the_python_client_rejects_our_redacted_urls_never(guarded):
    # A URL carrying a password works for plain redis-py too (the node really checks it).
    with redis.Redis.from_url(url_with(guarded, 0, "s3cret"), socket_timeout=2) as client:
        assert client.ping()
