"""The Redlock steps as plain functions (``django_redlock.procedures.flow``): no I/O, so they are
tested directly on made-up replies, with the clock and the jitter passed in."""

from __future__ import annotations

import secrets

import pytest

from django_redlock.exceptions import LockContended, QuorumUnreachable
from django_redlock.procedures import flow
from django_redlock.procedures.shapes import Many, Shape, SlotDecider, Slots
from django_redlock.wire import scripts
from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError, NotSent
from django_redlock.wire.scripts import GRANTED

NODES = flow.Nodes(("n0", "n1", "n2"), 2, 0.05, 0.01, 0.2)


def middle(low: float, high: float) -> float:
    """A jitter that always picks the middle: delays become exact."""
    return (low + high) / 2


def acquire(**changes: object) -> flow.Acquire:
    fields: dict[str, object] = {
        "nodes": NODES,
        "name": "job",
        "key": "redlock:job",
        "ttl": 10.0,
        "owner": "{}",
        "blocking": True,
        "started": 100.0,
        "deadline": 105.0,
        "waiter": "listener.nonce",
        "ticket": 1,
        "lifetime_ms": 1000,
        "uniform": middle,
    }
    fields.update(changes)
    return flow.Acquire(**fields)  # type: ignore[arg-type]


def test_validity_is_ttl_less_elapsed_less_drift():
    # The spec's step 3: ttl - elapsed - (ttl * drift + 2 ms).
    assert flow.validity(10.0, 0.25, 0.01) == pytest.approx(10.0 - 0.25 - 0.102)
    assert flow.validity(0.6, 0.6, 0.01) < 0


def test_a_quorum_in_time_is_a_grant_valid_until_ttl_less_drift_after_the_start():
    attempt = acquire()
    attempt.next_round(60_000)
    step = attempt.judge([GRANTED, GRANTED, 4_000], 2, 100.0, 100.25)
    assert isinstance(step, flow.Granted)
    assert step.token == attempt.token
    assert step.acquired_at == 100.25
    assert step.expires_at == pytest.approx(100.0 + 10.0 - 0.102)


def test_a_quorum_that_came_too_late_is_no_grant_and_is_released_where_it_landed():
    attempt = acquire(blocking=False, deadline=100.0, waiter="")
    attempt.next_round(60_000)
    step = attempt.judge([GRANTED, GRANTED, TIMED_OUT], 2, 100.0, 111.0)
    assert isinstance(step, flow.Failed)
    assert isinstance(step.error, QuorumUnreachable)
    assert "nothing left of the lease" in step.error.reason
    assert set(step.error.node_errors) <= set(attempt.nodes.labels)  # node labels only
    assert step.give_up
    assert attempt.left_line() is None  # a single try never queued
    assert all(command is not None for command in step.clean_up)  # the timed-out one too


def test_a_lost_round_cleans_up_only_where_its_set_may_have_landed():
    attempt = acquire(waiter="")  # a waiter keeps its token's keys (see the hand-off tests)
    attempt.next_round(60_000)
    step = attempt.judge([GRANTED, 3_000, NotSent("unreachable")], 1, 100.0, 100.001)
    assert isinstance(step, flow.Failed)
    assert isinstance(step.error, LockContended)
    granted, held, not_sent = step.clean_up
    assert granted is not None
    assert attempt.token.encode() in granted[0]
    assert held is None  # another holder's key: nothing of ours there
    assert not_sent is None  # the SET never left


def test_an_interrupted_round_is_released_everywhere():
    attempt = acquire()
    attempt.next_round(60_000)
    assert all(command is not None for command in attempt.interrupted())


def test_a_blocking_acquire_retries_after_a_jittered_delay_then_gives_up_and_leaves_the_line():
    attempt = acquire()
    attempt.next_round(60_000)
    step = attempt.judge([3_000, 3_000, 3_000], 0, 100.0, 100.001)
    assert isinstance(step, flow.Failed)
    assert not step.give_up
    assert step.delay == pytest.approx(0.2)  # the middle of 0.2 ± 50 %
    attempt.next_round(60_000)
    late = attempt.judge([3_000, 3_000, 3_000], 0, 104.9, 105.0)
    assert isinstance(late, flow.Failed)
    assert late.give_up
    leave = attempt.left_line()
    assert leave is not None
    assert len(leave) == 3
    assert late.waited == pytest.approx(5.0)
    assert late.error.attempts == 2


