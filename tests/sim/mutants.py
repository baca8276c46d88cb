"""Deliberately broken variants of the library, each of which the simulator must catch.

A mutant changes one rule for the length of one history: a flow function patched in
``core/flow.py``, or one script's text replaced on the simulated nodes (the override is
keyed by the real script's SHA1, so the clients send exactly the commands they always send).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django_redlock.core import flow
from django_redlock.wire import scripts


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


def _no_quarantine() -> Iterator[dict[bytes, bytes]]:
    """A restarted node votes at once (node_rule.lua's uptime test always passes)."""
    yield _replace(scripts.ACQUIRE, "elseif up >= q then", "elseif true then")


def _release_any() -> Iterator[dict[bytes, bytes]]:
    """The release deletes the key whoever holds it (no owner compare)."""
    yield _replace(
        scripts.RELEASE,
        "if redis.pcall('HGET', KEYS[1], 't') ~= ARGV[1] then",
        "if redis.call('EXISTS', KEYS[1]) == 0 then",
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


MUTANTS: dict[str, Callable[[], Iterator[dict[bytes, bytes]]]] = {
    "no-drift": _no_drift,
    "no-quarantine": _no_quarantine,
    "release-any": _release_any,
    "no-clean-up": _no_clean_up,
    "gone-frees-all": _gone_frees_all,
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
