"""Deliberately broken variants of the library, each of which the simulator must catch.

A mutant changes one rule for the length of one history: a flow function patched in
``procedures/flow.py``, a line of a shipped procedure (``django_redlock/procedures/``: the code the
managers run, compiled again with the line changed), or one script's text replaced on the
simulated nodes (the override is keyed by the real script's SHA1, so the clients send exactly
the commands they always send).
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django_redlock.procedures import acquire as acquire_procedure
from django_redlock.procedures import flow
from django_redlock.procedures import lease as lease_procedures
from django_redlock.procedures.shapes import Slots
from django_redlock.wire import primitives, scripts
from tests.sim import fence
from tests.sim.lua_node import LIBRARY_SCRIPTS


def _replace(script: scripts.Script, old: str, new: str) -> dict[bytes, bytes]:
    source = script.source.decode()
    if old not in source:
        raise AssertionError(f"mutant out of date: {old!r} is no longer in the script")
    return {script.sha: source.replace(old, new, 1).encode()}


def _no_drift() -> Iterator[dict[bytes, bytes]]:
    """Validity without the drift term: ``ttl - elapsed``."""
    saved = flow.validity
    flow.validity = lambda ttl, elapsed, drift_factor: ttl - elapsed
    try:
        yield {}
    finally:
        flow.validity = saved


def _in_every_granting_script(rule: str, new: str) -> dict[bytes, bytes]:
    """``rule`` (a line of node_rule.lua) replaced by ``new`` in every script that grants
    (not the status script, which grants nothing)."""
    overrides: dict[bytes, bytes] = {}
    for script in LIBRARY_SCRIPTS.values():
        if rule in script.source.decode() and script is not scripts.NODE_STATE:
            overrides.update(_replace(script, rule, new))
    assert scripts.ACQUIRE.sha in overrides
    return overrides


def _no_quarantine() -> Iterator[dict[bytes, bytes]]:
    """A restarted node votes at once (node_rule.lua's uptime test always passes, in every
    script that grants; a promoted replica too)."""
    yield _in_every_granting_script("elseif since >= q then", "elseif true then")


def _no_failover_rule() -> Iterator[dict[bytes, bytes]]:
    """A promoted replica is judged as any master: its uptime, long before the promotion,
    lets it vote at once (node_rule.lua never sees the promotion, in every script that
    grants)."""
    rule = (
        "local promoted = (tonumber(string.match(replication, "
        "'second_repl_offset:(%-?%d+)')) or -1) >= 0"
    )
    yield _in_every_granting_script(rule, "local promoted = false")


def _durable_restart_trusted() -> Iterator[dict[bytes, bytes]]:
    """A durable restart votes at once whatever its dataset came from: a promoted replica
    that restarts (AOF always) before its quarantine ends votes with the locks it never
    received missing (node_rule.lua no longer asks that the marker's ``self`` name the fit
    process ``run`` names)."""
    yield _in_every_granting_script(
        "fsync == 'always' and stored[4] == stored[1]", "fsync == 'always'"
    )


def _release_any() -> Iterator[dict[bytes, bytes]]:
    """The release deletes the key whoever holds it (no owner compare)."""
    yield _replace(
        scripts.RELEASE,
        "if space ~= nil and string.sub(value, 1, space - 1) == ARGV[1] then",
        "if true then",
    )


def _no_clean_up() -> Iterator[dict[bytes, bytes]]:
    """A failed try frees nothing (its SETs stay until they expire)."""
    saved = flow.Acquire.judge

    def judge(self: flow.Acquire, *args: Any, **kwargs: Any) -> flow.Granted | flow.Failed:
        step = saved(self, *args, **kwargs)
        if isinstance(step, flow.Failed):
            return flow.Failed(
                step.error, [None] * len(step.clean_up), step.give_up, step.delay, step.waited
            )
        return step

    flow.Acquire.judge = judge  # type: ignore[method-assign]
    try:
        yield {}
    finally:
        flow.Acquire.judge = saved  # type: ignore[method-assign]


def _gone_frees_all() -> Iterator[dict[bytes, bytes]]:
    """A lease a renewal judged gone frees all its keys (the defect the fault storm found,
    fixed in flow.lost_clean_up): the keys that still keep rivals out go too."""
    saved = flow.lost_clean_up

    def lost_clean_up(shape: Any, token: str, cause: str, results: Sequence[Any]) -> Any:
        return saved(shape, token, flow.TAKEN, results)

    flow.lost_clean_up = lost_clean_up
    try:
        yield {}
    finally:
        flow.lost_clean_up = saved


def _slots_pooled() -> Iterator[dict[bytes, bytes]]:
    """A semaphore counts every node's grant as a vote, whatever slot the node granted (as a
    per-node counter would): a lease made of different slots on different nodes."""
    saved = Slots.votes

    def votes(self: Slots, results: Sequence[Any], yes: int) -> int:
        best = saved(self, results, yes)
        return sum(1 for reply in results if primitives.slot_granted(reply) is not None) or best

    Slots.votes = votes  # type: ignore[method-assign]
    try:
        yield {}
    finally:
        Slots.votes = saved  # type: ignore[method-assign]


def _fence_off() -> Iterator[dict[bytes, bytes]]:
    """The fenced table takes any write, whatever token it carries (no
    ``AND fencing_token = <token>``): a holder whose lease ran out writes over the next
    holder's."""
    saved = fence.accepts
    fence.accepts = lambda row_token, token: True
    try:
        yield {}
    finally:
        fence.accepts = saved


