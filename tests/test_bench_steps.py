"""The step profile's tables (``benchmarks/steps.py``) name functions that exist, each once:
a renamed or moved function would otherwise drop out of its step and its cost into "rest"
without a word, and the table beside the floor would read wrong."""

from __future__ import annotations

import inspect
import math

import pytest

from benchmarks import steps


@pytest.mark.parametrize("table", [steps.OURS, steps.FLOOR], ids=["ours", "floor"])
def test_every_listed_function_exists_and_is_listed_once(table):
    named = [spec for specs in table.values() for spec in specs]
    assert len(named) == len(set(named))
    known = {step for step, _ in steps.STEPS}
    assert set(table) <= known - {"rest"} - set(steps.C_STEPS)
    for spec in named:
        _, _, function = steps._resolve(spec)
        # A generator's body runs in whoever resumes it, not in the call the wrapper sees.
        assert inspect.isfunction(function), spec
        assert not inspect.isgeneratorfunction(function), spec


def test_the_profiles_keep_the_idle_check_out_as_a_native_loop_does(monkeypatch):
    from benchmarks.instructions import natively_paced
    from django_redlock.wire.sync import connections

    monkeypatch.setattr(connections, "_IDLE", connections._IDLE)  # restored after the test
    natively_paced()
    assert math.isinf(connections._IDLE)
