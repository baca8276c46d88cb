"""The floor at equal work (``benchmarks/floor.py``) is a floor of ours only while it sends
what ours sends: each node's ``MONITOR`` sees the same acquire and release from a
``LockManager`` and from it (up to the token, the owner record's time and the place in line);
so do W1's references that claim to send our commands (``benchmarks/references.py``).
It must also be a correct Redlock, as the minimal one is. Its speed is measured by
``python -m benchmarks``, never here."""

from __future__ import annotations

import gc
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing

import pytest

from benchmarks.floor import Held, SameCommandsRedlock
from benchmarks.floor_line import SameCommandsLine
from benchmarks.references import raw_sockets, redis_py_connections
from django_redlock import LockManager, LockNotAcquired
from django_redlock.wire.scripts import HAND_UNDO, HOT_SCRIPTS
from tests.helpers import node_client, node_identity, votes_recorded

TTL_MS = 10_000

# What differs from one acquire to the next: the token (after the key), the owner record's
# time (the 8 base-36 digits after the 7 of its id) and the place in line (a time in µs).
_TOKEN = re.compile(r"^(EVALSHA [0-9a-f]{40} 1 \S+) [0-9a-f]{40} ")
_OWNER_TIME = re.compile(r" ([A-Za-z0-9_-]{7})[0-9a-z]{8} \{")
_TICKET = re.compile(r" \d{16} ")


def _normalized(command: str) -> str:
    return _times(_TOKEN.sub(r"\1 <token> ", command))


def _times(command: str) -> str:
    """``command`` with the owner record's time and the place in line as placeholders."""
    return _TICKET.sub(" <us> ", _OWNER_TIME.sub(r" \1<ms> {", command))


def _floor(urls: list[str], stack: ExitStack) -> Callable[[str], bool]:
    floor = stack.enter_context(closing(SameCommandsRedlock(urls, 1.0)))

    def run(name: str) -> bool:
        held = floor.acquire(f"redlock:{name}", TTL_MS)
        return held is not None and floor.release(held)

    return run


def _raw_sockets(urls: list[str], stack: ExitStack) -> Callable[[str], bool]:
    # Its sockets are closed only with the runner (W1 keeps it for the process's life).
    return raw_sockets(urls)


def _redis_py_connections(urls: list[str], stack: ExitStack) -> Callable[[str], bool]:
    return redis_py_connections(urls)


@pytest.mark.parametrize(
    "reference",
    [
        _floor,
        pytest.param(
            _raw_sockets, marks=pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")
        ),
        _redis_py_connections,
    ],
)
def test_it_sends_what_a_lock_manager_sends(cluster3, reference):
    # The references of W1 (benchmarks/references.py) claim the same: checked alike.
    manager = LockManager(cluster3.urls, ttl=TTL_MS / 1000, node_timeout=1.0)
    manager.acquire("warm", blocking=False).release()  # connected: no hello in what follows
    votes_recorded(manager)  # nor the vote recorder's writes (core/witness.py)
    with ExitStack() as stack:
        run = reference(cluster3.urls, stack)  # connected too
        monitors = [
            stack.enter_context(stack.enter_context(closing(node_client(node))).monitor())
            for node in cluster3
        ]
        manager.acquire("same", blocking=False).release()
        assert run("same")
        for monitor in monitors:
            # The node runs each connection's commands in order; a release that returned at
            # a quorum still reaches every node (within the 2 s the monitor waits).
            scripts: list[str] = []
            while len(scripts) < 4:
                command = monitor.next_command()["command"]
                if command.startswith(("EVALSHA", "EVAL ")):
                    scripts.append(_normalized(command))
            ours_acquire, ours_release, its_acquire, its_release = scripts
            # Each varying part was found, so nothing else was left out of the comparison.
            for part in ("<token>", "<ms>", "<us>"):
                assert part in ours_acquire
            assert its_acquire == ours_acquire
            assert its_release == ours_release
        del run  # its sockets are closed now, under this test's warning filter
        gc.collect()
    manager.close()


