"""Real server processes for the whole suite (no Redis mocks anywhere).

Two session-wide clusters are started once, 3 and 5 independent nodes on unix sockets, from
the bundled Valkey or ``$REDLOCK_SERVER_BIN``, on first use. Tests that need them ask for the
function-scoped fixtures (nothing here is autouse), which hand over every node running and
empty, and put back whatever the test paused or killed; the tests that ask for none run in
``./run test --fast`` (``tests/fastset.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_redlock.localnodes import LocalCluster, server_binary, server_version
from tests.helpers import FakeClock, node_client

# ``--fast`` and the ``processes`` mark (what starts a process is found from the code), and
# pytester for the tests of that.
pytest_plugins = ["tests.fastset", "pytester"]


def pytest_report_header(config: pytest.Config) -> str:
    return f"lock nodes: {server_version()} ({server_binary()})"


@pytest.fixture(scope="session")
def _cluster3() -> Iterator[LocalCluster]:
    with LocalCluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def _cluster5() -> Iterator[LocalCluster]:
    with LocalCluster(5) as cluster:
        yield cluster


def _fresh(cluster: LocalCluster) -> Iterator[LocalCluster]:
    cluster.ensure_running()
    for node in cluster:
        with node_client(node) as client:
            client.flushall()
        node.declare_fresh()  # FLUSHALL also drops the restart marker
    yield cluster
    cluster.ensure_running()


@pytest.fixture
def cluster3(_cluster3: LocalCluster) -> Iterator[LocalCluster]:
    """Three running, empty nodes; what the test pauses or kills is put back afterwards."""
    yield from _fresh(_cluster3)


@pytest.fixture
def cluster5(_cluster5: LocalCluster) -> Iterator[LocalCluster]:
    """Five running, empty nodes; what the test pauses or kills is put back afterwards."""
    yield from _fresh(_cluster5)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
