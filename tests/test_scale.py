"""The scale benchmark (``benchmarks/scale.py``, ``python -m benchmarks --only scale``) runs
each of its sections at toy sizes and reports every contender. Its figures are measured by the
benchmark, never asserted here."""

from __future__ import annotations

import pytest

from benchmarks import scale

pytestmark = pytest.mark.slow


def test_pair_bytes_and_listing_sections_run(cluster3, capsys):
    p50 = scale.pair_p50(cluster3.urls, (1, 3), pairs=20, rounds=2)
    assert set(p50) == {
        "django_redlock N=1",
        "django_redlock N=3",
        "redis-py Lock (1 node)",
        "python-redis-lock (1 node)",
    }
    held = scale.held_bytes(cluster3.urls[0], 50)
    assert [row.label for row in held] == list(scale.LABELS.values())
    assert all(row.memory_usage > 0 for row in held)
    listing = scale.listing_and_status(cluster3.urls, (10, 1500), runs=1)
    assert [row.size for row in listing] == [10, 1500]
    out = capsys.readouterr().out
    for title in ("1. pair p50", "2. bytes per held lock", "4. listing"):
        assert title in out


def test_connection_and_server_cpu_sections_run(cluster3, capsys):
    rows = scale.connections(cluster3.urls, threads=3, seconds=0.2)
    assert [(row.label, row.shape) for row in rows] == [
        (label, shape) for shape in ("distinct", "line") for label in scale.LABELS.values()
    ]
    assert all(row.sections > 0 and min(row.peak) >= 1 for row in rows)
    cpu = scale.server_cpu(cluster3.urls, (2, 4), seconds=0.2, processes=2, runs=1)
    assert len(cpu) == 2 * 4
    assert all(min(row.sections) > 0 for row in cpu)
    assert "5. server CPU per critical section" in capsys.readouterr().out
