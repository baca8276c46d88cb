"""``core.lease.release_round`` builds a plain lock's release without building its Shape (two
calls fewer on every release): pinned here to what ``Shape(key).held_release`` sends, with
the same yes value and identity, for a single try and for a blocking acquire's lease (whose
release names its waiter). Real nodes: the leases are taken as users take them."""

from __future__ import annotations

from django_redlock import LockManager
from django_redlock.core.lease import release_round
from django_redlock.procedures.shapes import Shape


def test_a_plain_locks_release_round_is_what_its_shape_would_send(cluster3):
    manager = LockManager(cluster3.urls)
    single = manager.acquire("pinned-single", blocking=False)
    blocking = manager.acquire("pinned-blocking", blocking=True, timeout=2.0)
    for lease in (single, blocking):
        commands, yes, expired, identify = release_round(lease, 3)
        shape = Shape(lease.key)
        waiter = lease._state[9]  # WAITER: "" for a single try
        expected, expected_fallback = shape.held_release(lease.token, waiter)
        assert len(commands) == 3
        for command, fallback in commands:
            assert command == expected  # the EVALSHA bytes
            # and the EVAL sent after NOSCRIPT (an object per command: compared by what it
            # builds and whether it takes the identity)
            assert fallback is not None
            assert expected_fallback is not None
            assert type(fallback) is type(expected_fallback)
            assert fallback.build() == expected_fallback.build()
            assert fallback.identify == expected_fallback.identify
        assert (yes, identify, expired) == (shape.release_yes, shape.release_identified, False)
        lease.release()
    manager.close()