def test_each_round_has_a_fresh_token():
    attempt = acquire(waiter="")  # a waiter's token is its hand-off token (below)
    attempt.next_round(60_000)
    first = attempt.token
    attempt.next_round(60_000)
    assert attempt.token != first
    assert len(attempt.token) == 40


def test_polls_without_a_wake_up_back_off_up_to_a_fifth_of_a_places_life():
    delays = [flow.retry_delay(0.05, 0.0, None, polls, middle) for polls in range(6)]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.2, 0.2, 0.2])  # cap: max(1, 0.2) / 5
    assert flow.retry_delay(0.2, 10.0, 10.05, 0, middle) == pytest.approx(0.05)  # the deadline


def test_a_wait_that_was_woken_does_not_back_off():
    attempt = acquire()
    attempt.waited(True)
    assert attempt.polls == 0
    attempt.waited(False)
    assert attempt.polls == 1


def test_contended_or_unreachable_depends_on_how_many_nodes_failed():
    error = NodeError("connection refused")
    contended = flow.failure(NODES, "job", [3_000, error, PENDING], 0, 0.001, 1)
    assert isinstance(contended, LockContended)
    assert contended.node_errors == {"n1": "connection refused"}
    unreachable = flow.failure(NODES, "job", [3_000, error, TIMED_OUT], 0, 0.001, 1)
    assert isinstance(unreachable, QuorumUnreachable)
    assert unreachable.node_errors["n2"] == "no answer within 50 ms"


def test_an_extend_is_judged_on_a_quorum_in_time():
    assert flow.judge_extend(NODES, 10.0, 200.0, 150.0, 150.5, [1, 1, -1]) == (
        pytest.approx(10.0 - 0.5 - 0.102)
    )
    late = flow.judge_extend(NODES, 10.0, 150.2, 150.0, 150.5, [1, 1, 1])
    assert isinstance(late, flow.Lost)
    assert late.cause == "expired"


def test_keys_a_node_lost_are_set_again_while_the_lease_can_still_hold_its_quorum():
    """Re-created keys (2) count with the renewed ones only while the renewed and the silent
    nodes could still be the quorum the lease held."""
    # One renewed, one set again, one silent: it may still hold node 2, so it holds now.
    kept = flow.judge_extend(NODES, 10.0, 200.0, 150.0, 150.5, [1, 2, TIMED_OUT])
    assert kept == pytest.approx(10.0 - 0.5 - 0.102)
    # Gone from two of three (an operator's force release): lost, whatever it set again.
    gone = flow.judge_extend(NODES, 10.0, 200.0, 150.0, 150.5, [1, 2, 2])
    assert gone == flow.Lost(
        "gone",
        "no longer held by a quorum (renewed on 1 of 3 nodes, 2 had lost it (set again), 0 held "
        "it for another token, 0 did not answer: n1: had lost it (set again); n2: had lost it "
        "(set again))",
    )


def test_an_extend_taken_by_another_token_on_a_quorum_is_lost_at_once():
    taken = flow.judge_extend(NODES, 10.0, 200.0, 150.0, 150.5, [-1, -1, 1])
    assert isinstance(taken, flow.Lost)
    assert taken.cause == "taken"
    assert "renewed on 1 of 3 nodes, 0 had lost it (set again), 2 held it for another token" in (
        taken.reason
    )


def test_an_extend_without_a_quorum_either_way_decides_nothing():
    """One renewed, two silent: the lease keeps its validity (Missed), and the text counts
    each answer apart."""
    missed = flow.judge_extend(NODES, 10.0, 200.0, 150.0, 150.05, [1, TIMED_OUT, TIMED_OUT])
    assert isinstance(missed, flow.Missed)
    assert (missed.renewed, missed.refused) == (1, 0)
    assert missed.node_errors == {"n1": "no answer within 50 ms", "n2": "no answer within 50 ms"}
    assert missed.reason.startswith(
        "renewed on 1 of 3 nodes, 0 had lost it (set again), 0 held it for another token, "
        "2 did not answer"
    )
    # Replies not waited for (the round ended early) count as silent, and are said apart.
    waived = flow.judge_extend(NODES, 10.0, 200.0, 150.0, 150.05, [1, PENDING, TIMED_OUT])
    assert isinstance(waived, flow.Missed)
    assert "1 did not answer, 1 not waited for" in waived.reason


