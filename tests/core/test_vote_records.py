"""Clients record the nodes they saw grant on the other nodes (issue 40, item 1): the memory
``redlock_declare_fresh`` reads to tell a brand-new node from one that voted, crashed and came
back empty (``core/witness.py``). Real nodes; the recorder's thread, never the acquire, writes.
"""

from __future__ import annotations

import gc
import os
import time

from django_redlock import LockManager
from django_redlock.core.witness import CLIENT_SEEN, VOTERS_KEY, field_of
from django_redlock.wire.nodes import parse_node
from tests.helpers import node_client

PROMPT = 10.0  # an upper bound, never expected


def test_a_clients_first_grant_of_each_node_is_recorded_on_the_others(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=0.5)
    lease = manager.acquire("recorded", blocking=False)
    lease.extend()  # every node answers it: all three granted
    manager.acquire("again", blocking=False).release()  # no second record needed
    fields = [field_of(parse_node(url)) for url in cluster3.urls]
    deadline = time.monotonic() + PROMPT
    for index, node in enumerate(cluster3):
        with node_client(node) as client:
            others = [field for other, field in enumerate(fields) if other != index]
            while any(client.hget(VOTERS_KEY, field) is None for field in others):
                assert time.monotonic() < deadline, f"node {index} has no record"
                time.sleep(0.01)
            for field in others:
                assert client.hget(VOTERS_KEY, field).split()[0] == CLIENT_SEEN.encode()
            assert client.hget(VOTERS_KEY, fields[index]) is None  # never itself
    lease.release()
    # A manager dropped takes its recorder's thread with it.
    thread = manager.engine._voters.thread
    assert thread is not None
    assert thread.is_alive()
    del lease, manager
    gc.collect()
    thread.join(PROMPT)
    assert not thread.is_alive(), "the recorder's thread outlived its manager"


def test_a_forked_child_records_its_own_votes(cluster3):
    """A prefork server's parent may take a lock before it forks, then exit: its children
    must record (and refresh) their own votes, not rely on the parent's thread."""
    manager = LockManager(cluster3.urls, node_timeout=0.5)
    manager.acquire("parent", blocking=False).release()
    manager.engine._voters.wait_idle(PROMPT)
    for node in cluster3:
        with node_client(node) as client:
            client.delete(VOTERS_KEY)
    pid = os.fork()
    if pid == 0:  # the child: its own grants, its own recorder thread
        code = 1
        try:
            manager.acquire("child", blocking=False).release()
            code = 0 if manager.engine._voters.wait_idle(PROMPT) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fields = [field_of(parse_node(url)) for url in cluster3.urls]
    with node_client(cluster3[0]) as client:
        assert client.hget(VOTERS_KEY, fields[1]) is not None
        assert client.hget(VOTERS_KEY, fields[2]) is not None