def _wake_skipped() -> Iterator[dict[bytes, bytes]]:
    """``wake_next.lua`` finds the head of the line but publishes nothing: a release (a
    force release, a waiter ahead leaving) leaves the lock free and the head asleep until its
    poll delay."""
    publish = "redis.call('PUBLISH', key .. '\\0w' .. listener, message or waiter)"
    overrides: dict[bytes, bytes] = {}
    for script in (scripts.RELEASE, scripts.FORCE_RELEASE, scripts.LEAVE):
        overrides.update(_replace(script, publish, "local _ = listener"))
    yield overrides


def _line_jump() -> Iterator[dict[bytes, bytes]]:
    """``acquire.lua`` gives a free lock to whoever asks, the live head of its line or not."""
    yield _replace(scripts.ACQUIRE, "if first ~= nil and first ~= waiter then", "if false then")


def _grant_held() -> Iterator[dict[bytes, bytes]]:
    """A leave (``leave.lua``) grants the new head of the line the lock even when another
    holder has it (``hand_grant.lua`` then writes over that holder's key)."""
    yield _replace(
        scripts.LEAVE,
        "if (removed == 1 or freed) and redis.call('EXISTS', KEYS[1]) == 0 then",
        "if removed == 1 or freed then",
    )


def _grant_counted_late() -> Iterator[dict[bytes, bytes]]:
    """The waiter counts a hand-off grant from when it heard it, not from the send time of
    the round the grant names: its validity may outlast the keys."""
    saved = flow.Acquire.hear_grants

    def late(self: flow.Acquire, grants: Any, now: float) -> flow.Granted | None:
        self.rounds = dict.fromkeys(self.rounds, now)
        return saved(self, grants, now)

    flow.Acquire.hear_grants = late  # type: ignore[method-assign]
    try:
        yield {}
    finally:
        flow.Acquire.hear_grants = saved  # type: ignore[method-assign]


def _handoff_kept() -> Iterator[dict[bytes, bytes]]:
    """``handoff.lua`` answers as if it handed the keys over, but they keep the giver's
    token: the giver's late release frees the adopter's lease."""
    yield _replace(
        primitives.HANDOFF,
        "redis.call('SET', KEYS[i], new .. ' ' .. rest, 'KEEPTTL')",
        "local _ = new .. rest",
    )


def _many_partial() -> Iterator[dict[bytes, bytes]]:
    """``acquire_many.lua`` sets only the first key of a multi-lock (and answers OK): the
    lease claims every name but holds one."""
    yield _replace(
        primitives.ACQUIRE_MANY,
        "for i = 2, #KEYS, 4 do\n    set_lock(KEYS[i], token, ARGV[3], ttl)",
        "for i = 2, 2, 4 do\n    set_lock(KEYS[i], token, ARGV[3], ttl)",
    )


def _gone_ignored() -> Iterator[dict[bytes, bytes]]:
    """``acquire.lua`` never reads a waiter's gone mark (``hand_gone.lua``): a try a node runs
    after its waiter's leave or release queues a phantom at the head of the line."""
    overrides = _replace(
        scripts.ACQUIRE, "local gone = key .. '\\0x' .. ARGV[1]", "local gone = key .. '\\0-'"
    )
    source = overrides[scripts.ACQUIRE.sha].decode()
    rule = "redis.call('EXISTS', KEYS[1] .. '\\0x' .. ARGV[1]) == 1"
    if rule not in source:
        raise AssertionError(f"mutant out of date: {rule!r} is no longer in the script")
    overrides[scripts.ACQUIRE.sha] = source.replace(rule, "false", 1).encode()
    yield overrides