def test_a_release_is_lost_when_too_many_nodes_no_longer_held_it():
    assert flow.judge_release(NODES, [1, 1, 1], 3, False) == flow.ReleaseVerdict(None, None)
    partial = flow.judge_release(NODES, [1, TIMED_OUT, TIMED_OUT], 1, False)
    assert partial.lost is None
    assert partial.partial is not None
    assert "n1: no answer within 50 ms" in partial.partial
    lost = flow.judge_release(NODES, [1, 0, 0], 1, False)
    assert lost.lost is not None
    assert lost.lost.startswith("only 1 of 3 nodes still held it")
    expired = flow.judge_release(NODES, [1, 1, 1], 3, True)
    assert expired.lost == "the lease expired before it was released"


def test_the_holder_is_the_owner_found_on_most_nodes():
    mine, other = b'{"host": "a", "pid": 1}', b'{"host": "b", "pid": 2}'
    found = flow.holder_of([[mine, 5_000], [mine, 7_000], [other, 9_000]])
    assert found == {"host": "a", "pid": 1, "nodes": 2, "ttl": 7.0}
    assert flow.is_locked(NODES, found)
    assert flow.holder_of([None, TIMED_OUT, NodeError("down")]) is None
    assert flow.holder_of([[b"not json", 1_000]]) == {"raw": "not json", "nodes": 1, "ttl": 1.0}


def test_a_summary_names_each_node_that_did_not_do_its_part():
    results = [GRANTED, 4_000, TIMED_OUT]
    assert flow.summarise(NODES, results) == (
        "n1: held by another for 4000 ms; n2: no answer within 50 ms"
    )
    assert flow.summarise(NODES, [1, 0, 1], of_lease=True) == "n1: not held"
    assert flow.summarise(NODES, [1, 1, 1], of_lease=True) == "no errors"


def test_an_adopted_lease_gets_what_the_quorum_th_longest_key_has_left():
    # 9 s, 5 s and 2 s left on the three nodes: a quorum of 2 guarantees 5 s, minus the
    # round's time and the drift term (ttl 10 s: 0.1 s + 2 ms).
    left = flow.judge_adopt(NODES, "x", 10.0, [9000, 2000, 5000], elapsed=0.5)
    assert left == pytest.approx(5.0 - 0.5 - 0.102)


def test_an_adopt_refused_on_a_majority_is_a_lost_lease():
    verdict = flow.judge_adopt(NODES, "x", 10.0, [9000, -2, -2], elapsed=0.01)
    assert isinstance(verdict, str)
    assert "adopted on 1 of 3 nodes" in verdict
    assert "n1: not held" in verdict
    assert "n2: not held" in verdict
    assert isinstance(flow.judge_adopt(NODES, "x", 10.0, [50, 60, -2], elapsed=0.01), str)


def test_an_adopt_too_few_nodes_answered_is_quorum_unreachable():
    # One refusal is not a majority: the nodes that did not answer may still hold the
    # handle's token, so the lease is not known to be gone (and the keys are handed back).
    for results in ([9000, -2, TIMED_OUT], [TIMED_OUT, TIMED_OUT, 9000]):
        verdict = flow.judge_adopt(NODES, "x", 10.0, results, elapsed=0.01)
        assert isinstance(verdict, QuorumUnreachable)
        assert (verdict.name, verdict.votes, verdict.quorum) == ("x", 1, 2)
        assert verdict.node_errors


