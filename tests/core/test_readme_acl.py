"""The ACL example of docs/howto/deploying.md really is enough: every operation runs as that
user.

The ``ACL SETUSER`` command is read from that page itself, so the documentation cannot drift
from what the scripts need.
"""

from __future__ import annotations

import re
import shlex
import threading
import time
from pathlib import Path
from typing import Any

from django_redlock import LockManager
from django_redlock.core.health import status
from tests.helpers import node_client

README = Path(__file__).resolve().parents[2] / "docs" / "howto" / "deploying.md"


def readme_acl() -> list[str]:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"```\n\s*(ACL SETUSER locks .*?)```", text, re.DOTALL)
    assert match is not None, "the README lost its ACL example"
    return shlex.split(" ".join(match.group(1).split()))


def acl_user_urls(cluster: Any) -> list[str]:
    """Create the page's ACL user on every node of ``cluster``; its URLs, as that user."""
    command = readme_acl()
    password = next(part[1:] for part in command if part.startswith(">"))
    for node in cluster:
        with node_client(node) as client:
            client.execute_command(*command)
    return [node.url.replace("unix://", f"unix://locks:{password}@") for node in cluster]


def test_the_readme_acl_user_can_do_everything_the_library_does(cluster3):
    urls = acl_user_urls(cluster3)
    manager = LockManager(urls, ttl=10.0, retry_delay=10.0)  # only a wake-up is prompt
    manager.declare_fresh()
    lease = manager.acquire("acl", ttl=10.0)
    assert manager.holder("acl") is not None
    assert [info.name for info in manager.locks().locks] == ["acl"]
    assert status(manager).healthy
    waiter = LockManager(urls, ttl=10.0, retry_delay=10.0)
    got = threading.Event()

    def wait() -> None:
        waiter.acquire("acl", timeout=30.0).release()
        got.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5.0
    with node_client(cluster3[0]) as client:
        while not client.exists("redlock:acl\x00q"):  # the waiter has queued
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.002)
    lease.extend()
    lease.release()
    assert got.wait(5.0), "the release did not wake the waiter under the README's ACL"
    thread.join(5.0)
    manager.close()
    waiter.close()


def test_the_readme_acl_user_can_use_every_kind_of_lock(cluster3):
    # The kinds' scripts call commands a plain lock's do not (ZSCORE, ZCARD, ZRANGEBYSCORE in
    # the read-write and semaphore scripts; HGETALL in the listing of readers): the page's
    # ACL once lacked them, and the test above, with plain locks only, passed.
    urls = acl_user_urls(cluster3)
    manager = LockManager(urls, ttl=10.0, retry_delay=0.05)
    manager.declare_fresh()
    slot = manager.semaphore("acl-sem", 2).acquire(timeout=5.0)
    slot.extend()
    assert slot.owned()
    rw = manager.rwlock("acl-rw")
    reader = rw.read(timeout=5.0)
    reader.extend()
    assert reader.owned()
    names = {info.name for info in manager.locks().locks}
    assert {"acl-sem", "acl-rw"} <= names, names
    reader.release()
    writer = rw.write(timeout=5.0)
    writer.extend()
    assert writer.owned()
    writer.release()
    slot.release()
    both = manager.lock_many(["acl-a", "acl-b"], timeout=5.0)
    both.extend()
    assert both.owned()
    both.release()
    assert manager.locks().locks == []
    manager.close()
