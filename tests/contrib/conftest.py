"""Fixtures for the Celery tests: a broker node, and real ``celery worker`` processes.

The broker and result backend are one more node (TCP, as Celery's Redis transport wants a
host); the locks live on the session's three lock nodes (``cluster3``). Every worker runs in
its own session (process group) and is SIGKILLed with all its children at teardown, whatever
the test did: no stray processes.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redlock.localnodes import LocalNode
from tests.helpers import node_client

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0  # seconds: generous bounds for what a loaded 2-core machine does "soon"
# Seconds each node has per command, in this process and in the workers. Five times the
# default: the suite shares two cores with other servers and workers, and one renewal round
# that misses its quorum loses a lease (by design); the tests are about Celery, not about
# renewals under starvation (tests/core covers those).
NODE_TIMEOUT = 0.25


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    node = LocalNode(tmp_path_factory.mktemp("broker"), name="broker", tcp=True)
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def celery_app(broker: LocalNode) -> Iterator[Any]:
    """The test app (tests/contrib/celery_app.py), pointed at the broker node."""
    os.environ["REDLOCK_TEST_BROKER"] = broker.url
    from tests.contrib import celery_app as module

    base = broker.url.rsplit("/", 1)[0]
    module.app.conf.update(broker_url=broker.url, result_backend=base + "/1")
    module.BROKER = broker.url
    yield module
    # Before the broker node stops, or the result listener tries to reconnect to it when an
    # AsyncResult is collected later (its __del__ unsubscribes from the result's channel).
    gc.collect()
    consumer = getattr(module.app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.stop()
        consumer.subscribed_to.clear()  # nothing left to unsubscribe from
    module.app.close()


@pytest.fixture
def redlock_nodes(settings: Any, cluster3: Any, broker: LocalNode) -> Any:
    """For the tests that ask for it: the producer side (this process) and the workers use the
    same three lock nodes; the journal and queues start empty."""
    settings.REDLOCK = {"NODES": cluster3.urls, "RETRY_DELAY": 0.02, "NODE_TIMEOUT": NODE_TIMEOUT}
    with node_client(broker) as client:
        client.flushall()
    return cluster3


class Worker:
    """One ``celery worker`` process (and its pool children) in its own process group."""

    def __init__(
        self,
        pool: str,
        queue: str,
        log: Path,
        nodes: list[str],
        broker: str,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.queue = queue
        self.log = log
        env = {
            **os.environ,
            "REDLOCK_TEST_BROKER": broker,
            "REDLOCK_TEST_NODES": ",".join(nodes),
            "REDLOCK_TEST_NODE_TIMEOUT": str(NODE_TIMEOUT),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.contrib.celery_app",
            "worker",
            "-P",
            pool,
            "--concurrency=1",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            queue,
            "-n",
            f"{queue}@%h",
            "--loglevel=INFO",
        ]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if b" ready." in self.log.read_bytes():
                return
            time.sleep(0.05)
        self.kill_all()
        raise RuntimeError(f"celery worker did not start:\n{self.text()[-3000:]}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill_main(self) -> None:
        """SIGKILL the worker's main process only (with -P solo: the process running the
        task)."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(WAIT)

    def kill_all(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(WAIT)


@pytest.fixture
def start_worker(
    tmp_path: Path, celery_app: Any, cluster3: Any, broker: LocalNode
) -> Iterator[Callable[..., Worker]]:
    """``start_worker(pool="solo", extra_env=None)`` -> a running worker on a queue of its own
    (``worker.queue``), with ``extra_env`` added to its environment; every worker started is
    killed at teardown."""
    workers: list[Worker] = []

    def start(pool: str = "solo", extra_env: dict[str, str] | None = None) -> Worker:
        queue = f"q{uuid.uuid4().hex[:8]}"
        log = tmp_path / f"{queue}.log"
        worker = Worker(pool, queue, log, cluster3.urls, broker.url, extra_env)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.kill_all()


class Journal:
    """What the tasks wrote (tests/contrib/celery_app.py ``note``), read from the broker node."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.gates: list[str] = []

    def gate(self) -> str:
        """A new gate for a task to wait at; every gate is opened at teardown, so a failed
        test never leaves a worker blocked for the next one."""
        name = f"gate:{uuid.uuid4().hex[:10]}"
        self.gates.append(name)
        return name

    def events(self, job: str) -> list[dict[str, Any]]:
        with self.module.journal_client() as client:
            raw = client.lrange(self.module.JOURNAL, 0, -1)
        records = [json.loads(item) for item in raw]
        return [record for record in records if record["job"] == job]

    def wait_for(
        self, job: str, predicate: Callable[[list[dict[str, Any]]], bool], what: str
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            events = self.events(job)
            if predicate(events):
                return events
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; journal: {self.events(job)}")

    def open(self, gate: str) -> None:
        with self.module.journal_client() as client:
            client.rpush(gate, "go")


@pytest.fixture
def journal(celery_app: Any) -> Iterator[Journal]:
    journal = Journal(celery_app)
    yield journal
    for gate in journal.gates:
        journal.open(gate)


def new_job() -> str:
    return uuid.uuid4().hex[:10]


def count(events: list[dict[str, Any]], event: str) -> int:
    return sum(1 for record in events if record["event"] == event)