def test_a_grant_round_tells_which_nodes_may_hold_the_lease():
    """A node may hold a won lease when it granted it, or when its answer was not heard (a
    timeout, a reply not waited for: its SET may have landed). A QUARANTINED refusal or a
    command that never left wrote nothing (the vote gate runs before any write), so such a
    node does not hold it: counting it would let a renewal think the lease still held there."""
    from django_redlock.procedures.shapes import Shape

    quarantined = NodeError(
        "QUARANTINED up 1 s, not proven durable (appendonly no): votes again in 59 s"
    )
    replies = [GRANTED, quarantined, TIMED_OUT, NotSent("refused"), PENDING, 3_000]
    assert Shape("k").granted_on(replies) == (True, False, True, False, True, False)


def test_a_grant_round_heard_from_every_node_or_not_waited_for_holds_everywhere():
    """The usual won round (grants, and replies not waited for: PENDING) is counted in C, not
    judged node by node: the same answer as the per-node rule, for every mix of the two."""
    from django_redlock.procedures.shapes import Shape

    for replies in ([GRANTED] * 5, [GRANTED, PENDING, GRANTED, PENDING, GRANTED], [PENDING]):
        assert Shape("k").granted_on(replies) == (True,) * len(replies)
    # One reply that is neither (here a refusal) leaves the per-node rule to answer.
    assert Shape("k").granted_on([GRANTED, PENDING, 3_000]) == (True, True, False)


# -- a waiter that takes hand-off grants (scripts/hand_grant.lua) ---------------------------


def test_a_waiter_keeps_one_token_numbers_its_rounds_and_yields_only_to_older_waiters():
    attempt = acquire()
    assert attempt.hand
    first = attempt.next_round(60_000)[0][0]
    token = attempt.token
    assert first.endswith(b"$1\r\n1\r\n")  # ARGV[8]: round 1
    step = attempt.judge([GRANTED, 3_000, TIMED_OUT], 1, 100.0, 100.001)
    assert isinstance(step, flow.Failed)
    # The node that granted it is not released: it is yielded to an older waiter there, if
    # any (hand_yield.lua). The node that did not answer may run the try late: released
    # right behind it, unless a later try ran there (hand_undo.lua). The one that refused
    # holds nothing of it.
    granted, refused, silent = step.clean_up
    assert granted is not None
    assert scripts.HAND_YIELD.sha in granted[0]
    assert refused is None
    assert silent is not None
    assert scripts.HAND_UNDO.sha in silent[0]
    assert token.encode() in silent[0]
    # Neither counts until a later reply: grants naming round 1 from them are ignored.
    assert attempt.hear_grants({0: 1, 2: 1}, 100.5) is None
    second = attempt.next_round(60_000)[0][0]
    assert attempt.token == token
    assert second.endswith(b"$1\r\n2\r\n")
    # Leaving frees the token on every node (a grant may be anywhere) and drops the place.
    leave = attempt.left_line()
    assert leave is not None
    assert len(leave) == 3
    for command in leave:
        assert token.encode() in command[0]
        assert b"listener.nonce" in command[0]


def test_a_semaphore_or_single_try_takes_no_grants():
    assert not acquire(waiter="").hand
    from django_redlock.procedures.shapes import Slots

    assert not acquire(shape=Slots("redlock:job", 2, 3)).hand


def test_grants_heard_count_from_the_send_time_of_the_round_they_name():
    attempt = acquire()
    attempt.next_round(60_000)
    attempt.judge([3_000, 3_000, 3_000], 0, 100.0, 100.01)  # round 1, sent at 100.0
    attempt.next_round(60_000)
    attempt.judge([3_000, 3_000, 3_000], 0, 101.0, 101.01)  # round 2, sent at 101.0
    # One grant is not a quorum: keep waiting.
    assert attempt.hear_grants({0: 2}, 102.0) is None
    held = attempt.hear_grants({1: 2}, 102.5)
    assert isinstance(held, flow.Granted)
    assert held.token == attempt.token
    assert held.acquired_at == 102.5
    # From round 2's send time, not from when the grants were heard: 101 + ttl - drift.
    assert held.expires_at == pytest.approx(101.0 + 10.0 - 0.102)
    assert attempt.granted_results() == [GRANTED, GRANTED, 3_000]


