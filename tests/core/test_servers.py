"""Which server each node reached (wire/servers.py): twins by run_id, kept through restarts
and across a cluster node's shards. No process: the reports are what hellos would say."""

from __future__ import annotations

from django_redlock.wire.errors import NotSent
from django_redlock.wire.rounds import Round
from django_redlock.wire.servers import Servers, keep_apart


def test_the_later_of_two_labels_on_one_run_id_is_the_twin_whichever_reported_first():
    servers = Servers(["a", "alias", "b"])
    servers.report("alias", "r1")
    servers.report("b", "r2")
    assert servers.twins == {}
    servers.report("a", "r1")
    assert servers.same == {"alias": "a"}
    assert servers.twins == {1: "a"}
    assert servers.distinct(["a", "alias", "b"], [True, True, True]) == 2


def test_a_restart_keeps_the_twins_whichever_reconnects_first():
    servers = Servers(["a", "alias"])
    servers.report("a", "r1")
    servers.report("alias", "r1")
    servers.report("a", "r9")  # the server restarted: a reconnected first
    assert servers.twins == {1: "a"}
    servers.report("alias", "r9")
    assert servers.twins == {1: "a"}


def test_a_cluster_node_reaching_several_shards_is_not_its_own_twin():
    servers = Servers(["cluster", "other"])
    for run in ("s1", "s2", "s3"):
        servers.report("cluster", run)
    servers.report("other", "x")
    assert servers.twins == {}
    servers.report("other", "s2")  # two URLs of one cluster: one node
    assert servers.twins == {1: "cluster"}


def test_keep_apart_refuses_the_twin_in_the_round_and_leaves_the_rest():
    answer = Round(3, b"OK", 2)
    kept = keep_apart(answer, [(b"x", None), (b"y", None), None], {1: "a", 2: "a"})
    assert kept == [(b"x", None), None, None]
    assert isinstance(answer.results[1], NotSent)
    assert "same server as a" in str(answer.results[1])
    assert answer.no == 1  # node 2 had no command: nothing to refuse
