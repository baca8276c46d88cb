"""``redlock_declare_fresh`` as the quarantine hint prints it is safe (issue 40, item 1): it
declares only nodes it can show are brand-new (no other node ever saw them vote), refuses a
node that other nodes saw vote (it may have forgotten locks) with the reason and the time it
still waits, and asks where it cannot tell. Real nodes, started as an operator starts them.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redlock import LockNotAcquired, get_manager
from django_redlock.core import witness
from django_redlock.core.health import status
from django_redlock.core.witness import REFRESH, VOTERS_KEY, VoteRecorder, field_of, judge
from django_redlock.localnodes import LocalCluster
from django_redlock.wire.nodes import parse_node
from tests.helpers import node_client

pytestmark = pytest.mark.slow

QUARANTINE_MS = 60_000
HORIZON_MS = QUARANTINE_MS + round(REFRESH * 1000)


def declare(*args: str) -> tuple[str, CommandError | None]:
    """Run the command as an operator would, without a terminal; its output and its error."""
    out = io.StringIO()
    try:
        call_command("redlock_declare_fresh", *args, stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


def votes(cluster: LocalCluster) -> list[str]:
    return [node.vote for node in status(get_manager(), record=False).nodes]


def kept_records_for(cluster: LocalCluster, index: int, ms: int) -> None:
    """Make node ``index`` a witness that has kept its records for ``ms`` in its current
    process, as one would after that long in service (the record's 'born' field)."""
    with node_client(cluster[index]) as client:
        run = client.info("server")["run_id"]
        seconds, micros = client.time()
        client.hset(VOTERS_KEY, "born", f"{run} {seconds * 1000 + micros // 1000 - ms}")


@pytest.fixture
def plain3(settings) -> Iterator[LocalCluster]:
    """Three plain nodes just started (no persistence, nothing declared, no records)."""
    with LocalCluster(3, fresh=False) as cluster:
        settings.REDLOCK = {"NODES": cluster.urls, "MAX_TTL": 60.0, "NODE_TIMEOUT": 0.5}
        yield cluster


def test_the_quarantine_hint_names_the_nodes_and_the_safe_command(plain3):
    with pytest.raises(LockNotAcquired) as raised:
        get_manager().acquire("x", blocking=False)
    text = str(raised.value)
    labels = [parse_node(url).label for url in plain3.urls]
    assert all(label in text for label in labels)
    # As printed, a command a shell runs (not "manage.py ...", which is not on PATH).
    command = "python manage.py redlock_declare_fresh (in a Django project)"
    assert f"; if they are brand-new, {command} lets them" in text
    assert "it declares only nodes it can show are brand-new, and asks about the rest" in text
    # Said once for all nodes, not once per node.
    assert text.count("redlock_declare_fresh") == 1
    assert "restarted" not in text  # a node just started is not called restarted
    refusing = [node for node, error in raised.value.node_errors.items() if "QUARANTINED" in error]
    assert len(refusing) >= 2  # a quorum refused (the third may not have been waited for)
    # Each node named once; nodes that refused alike share one refusal text.
    assert all(text.count(label) == 1 for label in labels)
    alike = {error for node, error in raised.value.node_errors.items() if "QUARANTINED" in error}
    assert text.count("not proven durable (appendonly no): votes again in") == len(alike)


def test_a_new_cluster_nobody_can_vouch_for_is_not_declared_without_confirmation(plain3):
    out, error = declare()
    assert error is not None
    assert out.count("cannot tell whether it ever voted") == 3
    assert out.count("no terminal to confirm on") == 3
    assert votes(plain3) == ["quarantined"] * 3
    out, error = declare("--yes")
    assert error is None, out
    assert out.count("declared fresh") == 3
    assert votes(plain3) == ["votes"] * 3


def test_a_node_seen_voting_that_restarted_empty_is_refused_as_printed(plain3):
    declare("--yes")
    get_manager().acquire("orders:1", ttl=30.0, blocking=False)  # a lease node 0 granted
    plain3[0].restart()  # a crash: it comes back empty
    assert votes(plain3) == ["quarantined", "votes", "votes"]
    for index in (1, 2):
        kept_records_for(plain3, index, HORIZON_MS + 1000)  # even with trusted witnesses
    out, error = declare()  # the hint, run as printed
    assert error is not None
    label = parse_node(plain3.urls[0]).label
    line = next(line for line in out.splitlines() if line.startswith(label))
    assert "not declared" in line
    # Seen by the status check (its process named) or by a client's grant ("a process").
    assert re.search(r"saw (a )?process", line)
    assert "it may have forgotten locks" in line
    left = int(line.split("it votes by itself in ")[1].split(" s")[0])
    assert 50 <= left <= 60
    assert votes(plain3)[0] == "quarantined"
    # Named, it asks; without a terminal it refuses; --yes is the operator's own decision.
    out, error = declare(label)
    assert error is not None
    assert "no terminal to confirm on" in out
    assert votes(plain3)[0] == "quarantined"
    out, error = declare(label, "--yes")
    assert error is None, out
    assert votes(plain3)[0] == "votes"


def test_a_brand_new_node_with_enough_witnesses_is_declared_at_once(plain3, monkeypatch):
    # Nodes 1 and 2 vote and have kept records for longer than the quarantine plus the
    # refresh; node 0 is brand-new: no node has a record of it. Were the clients not
    # recording their votes, that would prove nothing: the command would ask, and refuse
    # without a terminal.
    declare(plain3.urls[1], plain3.urls[2], "--yes")
    for index in (1, 2):
        kept_records_for(plain3, index, HORIZON_MS + 1000)
    monkeypatch.setattr(witness, "CLIENTS_RECORD_VOTES", False)
    out, error = declare()
    assert error is not None
    assert "clients do not record their votes yet" in out
    assert votes(plain3)[0] == "quarantined"
    # The clients record their votes: the same absence shows it is brand-new.
    monkeypatch.setattr(witness, "CLIENTS_RECORD_VOTES", True)
    out, error = declare()
    assert error is None, out
    assert "no node saw it vote" in out
    assert votes(plain3) == ["votes"] * 3
    # Its declaration is recorded on the others: after a crash it is no longer brand-new.
    with node_client(plain3[1]) as client:
        assert client.hget(VOTERS_KEY, field_of(parse_node(plain3.urls[0])))


def test_a_witness_that_restarted_recently_does_not_count(plain3):
    declare(plain3.urls[1], plain3.urls[2], "--yes")
    kept_records_for(plain3, 1, HORIZON_MS - 10_000)  # not long enough
    kept_records_for(plain3, 2, HORIZON_MS + 1000)
    with node_client(plain3[2]) as client:  # a record 'born' in an earlier process
        client.hset(VOTERS_KEY, "born", f"{'0' * 40} 1")
    out, error = declare(plain3.urls[0])
    assert error is not None
    assert "cannot tell whether it ever voted: 0 of the 2 other nodes" in out


def test_status_and_the_recorder_remember_who_voted(plain3):
    declare("--yes")
    manager = get_manager()
    for node in plain3:  # forget what the declarations recorded
        with node_client(node) as client:
            client.delete(VOTERS_KEY)
    status(manager)
    with node_client(plain3[0]) as client:
        assert client.hget(VOTERS_KEY, field_of(parse_node(plain3.urls[1])))
        client.delete(VOTERS_KEY)
    recorder = VoteRecorder(manager.addresses, refresh=0.05)
    with node_client(plain3[1]) as client:
        run = client.info("server")["run_id"]
    recorder.saw_vote(manager.addresses[1], run)
    deadline = time.monotonic() + 10
    with node_client(plain3[0]) as client:
        while client.hget(VOTERS_KEY, field_of(manager.addresses[1])) is None:
            assert time.monotonic() < deadline, "the recorder never wrote"
            time.sleep(0.01)
        record = client.hget(VOTERS_KEY, field_of(manager.addresses[1])).decode()
    assert record.split()[0] == run
    with node_client(plain3[1]) as client:  # never on the node itself
        assert client.hget(VOTERS_KEY, field_of(manager.addresses[1])) is None
    # It keeps refreshing while the process lives.
    rounds = recorder.written
    while recorder.written < rounds + 2:
        assert time.monotonic() < deadline, "the recorder never refreshed"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("answers", "verdict"),
    [
        ({"b": ("", HORIZON_MS), "c": ("", HORIZON_MS)}, "new"),
        ({"b": ("", HORIZON_MS), "c": None}, "new"),
        ({"b": ("", HORIZON_MS - 1), "c": None}, "unknown"),
        ({"b": ("", -1), "c": ("", -1)}, "unknown"),
        ({"b": None, "c": None}, "unknown"),
        ({"b": ("", HORIZON_MS), "c": ("abcdef 5000", -1)}, "seen"),
        ({"b": ("", HORIZON_MS), "c": ("run1 5000", HORIZON_MS)}, "seen"),
    ],
)
def test_the_rule(answers, verdict):
    found, _ = judge(
        "a", "run1", 30.0, answers, horizon_ms=HORIZON_MS, needed=1, clients_record=True
    )
    assert found == verdict
    # Were clients not recording their votes, a missing record would never show a node new.
    found, _ = judge(
        "a", "run1", 30.0, answers, horizon_ms=HORIZON_MS, needed=1, clients_record=False
    )
    assert found == ("unknown" if verdict == "new" else verdict)