def test_it_is_a_redlock_a_quorum_holds(cluster5):
    with closing(SameCommandsRedlock(cluster5.urls)) as floor:
        cluster5[3].pause()
        cluster5[4].pause()
        held = floor.acquire("redlock:two-paused", TTL_MS)
        assert held is not None
        assert 0 < held.validity < TTL_MS / 1000
        # Ours sees the lock held, and the floor's own second try is refused.
        manager = LockManager(cluster5.urls[:3], ttl=TTL_MS / 1000)
        try:
            manager.acquire("two-paused", blocking=False)
        except LockNotAcquired:
            pass
        else:
            raise AssertionError("a lock the floor holds on a quorum was granted to ours")
        finally:
            manager.close()
        assert floor.acquire("redlock:two-paused", TTL_MS) is None
        assert floor.release(held)
        cluster5[2].pause()  # 3 of 5 paused: no quorum
        assert floor.acquire("redlock:three-paused", TTL_MS) is None
        for index in (2, 3, 4):
            cluster5[index].resume()
        again = floor.acquire("redlock:two-paused", TTL_MS)
        assert again is not None
        assert floor.release(again)


def test_its_release_falls_back_to_eval_when_a_node_lost_the_script(cluster3):
    with closing(SameCommandsRedlock(cluster3.urls)) as floor:
        held = floor.acquire("redlock:flushed", TTL_MS)
        assert held is not None
        for node in cluster3:
            with node_client(node) as client:
                client.script_flush()
        assert floor.release(held)
        freed = 0
        for node in cluster3:
            with node_client(node) as client:
                freed += client.exists("redlock:flushed") == 0
        assert freed >= floor.quorum


# W3's floor (benchmarks/floor_line.py): what varies there is numbered in order of first
# appearance, so the same token or waiter id must come back where ours brings it back.
_WAITER = re.compile(r"\b[0-9a-f]{12}\.[0-9a-f]{8}\b")
_HEX40 = re.compile(r"\b[0-9a-f]{40}\b")
# Commands of the test's own clients: the sentinels, the look at the line, a connection's.
_OURS_DONE, _ITS_DONE = "ECHO ours-done", "ECHO its-done"
_HELPERS = ("ZCARD ", "HELLO ", "CLIENT ", "ECHO ")


def _numbered(command: str, seen: dict[str, str], keep: set[str]) -> str:
    """``command`` with each token (40 hex digits that are not in ``keep``: the node's run
    id, the scripts' ids) and each waiter id replaced by a numbered placeholder, the owner's
    time and the ticket by fixed ones."""

    def number(kind: str) -> Callable[[re.Match[str]], str]:
        def replace(match: re.Match[str]) -> str:
            text = match[0]
            if text in keep:
                return text
            count = sum(placeholder[1] == kind for placeholder in seen.values())
            return seen.setdefault(text, f"<{kind}{count + 1}>")

        return replace

    return _times(_WAITER.sub(number("w"), _HEX40.sub(number("t"), command)))


def _until(monitor, sentinel: str, keep: set[str]) -> tuple[list[str], list[str]]:
    """Every command a client sent a node until ``sentinel`` (not those a script called),
    numbered, but the test's own; apart from them the undos of tries whose reply was not
    waited for (whether a node gets one depends on timing)."""
    seen: dict[str, str] = {}
    commands: list[str] = []
    undos: list[str] = []
    undo = f"EVALSHA {HAND_UNDO.sha.decode()} "
    while (seen_now := monitor.next_command())["command"] != sentinel:
        command = seen_now["command"]
        if seen_now.get("client_type") == "lua" or command.startswith(_HELPERS):
            continue
        numbered = _numbered(command, seen, keep)
        (undos if command.startswith(undo) else commands).append(numbered)
    return commands, undos


def _in_line(cluster, key: str) -> None:
    """Until every node has one waiter in the line of ``key`` (its try reached them all)."""
    clients = [node_client(node) for node in cluster]
    try:
        deadline = time.monotonic() + 5
        while not all(client.zcard(f"{key}\x00q") == 1 for client in clients):
            assert time.monotonic() < deadline, "the waiter's try never reached every node"
            time.sleep(0.005)
    finally:
        for client in clients:
            client.close()


def _ours_hand_off(
    first: LockManager, second: LockManager, waiter: ThreadPoolExecutor, cluster
) -> None:
    """A holds, B (in the ``waiter`` thread) waits in line, A's release grants B the lock, B
    releases: with managers."""
    held = first.acquire("line", timeout=5)
    taken = waiter.submit(second.acquire, "line", timeout=5)
    _in_line(cluster, "redlock:line")
    held.release()
    waiter.submit(taken.result(5).release).result(5)