def test_the_validity_of_grants_is_that_of_the_quorum_th_latest_grant():
    nodes = flow.Nodes(("n0", "n1", "n2", "n3", "n4"), 3, 0.05, 0.01, 0.2)
    attempt = acquire(nodes=nodes)
    attempt.next_round(60_000)
    attempt.judge([3_000] * 5, 0, 100.0, 100.05)
    for sent in (101.0, 102.0):
        attempt.next_round(60_000)
        attempt.judge([3_000, 3_000, NotSent("x"), 3_000, 3_000], 0, sent, sent + 0.05)
    # Nodes 0 and 1 granted after round 3, node 2 after round 1 (its later tries never left).
    held = attempt.hear_grants({0: 3, 1: 3, 2: 1}, 103.0)
    assert isinstance(held, flow.Granted)
    assert held.expires_at == pytest.approx(100.0 + 10.0 - 0.102)


def test_a_grant_older_than_the_last_reply_heard_from_its_node_is_stale():
    attempt = acquire()
    attempt.next_round(60_000)
    attempt.judge([3_000, 3_000, 3_000], 0, 100.0, 100.01)
    attempt.next_round(60_000)
    attempt.judge([3_000, 3_000, 3_000], 0, 101.0, 101.01)
    # Node 0's grant named round 1, but node 0 refused round 2 after it: that grant is gone
    # (it expired, or was never ours to count).
    assert attempt.hear_grants({0: 1, 1: 2}, 101.5) is None
    # A grant naming no round of this acquire counts for nothing.
    assert attempt.hear_grants({0: 7}, 101.5) is None
    assert isinstance(attempt.hear_grants({0: 2}, 101.5), flow.Granted)


def test_grants_with_no_validity_left_ask_for_one_more_round():
    attempt = acquire(deadline=200.0)
    attempt.next_round(60_000)
    attempt.judge([3_000, 3_000, 3_000], 0, 100.0, 100.01)
    assert attempt.hear_grants({0: 1, 1: 1}, 109.95) is None
    # That round answers granted where the grants are (its try renews them): held from it.
    attempt.next_round(60_000)
    step = attempt.judge([GRANTED, GRANTED, 3_000], 2, 110.0, 110.01)
    assert isinstance(step, flow.Granted)


def test_a_waiter_waits_for_a_quorum_of_grants():
    attempt = acquire()
    attempt.next_round(60_000)
    step = attempt.judge([3_000, 3_000, 3_000], 0, 100.0, 100.001)
    assert isinstance(step, flow.Failed)
    action = attempt.after(step)
    assert isinstance(action, flow.Subscribe)
    wait = attempt.subscribed(False, action.delay)
    assert isinstance(wait, flow.Wait)
    assert wait.need == 2
    assert acquire(waiter="").after(step).__class__ is flow.Sleep


def test_a_grant_from_a_node_whose_reply_was_lost_counts_its_clean_up_spares_grants():
    attempt = acquire()
    attempt.next_round(60_000)
    attempt.judge([3_000, 3_000, 3_000], 0, 100.0, 100.01)
    attempt.next_round(60_000)
    step = attempt.judge([3_000, TIMED_OUT, 3_000], 0, 101.0, 101.06)
    assert isinstance(step, flow.Failed)
    # Node 1's try may land late: undone behind it, but never a grant (hand_undo.lua).
    assert step.clean_up[0] is None
    assert step.clean_up[1] is not None
    assert scripts.HAND_UNDO.sha in step.clean_up[1][0]
    held = attempt.hear_grants({0: 2, 1: 1}, 101.5)
    assert isinstance(held, flow.Granted)
    assert held.expires_at == pytest.approx(100.0 + 10.0 - 0.102)  # from round 1


# -- the managers' first try (flow.FirstTry): the round and the rule of Acquire ------------


def first_try(monkeypatch: pytest.MonkeyPatch, shape: Shape, waiter: str) -> flow.FirstTry:
    monkeypatch.setattr(secrets, "token_hex", lambda size: "t" * (2 * size))
    return flow.FirstTry(
        NODES, "job", "redlock:job", shape, 10.0, "{}", True, 100.0, waiter, 7, 1000, 60_000
    )


