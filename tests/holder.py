"""Hold a lock from another process: ``python -m tests.holder NAME URL...``.

Prints ``held <ttl>`` once it holds the lock, then releases it when a line arrives on stdin
(or stdin closes). Used to make contention come from a real other process.
"""

from __future__ import annotations

import sys

from django_redlock import LockLost, LockManager


def main() -> int:
    name, *urls = sys.argv[1:]
    manager = LockManager(urls)
    lease = manager.acquire(name, ttl=30.0, timeout=10.0, origin="tests.holder")
    print(f"held {lease.validity:.3f}", flush=True)
    sys.stdin.readline()
    try:
        lease.release()
    except LockLost:  # force-released meanwhile (the admin tests do that)
        print("lost", flush=True)
        return 0
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