def test_status_fails_on_a_misconfigured_node_even_with_a_quorum(cluster3, settings):
    # Issue 40, item 9: a db index the server does not have never heals by waiting.
    base = cluster3.urls[2]
    url = f"{base}?db=99" if base.startswith("unix://") else base.rsplit("/", 1)[0] + "/99"
    settings.REDLOCK = {"NODES": [*cluster3.urls[:2], url], "NODE_TIMEOUT": 0.5}
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"misconfigured: .*DB index is out of range"):
        call_command("redlock_status", stdout=out)
    text = out.getvalue()
    assert "MISCONFIGURED" in text
    assert "Quorum: 2 of 3 nodes vote, 2 needed, but 1 node misconfigured" in text


@pytest.mark.usefixtures("redlock_nodes")
def test_a_423_adds_no_warning_to_the_django_request_log(client, held_elsewhere, caplog):
    # Issue 40, item 9: each 423 used to add a Django WARNING line ("Locked: /pay/7/").
    caplog.set_level(logging.INFO, logger="django.request")
    with held_elsewhere("order:7"):
        response = client.get("/pay/7/")
    assert response.status_code == 423
    request_records = [r for r in caplog.records if r.name == "django.request"]
    assert [r.levelno for r in request_records] == [logging.INFO]  # logged once, as INFO


def test_e003_says_it_got_a_str(settings):
    from django_redlock.checks import check_settings

    settings.REDLOCK = {"NODES": "redis://:secret@127.0.0.1:6379/0"}
    (error,) = [m for m in check_settings() if m.id == "django_redlock.E003"]
    assert "got a str" in error.msg
    assert "secret" not in error.msg  # the value may carry a password


def test_a_node_timeout_error_names_the_setting():
    from django_redlock import QuorumUnreachable

    error = QuorumUnreachable(
        "x", 0, 2, {"a": "no answer within 50 ms", "b": "no answer within 50 ms"}
    )
    assert "REDLOCK['NODE_TIMEOUT']" in str(error)
    assert "node_timeout" in str(error)