def _floor_hand_off(
    first: SameCommandsLine, second: SameCommandsLine, waiter: ThreadPoolExecutor, cluster
) -> None:
    """The same with two same-commands lines (benchmarks/floor_line.py)."""
    held = first.acquire_in_line("redlock:line", TTL_MS, timeout=5)
    taken = waiter.submit(second.acquire_in_line, "redlock:line", TTL_MS, timeout=5)
    _in_line(cluster, "redlock:line")
    assert first.release_in_line(held)
    lease = taken.result(5)
    assert 0 < lease.validity < TTL_MS / 1000
    assert waiter.submit(second.release_in_line, lease).result(5)


def test_the_line_floor_sends_what_a_blocking_lock_sends(cluster3):
    with ExitStack() as stack:
        # B's thread, the same for every hand-off: ours keeps a thread's connections, and the
        # owner record names the thread (the floor reads it when it is made, there too).
        waiter = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="waiter"))
        managers = []
        for _ in range(2):
            manager = LockManager(cluster3.urls, ttl=TTL_MS / 1000, node_timeout=1.0)
            stack.callback(manager.close)
            manager.acquire("warm", blocking=False).release()  # connected: no hello below
            votes_recorded(manager)  # nor the vote recorder's writes (core/witness.py)
            managers.append(manager)
        first_line = stack.enter_context(closing(SameCommandsLine(cluster3.urls, 1.0)))
        second_line = stack.enter_context(
            closing(waiter.submit(SameCommandsLine, cluster3.urls, 1.0).result(5))
        )
        # Once before: B's first wait subscribes, and tries again at once (a release may
        # have come before the subscription); its thread connects. Compared: the steady state.
        _ours_hand_off(managers[0], managers[1], waiter, cluster3)
        _floor_hand_off(first_line, second_line, waiter, cluster3)
        keep = {script.sha.decode() for script in HOT_SCRIPTS}
        clients = [stack.enter_context(closing(node_client(node))) for node in cluster3]
        keep |= {node_identity(client) for client in clients}
        monitors = [
            stack.enter_context(stack.enter_context(closing(node_client(node))).monitor())
            for node in cluster3
        ]
        _ours_hand_off(managers[0], managers[1], waiter, cluster3)
        for client in clients:
            client.echo("ours-done")
        _floor_hand_off(first_line, second_line, waiter, cluster3)
        for client in clients:
            client.echo("its-done")
        for monitor in monitors:
            # Each: A's acquire (free), B's try (queued), A's release (grants B), B's release;
            # and nothing else, but an undo behind B's try where its round did not wait.
            ours, ours_undos = _until(monitor, _OURS_DONE, keep)
            its, its_undos = _until(monitor, _ITS_DONE, keep)
            assert len(ours) == 4, ours
            for part in ("<t1>", "<t2>", "<ms>", "<us>", "<w1>"):
                assert part in " ".join(ours)
            assert its == ours
            # At most one node of three is not waited for (a quorum of two refused).
            assert len(ours_undos) <= 1
            assert len(its_undos) <= 1
            if ours_undos and its_undos:
                assert its_undos == ours_undos


def test_the_line_floor_takes_a_hand_off_from_a_quorum_of_grants(cluster5):
    # Two nodes paused: the grants of three still make a lease, dated from the waiter's try.
    with (
        closing(SameCommandsLine(cluster5.urls)) as first,
        closing(SameCommandsLine(cluster5.urls)) as second,
    ):
        # Subscribed to the lock's channel while every node answers (as when it connects).
        assert second.release_in_line(second.acquire_in_line("redlock:grants", TTL_MS, 5))
        held = first.acquire_in_line("redlock:grants", TTL_MS, timeout=5)
        cluster5[3].pause()
        cluster5[4].pause()
        taken: list[Held] = []
        waiter = threading.Thread(
            target=lambda: taken.append(second.acquire_in_line("redlock:grants", TTL_MS, timeout=5))
        )
        waiter.start()
        time.sleep(0.2)  # its try reached the three nodes that run
        assert not taken
        assert first.release_in_line(held)
        waiter.join(5)
        (lease,) = taken
        assert 0 < lease.validity < TTL_MS / 1000
        # Ours, on the three nodes that run, sees the lock held by the waiter.
        manager = LockManager(cluster5.urls[:3], ttl=TTL_MS / 1000)
        try:
            with pytest.raises(LockNotAcquired):
                manager.acquire("grants", blocking=False)
        finally:
            manager.close()
        assert second.release_in_line(lease)
