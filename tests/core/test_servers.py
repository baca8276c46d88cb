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
    assert servers.twins == {1: (0, "a")}
    assert servers.distinct(["a", "alias", "b"], [True, True, True]) == 2


def test_a_restart_keeps_the_twins_whichever_reconnects_first():
    servers = Servers(["a", "alias"])
    servers.report("a", "r1")
    servers.report("alias", "r1")
    servers.report("a", "r9")  # the server restarted: a reconnected first
    assert servers.twins == {1: (0, "a")}
    servers.report("alias", "r9")
    assert servers.twins == {1: (0, "a")}


def test_a_cluster_node_reaching_several_shards_is_not_its_own_twin():
    servers = Servers(["cluster", "other"])
    for run in ("s1", "s2", "s3"):
        servers.report("cluster", run)
    servers.report("other", "x")
    assert servers.twins == {}
    servers.report("other", "s2")  # two URLs of one cluster: one node
    assert servers.twins == {1: (0, "cluster")}


def test_keep_apart_refuses_the_twin_in_the_round_and_leaves_the_rest():
    answer = Round(3, b"OK", 2)
    kept = keep_apart(answer, [(b"x", None), (b"y", None), None], {1: (0, "a"), 2: (0, "a")})
    assert kept == [(b"x", None), None, None]
    assert isinstance(answer.results[1], NotSent)
    assert "same server as a" in str(answer.results[1])
    assert answer.no == 1  # node 2 had no command: nothing to refuse


def test_a_quorum_of_yes_from_twins_is_counted_again_one_per_server():
    # The first round on new connections: A and its alias both said yes before their
    # hellos told them apart, and B too: three yes, two servers, quorum 3 of 5.
    answer = Round(5, b"OK", 3)
    for index in (0, 1, 2):
        answer.record(index, b"OK")
    answer.pending = 2  # C and D still owe their replies
    assert answer.known()
    assert answer.counted_twice({1: (0, "a")})
    assert answer.yes == 2
    assert not answer.known()  # so the transport waits for C and D
    answer.record(3, b"OK")
    assert not answer.counted_twice({1: (0, "a")})  # three servers now: known, as it is
    assert answer.known()


def test_counted_twice_leaves_a_round_of_distinct_servers_alone():
    answer = Round(3, b"OK", 2)
    answer.record(0, b"OK")
    answer.record(2, b"OK")
    assert not answer.counted_twice({1: (0, "a")})  # the twin said nothing
    assert answer.yes == 2
    assert not answer.counted_twice({})
