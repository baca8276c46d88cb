"""Django-side fixtures: ``redlock_nodes`` points REDLOCK at the session's three real nodes, for
the tests that ask for it (``@pytest.mark.usefixtures("redlock_nodes")``); the others start no
server and run in ``./run test --fast``."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redlock_nodes(settings, cluster3):
    """REDLOCK's nodes are the session's 3 real nodes (set through settings, which also
    exercises the setting_changed reset of the manager)."""
    settings.REDLOCK = {"NODES": cluster3.urls, "RETRY_DELAY": 0.01}
    return cluster3


@pytest.fixture
def held_elsewhere(cluster3) -> Callable[[str], contextlib.AbstractContextManager[None]]:
    """``with held_elsewhere("name"):`` another process holds the lock for the block."""

    @contextlib.contextmanager
    def hold(name: str) -> Iterator[None]:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.holder", name, *cluster3.urls],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        assert process.stdin is not None
        try:
            line = process.stdout.readline()
            assert line.startswith("held"), line
            yield
        finally:
            process.stdin.write("\n")
            process.stdin.close()
            process.wait(30)
            process.stdout.close()

    return hold
