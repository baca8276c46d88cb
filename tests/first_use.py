"""First use, as a new user meets it: nodes nobody prepared grant a lock at once.

Run by ``./run test`` (in the background while the suite runs, since one node must first be up
longer than the quarantine): with the demo's REDLOCK settings, a brand-new node with
``appendonly yes`` + ``appendfsync always`` and a plain node that has been up longer than
``MAX_TTL`` are started the way an operator starts them (no declaration, nothing written to
them by this project) and must each grant a lock on the first try.

    python -m tests.first_use      # exit 0 and one line per node, or exit 1 with the error
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import cast

from demo_site.settings import REDLOCK
from django_redlock import LockManager, RedlockError
from django_redlock.localnodes import DURABLE_ARGS, LocalNode
from tests.helpers import node_client

TTL = cast(float, REDLOCK["TTL"])
KEY_PREFIX = cast(str, REDLOCK["KEY_PREFIX"])


def uptime(node: LocalNode) -> int:
    with node_client(node) as client:
        return int(client.info("server")["uptime_in_seconds"])


def first_lock(node: LocalNode) -> str:
    """Take and release one lock on ``node`` alone with the demo's settings, first try."""
    manager = LockManager(
        [node.url],
        ttl=TTL,
        key_prefix=KEY_PREFIX,
        node_timeout=0.5,  # the node's first script compile may be slow on a busy machine
    )
    try:
        manager.acquire("first-use", blocking=False).release()
    finally:
        manager.close()
    return f"{node.name}: granted at once (up {uptime(node)} s, max_ttl {manager.max_ttl:g} s)"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rl-", dir="/tmp") as directory:
        long_running = LocalNode(Path(directory), name="long-running")
        long_running.start(fresh=False)
        durable = LocalNode(Path(directory), name="brand-new-durable", extra_args=DURABLE_ARGS)
        try:
            quarantine = LockManager([long_running.url], ttl=TTL).max_ttl
            # uptime_in_seconds may run up to a second ahead of the process's real uptime.
            while uptime(long_running) < quarantine + 2:
                time.sleep(1.0)
            durable.start(fresh=False)
            for node in (long_running, durable):
                print(f"first use: {first_lock(node)}")
        except RedlockError as exc:
            print(f"first use FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            durable.stop()
            long_running.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