def _procedure_line(module: types.ModuleType, old: str, new: str) -> Iterator[dict[bytes, bytes]]:
    """``module`` (a procedure's) with its line ``old`` replaced by ``new``, compiled again:
    its functions stand in for the shipped ones for the block (the simulator calls them
    through the module, as the managers do)."""
    source = inspect.getsource(module)
    if source.count(old) != 1:
        raise AssertionError(f"mutant out of date: {old!r} is not once in {module.__name__}")
    mutated = types.ModuleType(module.__name__)
    mutated.__file__ = module.__file__
    exec(compile(source.replace(old, new, 1), str(module.__file__), "exec"), vars(mutated))  # noqa: S102
    functions = [name for name, value in vars(module).items() if inspect.isfunction(value)]
    saved = {name: getattr(module, name) for name in functions}
    for name in functions:
        setattr(module, name, getattr(mutated, name))
    try:
        yield {}
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _retry_unreleased() -> Iterator[dict[bytes, bytes]]:
    """The acquire procedure retries (or gives up) without posting a failed round's clean-up:
    the keys its try took stay until they expire."""
    yield from _procedure_line(acquire_procedure, "yield Post(step.clean_up)", "_ = step.clean_up")


def _validity_undrifted() -> Iterator[dict[bytes, bytes]]:
    """The acquire procedure makes a first try's lease valid for the whole ttl from the end
    of its round: neither the round's time nor the drift is subtracted."""
    yield from _procedure_line(
        acquire_procedure,
        "acquired_at, expires_at = end, end + left",
        "acquired_at, expires_at = end, end + first.ttl",
    )


def _line_kept() -> Iterator[dict[bytes, bytes]]:
    """The acquire procedure gives up without leaving the line: its place (and, for a waiter
    taking grants, the keys its token holds) stays until it lapses."""
    yield from _procedure_line(acquire_procedure, "yield Post(leave)", "_ = leave")


def _deadline_late() -> Iterator[dict[bytes, bytes]]:
    """The acquire procedure sets a blocking acquire's deadline a second past its timeout
    (``resume``): it keeps trying after the time it was given."""
    yield from _procedure_line(
        acquire_procedure,
        "else first.started + (wait or 0.0)",
        "else first.started + (wait or 0.0) + 1.0",
    )


def _quarantine_unlearnt() -> Iterator[dict[bytes, bytes]]:
    """The acquire procedure never takes the longer quarantine a node refused a vote for
    (``learn_quarantines``): a client given a shorter ``max_ttl`` lets a node that restarted
    empty vote before the longer leases it may have granted ran out."""
    yield from _procedure_line(acquire_procedure, "host.learn_quarantine(node, ms)", "_ = node, ms")


def _miss_renews() -> Iterator[dict[bytes, bytes]]:
    """The extend procedure takes a renewal that decided nothing (no quorum either way) for
    one that kept the lease: it counts a full validity its keys may not have."""
    yield from _procedure_line(
        lease_procedures,
        "raise host.renewal_missed(lease, outcome, now)",
        "outcome = flow.validity(ttl, now - start, nodes.drift_factor)",
    )


MUTANTS: dict[str, Callable[[], Iterator[dict[bytes, bytes]]]] = {
    "no-drift": _no_drift,
    "no-quarantine": _no_quarantine,
    "no-failover-rule": _no_failover_rule,
    "durable-restart-trusted": _durable_restart_trusted,
    "release-any": _release_any,
    "no-clean-up": _no_clean_up,
    "gone-frees-all": _gone_frees_all,
    "slots-pooled": _slots_pooled,
    "fence-off": _fence_off,
    "wake-skipped": _wake_skipped,
    "line-jump": _line_jump,
    "handoff-kept": _handoff_kept,
    "grant-held": _grant_held,
    "grant-counted-late": _grant_counted_late,
    "many-partial": _many_partial,
    "gone-ignored": _gone_ignored,
    "retry-unreleased": _retry_unreleased,
    "validity-undrifted": _validity_undrifted,
    "line-kept": _line_kept,
    "deadline-late": _deadline_late,
    "quarantine-unlearnt": _quarantine_unlearnt,
    "miss-renews": _miss_renews,
}


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[dict[bytes, bytes]]:
    """Apply mutant ``name`` (None: the real code) for the block; yields the script
    overrides for the nodes."""
    if name is None:
        yield {}
        return
    with contextlib.contextmanager(MUTANTS[name])() as overrides:
        yield overrides
