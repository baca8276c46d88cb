"""What an operator reads: the acquire errors' text, the status lines, and why a node could
not be read. No server is started here except where a real connection failure is the input:
the failures come from redis-py itself, connecting to a port and a socket path where nothing
listens."""

from __future__ import annotations

import socket
import tempfile

import pytest
import redis

from django_redlock.core.health import unreachable
from django_redlock.core.listing import LockInfo
from django_redlock.exceptions import LockContended, QuorumUnreachable
from django_redlock.management.commands.redlock_status import _lock_columns

REFUSAL = "QUARANTINED up 0 s, not proven durable (appendonly no): votes again in 60 s"
NODES = [f"10.0.0.{n}:6379/0" for n in range(5)]


def quarantined_on_three_of_five() -> QuorumUnreachable:
    """The error a process gets from five nodes just restarted: three refused alike, two
    were not waited for (three refusals already made a quorum impossible)."""
    errors = dict.fromkeys(NODES[:3], REFUSAL)
    answers = {**errors, NODES[3]: "not waited for", NODES[4]: "not waited for"}
    return QuorumUnreachable(
        "b", 0, 3, errors, retry_after=60.0, quarantined=60.0, node_answers=answers
    )


def test_a_quarantine_names_each_node_once_and_says_each_refusal_once():
    text = str(quarantined_on_three_of_five())
    assert all(text.count(node) == 1 for node in NODES)
    assert text.count("(appendonly no): votes again in 60 s") == 1  # three alike, said once
    assert text.count("redlock_declare_fresh") == 1
    assert "3 nodes quarantined since they started, not proven to have kept their locks" in text
    assert f"{', '.join(NODES[:3])}: quarantined, up 0 s, not proven durable" in text


def test_one_node_is_one_node():
    errors = {NODES[0]: REFUSAL}
    error = QuorumUnreachable("b", 0, 1, errors, quarantined=60.0, node_answers=errors)
    text = str(error)
    assert "0 of 1 vote needed from 1 node after 1 attempt;" in text
    assert "1 node quarantined since it started, not proven to have kept its locks;" in text
    assert "if it is brand-new, python manage.py redlock_declare_fresh (in a Django project) " in (
        text
    )
    assert "lets it vote now" in text


def test_a_node_not_waited_for_says_why_it_is_not_in_the_count():
    text = str(quarantined_on_three_of_five())
    assert f"{NODES[3]}, {NODES[4]}: not waited for (the outcome was known without it)" in text


def test_nodes_that_answered_differently_stay_apart_in_the_order_they_came():
    answers = {
        NODES[0]: "held by another holder, 9.5 s left",
        NODES[1]: "granted",
        NODES[2]: "held by another holder, 9.5 s left",
    }
    text = str(LockContended("a", 1, 2, node_answers=answers))
    assert text.endswith(
        f"(nodes: {NODES[0]}, {NODES[2]}: held by another holder, 9.5 s left; {NODES[1]}: granted)"
    )


def test_a_contended_lock_says_the_time_left_in_seconds_as_the_rest_of_the_text(cluster3):
    from django_redlock.redlock import LockManager

    holder = LockManager(cluster3.urls)
    rival = LockManager(cluster3.urls)
    try:
        holder.acquire("contended", ttl=30.0)
        with pytest.raises(LockContended) as raised:
            rival.acquire("contended", blocking=False)
    finally:
        holder.close()
        rival.close()
    text = str(raised.value)
    assert " s left" in text
    assert " ms " not in text


def _lock(origin: str | None, partial: bool = False) -> LockInfo:
    owner = {"host": "web-3", "pid": 4242}
    if origin is not None:
        owner["origin"] = origin
    return LockInfo("orders:42", 2, 3, partial, 27.4, 27.5, owner)


def test_a_status_lock_line_says_who_holds_it_and_never_ends_in_a_blank():
    line = "  ".join(_lock_columns(_lock(None)))
    assert line == "orders:42  2/3 nodes  27.4 s left  held by web-3 pid 4242"
    line = "  ".join(_lock_columns(_lock("view:shop.views.pay", partial=True)))
    assert line.endswith("held by web-3 pid 4242 in view:shop.views.pay  (partial: leftover keys)")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _error_from(client: redis.Redis) -> redis.RedisError:
    with pytest.raises(redis.RedisError) as raised:
        client.ping()
    client.close()
    return raised.value


def test_a_port_nobody_listens_on_is_said_in_words():
    error = _error_from(redis.Redis(port=_free_port(), socket_connect_timeout=1.0))
    assert unreachable(error, 0.25) == "connection refused (nothing listens at this address)"


def test_a_missing_socket_file_is_said_in_words():
    with tempfile.TemporaryDirectory() as folder:
        error = _error_from(redis.Redis(unix_socket_path=f"{folder}/none.sock"))
    assert unreachable(error, 0.25) == "no such file or directory (no server's socket at this path)"


def test_a_timeout_says_how_long_was_waited():
    assert unreachable(redis.TimeoutError("Timeout connecting to server"), 0.25) == (
        "no answer within 250 ms (stopped, paused or unreachable)"
    )


def test_a_refusal_keeps_the_servers_own_words():
    refusal = redis.ResponseError("DB index is out of range")
    assert unreachable(refusal, 0.25) == "DB index is out of range"


def test_the_errors_page_shows_every_error_class_in_its_tree():
    from pathlib import Path

    from django_redlock import exceptions

    page = (Path(__file__).parents[2] / "docs" / "reference" / "errors.md").read_text()
    tree = page.split("```", 2)[1]
    for name in exceptions.__all__:
        assert f"── {name} " in tree or f"{name}  " in tree.splitlines()[1], name