@pytest.mark.parametrize("waiter", ["", "listener.nonce"])
@pytest.mark.parametrize(
    "shape",
    [Shape("redlock:job"), Slots("redlock:job", 3, NODES.size), Many(["redlock:a", "redlock:b"])],
    ids=["lock", "semaphore", "many"],
)
def test_the_first_try_sends_what_the_flows_first_round_sends(monkeypatch, shape, waiter):
    # The managers' fast path builds the first round without the flow: it must be the very
    # round Acquire.next_round builds first (a waiter taking grants sends round number 1).
    first = first_try(monkeypatch, shape, waiter)
    attempt = acquire(shape=shape, waiter=waiter, ticket=7)
    assert first.commands[0][0] == attempt.next_round(60_000)[0][0]
    assert len(first.commands) == NODES.size
    assert first.token == attempt.token
    if isinstance(attempt.decider, SlotDecider):  # one per round: it counts the replies
        assert isinstance(first.decider, SlotDecider)
        assert (first.decider.quorum, first.decider.left) == (
            attempt.decider.quorum,
            attempt.decider.left,
        )
    else:
        assert first.decider == attempt.decider
    assert first.need == attempt.need
    # The flow that takes over after it is the one that sent that round.
    resumed = flow.Acquire.after_first(first, 105.0, True)
    assert (resumed.attempts, resumed.token, resumed.hand) == (1, first.token, attempt.hand)
    sent = [
        [command and command[0] for command in round_]
        for round_ in (resumed.interrupted(), first.interrupted(), attempt.interrupted())
    ]
    assert sent[0] == sent[1] == sent[2]


@pytest.mark.parametrize("votes", [0, 1, 2, 3])
@pytest.mark.parametrize("elapsed", [0.0, 0.25, 9.897, 9.899, 11.0])
def test_the_first_try_wins_exactly_when_the_flow_would(monkeypatch, votes, elapsed):
    # One rule (flow.won) for both: a quorum and validity left (ttl - elapsed - drift).
    first = first_try(monkeypatch, Shape("redlock:job"), "")
    results = [GRANTED] * votes + [4_000] * (NODES.size - votes)
    left = first.judge(results, votes, 100.0, 100.0 + elapsed)
    attempt = acquire(waiter="", ticket=7)
    attempt.next_round(60_000)
    step = attempt.judge(results, votes, 100.0, 100.0 + elapsed)
    if isinstance(step, flow.Granted):
        assert left == pytest.approx(step.expires_at - step.acquired_at)
        assert left > 0
    else:
        assert left == 0.0
    assert first.votes == attempt.votes


def test_nodes_refusing_connections_end_a_blocking_acquire_after_one_more_round():
    # Issue 40: a total outage (connections refused outright) cannot make a quorum; the flow
    # sleeps one node timeout (never subscribes: there is nobody to hear), tries once more,
    # then gives up saying so, instead of retrying every retry_delay until its deadline.
    refused = [NotSent("connection refused")] * 3
    attempt = acquire()
    attempt.token = "t" * 40
    first = attempt.judge(refused, 0, 100.0, 100.001)
    assert isinstance(first, flow.Failed)
    assert not first.give_up
    assert first.delay == NODES.node_timeout
    pause = attempt.after(first)
    assert isinstance(pause, flow.Sleep)
    assert pause.delay == NODES.node_timeout
    second = attempt.judge(refused, 0, 100.06, 100.061)
    assert isinstance(second, flow.Failed)
    assert second.give_up
    assert "the nodes refuse connections" in str(second.error)
    # Near its deadline, the pause never runs past it.
    late = acquire(deadline=100.02)
    late.token = "t" * 40
    step = late.judge(refused, 0, 100.0, 100.001)
    assert isinstance(step, flow.Failed)
    assert step.delay <= 100.02 - 100.001
    # One node of three refusing changes nothing: a quorum is still possible.
    one = acquire()
    one.token = "t" * 40
    step = one.judge([NotSent("connection refused"), 5_000, 5_000], 0, 100.0, 100.001)
    assert isinstance(step, flow.Failed)
    assert not step.give_up
    assert one.outage == 0
    # Nor does a caller who asked to wait (no deadline): it keeps trying.
    patient = acquire(deadline=None)
    patient.token = "t" * 40
    for _ in range(3):
        step = patient.judge(refused, 0, 100.0, 100.001)
        assert isinstance(step, flow.Failed)
        assert not step.give_up
