"""What operators see and do about restarts: redlock_status by the acquire script's own rule,
redlock_declare_fresh, and the same refusal text everywhere.

The nodes here are started as an operator starts them (no declaration by the project).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from django_redlock import LockNotAcquired, get_manager
from django_redlock.core.health import status
from django_redlock.localnodes import LocalCluster

pytestmark = pytest.mark.slow


def command(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def operator_nodes(settings) -> Iterator[LocalCluster]:
    """Three plain nodes, just started, without persistence and not declared fresh."""
    with LocalCluster(3, fresh=False) as cluster:
        settings.REDLOCK = {"NODES": cluster.urls, "MAX_TTL": 60.0, "NODE_TIMEOUT": 0.5}
        yield cluster


def test_status_says_new_nodes_are_quarantined_and_exits_non_zero(operator_nodes, caplog):
    with pytest.raises(CommandError, match="no quorum: 0 of 3 nodes can vote"):
        command("redlock_status")
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("redlock_status", "--json", stdout=out)
    payload = json.loads(out.getvalue())
    node = payload["nodes"][0]
    assert (node["vote"], node["votes"]) == ("quarantined", False)
    assert 55 < node["votes_at"] - time.time() <= 61
    # The status shows the very text an acquire that the node refuses reports.
    with pytest.raises(LockNotAcquired) as info:
        get_manager().acquire("x", blocking=False)
    refusal = next(iter(info.value.node_errors.values()))
    assert refusal.split(";")[0] == node["vote_detail"].split(";")[0]
    assert "not proven durable (appendonly no)" in refusal
    assert "manage.py redlock_declare_fresh" in str(info.value)  # once, for all nodes
    # ... and the log says it too.
    assert any(refusal in record.getMessage() for record in caplog.records)


def test_declare_fresh_lets_them_vote_and_says_what_it_did(operator_nodes):
    # Just started, so no node can vouch for the others: the operator confirms (--yes).
    out = command("redlock_declare_fresh", "--node", operator_nodes[0].url, "--yes")
    assert out.count("declared fresh") == 1
    report = status(get_manager())
    assert [node.vote for node in report.nodes] == ["votes", "quarantined", "quarantined"]
    out = command("redlock_declare_fresh", "--yes")
    assert out.count("declared fresh") == 2
    assert out.count("nothing to do") == 1
    assert "Quorum: 3 of 3 nodes vote" in command("redlock_status")
    get_manager().acquire("first", blocking=False).release()
    # The declaration was for those processes: a restart is judged again.
    operator_nodes[1].restart()
    report = status(get_manager())
    assert [node.vote for node in report.nodes] == ["votes", "quarantined", "votes"]


def test_declare_fresh_refuses_an_unknown_node(operator_nodes):
    with pytest.raises(CommandError, match="is not one of this manager's nodes"):
        command("redlock_declare_fresh", "--node", "redis://127.0.0.1:1/0")


def test_status_is_bounded_by_one_timeout_with_nodes_paused(operator_nodes):
    command("redlock_declare_fresh", "--yes")
    operator_nodes[1].pause()
    operator_nodes[2].pause()
    try:
        started = time.monotonic()
        with pytest.raises(CommandError, match="no quorum: 1 of 3"):
            command("redlock_status", "--timeout", "2")
        elapsed = time.monotonic() - started
    finally:
        operator_nodes[1].resume()
        operator_nodes[2].resume()
    # Asked one after another, the two paused nodes would cost two timeouts (4 s) at least.
    assert elapsed < 3.5


@pytest.mark.django_db(transaction=True)
def test_the_admin_page_shows_the_same_refusal(operator_nodes, admin_client):
    page = admin_client.get(reverse("admin:django_redlock_activelock_changelist"))
    text = page.content.decode()
    assert text.count("quarantined until") == 3
    assert text.count("not proven durable (appendonly no)") >= 3
    assert "manage.py redlock_declare_fresh" in text
