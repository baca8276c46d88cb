"""One engine, two managers (issue 24): the asyncio manager is the sync one's twin by its
signatures, shares its engine without importing its module, and both acquire loops carry out
the same flow actions, in the same order.

The two drifts the issue named are pinned with an injected clock and sleep (no wall clock):
a poll made with an injected sleep counts as a poll (the back-off grows), and the first
contact with the nodes comes before the acquire begins, so it never counts against the
timeout. Each test fails on the loops as they were before the issue (a sync injected sleep
that skipped ``waited``; an asyncio first contact after ``begin``).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from django_redlock import AsyncLease, AsyncLockManager, Lease, LockContended, LockManager
from django_redlock.core.engine import Engine
from django_redlock.core.lease import BaseLease
from django_redlock.procedures import flow
from django_redlock.procedures.shapes import Shape
from tests.helpers import FakeClock

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_redlock"

# -- signatures ------------------------------------------------------------------------------

# Public methods of AsyncLockManager that are plain functions, not coroutines, and why.
ASYNC_MANAGER_PLAIN = {
    "sharing": "a constructor (classmethod): no I/O",
    "key": "no I/O",
    "addresses_of": "no I/O",
    "lock": "returns an async context manager; the I/O happens at `async with`",
    "semaphore": "returns a handle whose acquire is a coroutine; no I/O",
    "rwlock": "returns a handle whose read/write are coroutines; no I/O",
    "open_connections": "counts sockets; no I/O",
    "close": "closes the engine's sync sockets (aclose closes this loop's); no I/O to await",
    "locks": "operators only, on no hot path: reads every node through clients of its own",
    "declare_fresh": "operators only: writes every node through clients of its own",
}
# Public methods of AsyncLease that are plain functions (all from BaseLease), and why.
ASYNC_LEASE_PLAIN = {
    "check": "no I/O: the local clock and what the lease noticed",
    "remaining": "no I/O: the local clock",
    "handle": "no I/O: the lease lets go locally, the adopter does the round",
    "renew_once": "the extender thread's sync renewal, for asyncio leases too",
}
# The context-manager protocols differ by nature (plain vs async); aclose has no sync twin
# because close already is the sync manager's only closing call.
SYNC_ONLY = {"__enter__", "__exit__"}
ASYNC_ONLY = {"__aenter__", "__aexit__", "aclose"}


def public(cls: type) -> dict[str, Any]:
    """The public members of ``cls`` (its MRO, ``object``'s aside), by name: functions,
    classmethods, properties; plus the context-manager dunders and ``__init__``."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, member in vars(klass).items():
            if name.startswith("_") and name not in (
                "__init__",
                "__enter__",
                "__exit__",
                "__aenter__",
                "__aexit__",
            ):
                continue
            found[name] = member
    return found


def shape_of(member: Any) -> list[tuple[str, Any, Any]]:
    """A callable's parameters as (name, kind, default), ``self``/``cls`` left out."""
    function = member.__func__ if isinstance(member, classmethod | staticmethod) else member
    parameters = list(inspect.signature(function).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in parameters]


def is_attribute(member: Any) -> bool:
    """A property or a slot, not a method."""
    return not (inspect.isfunction(member) or isinstance(member, classmethod | staticmethod))


def is_coroutine(member: Any) -> bool:
    return inspect.iscoroutinefunction(member)


@pytest.mark.parametrize(
    ("sync", "asynchronous", "plain"),
    [(LockManager, AsyncLockManager, ASYNC_MANAGER_PLAIN), (Lease, AsyncLease, ASYNC_LEASE_PLAIN)],
    ids=["managers", "leases"],
)
def test_the_asyncio_twin_has_the_same_public_names_and_signatures(sync, asynchronous, plain):
    mine, theirs = public(sync), public(asynchronous)
    # AsyncLease defines __enter__/__exit__ too, only to refuse a plain `with`.
    theirs_names = set(theirs) - ({"__enter__", "__exit__"} if sync is Lease else set())
    assert set(mine) - SYNC_ONLY == theirs_names - ASYNC_ONLY
    checked = 0
    for name, member in mine.items():
        if name in SYNC_ONLY:
            continue
        other = theirs[name]
        if sync is Lease and name == "__init__":
            continue  # leases are made by their managers, not by users: no twin needed
        assert is_attribute(member) == is_attribute(other), name
        if is_attribute(member):
            continue
        assert isinstance(member, classmethod) == isinstance(other, classmethod), name
        # Same names, order, kinds and defaults; the annotations may differ (a lease type,
        # a sleep function that is awaited).
        assert shape_of(member) == shape_of(other), name
        if name == "__init__":
            continue  # plain by nature
        assert not is_coroutine(member), name
        if name in plain:
            assert not is_coroutine(other), f"{name}: listed as plain ({plain[name]})"
        else:
            assert is_coroutine(other), f"{name}: a coroutine on the asyncio side, or list why"
        checked += 1
    assert checked >= (15 if sync is LockManager else 5)  # the comparison did compare
    assert set(plain) <= set(theirs)  # no stale reason


def test_a_signature_difference_is_seen():
    """The comparison above can fail: a twin with a reordered argument does not match."""

    def acquire(self, name, *, ttl=None, blocking=True): ...
    def acquire_other(self, name, *, blocking=True, ttl=None): ...

    assert shape_of(acquire) != shape_of(acquire_other)


# -- no forwarding, no import of the sync manager's module -------------------------------------


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any level (TYPE_CHECKING blocks included: a typing
    import of the sync manager would still tie the two together)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


SYNC_MANAGER = {"django_redlock.redlock", "django_redlock.core.manager"}
ASYNC_MANAGER = {"django_redlock.aredlock", "django_redlock.core.amanager"}


@pytest.mark.parametrize(
    ("module", "banned"),
    [
        ("aredlock.py", SYNC_MANAGER),
        ("core/amanager.py", SYNC_MANAGER),
        ("redlock.py", ASYNC_MANAGER),
        ("core/manager.py", ASYNC_MANAGER),
        ("core/engine.py", SYNC_MANAGER | ASYNC_MANAGER),
        ("core/lease.py", SYNC_MANAGER | ASYNC_MANAGER | {"django_redlock.core.reporting"}),
    ],
)
def test_neither_manager_module_imports_the_other(module, banned):
    imported = imported_modules(PACKAGE / module)
    assert imported, "the finder found the module's imports"
    assert not imported & banned


def test_the_import_finder_sees_the_sync_manager():
    assert imported_modules(PACKAGE / "redlock.py") & SYNC_MANAGER


def test_the_asyncio_manager_forwards_nothing():
    assert "__getattr__" not in vars(AsyncLockManager)
    assert "__getattr__" not in vars(LockManager)
    assert "__getattr__" not in vars(Engine)


def test_sharing_shares_one_engine_both_ways(cluster3):
    sync = LockManager(cluster3.urls, ttl=5.0)
    asynchronous = AsyncLockManager.sharing(sync)
    assert asynchronous.engine is sync.engine
    assert LockManager.sharing(asynchronous).engine is sync.engine
    assert asynchronous.ttl == 5.0
    assert asynchronous.quorum == sync.quorum == 2
    assert asynchronous.nodes == sync.nodes

    async def main() -> None:
        lease = await asynchronous.acquire("shared", ttl=5.0)
        # One re-entry registry: the sync manager sees the asyncio lease's owner record,
        # and the lease is hosted by the shared engine.
        assert lease.host is sync.engine
        assert len(sync.engine.held) == 1
        with pytest.raises(LockContended):
            LockManager(cluster3.urls).acquire("shared", blocking=False)
        await lease.release()
        await asynchronous.aclose()

    asyncio.run(main())
    assert len(sync.engine.held) == 0
    sync.close()


# -- the flow's actions ------------------------------------------------------------------------


def attempt(waiter: str = "w", listens: bool = True, blocking: bool = True) -> flow.Acquire:
    nodes = flow.Nodes(("a", "b", "c"), 2, 0.05, 0.01, 0.2)
    return flow.Acquire(
        nodes, "n", "k", 10.0, "{}", blocking, 0.0, 5.0, waiter, 1, 1000, listens=listens
    )


def failed_round(acquire: flow.Acquire, end: float = 0.1) -> flow.Failed:
    acquire.next_round(0)
    step = acquire.judge([5000, 5000, 5000], 0, 0.0, end)
    assert isinstance(step, flow.Failed)
    return step


def test_the_flow_says_subscribe_then_wait_to_a_waiter_that_listens():
    acquire = attempt()
    step = failed_round(acquire)
    first = acquire.after(step)
    assert isinstance(first, flow.Subscribe)
    assert first.key == Shape("k").wake_key
    assert acquire.subscribed(True, first.delay) is None  # just subscribed: try at once
    second = acquire.after(failed_round(acquire))
    assert isinstance(second, flow.Wait)


def test_the_flow_says_wait_when_the_channel_was_heard_all_along():
    acquire = attempt()
    action = acquire.after(failed_round(acquire))
    assert isinstance(action, flow.Subscribe)
    wait = acquire.subscribed(False, action.delay)
    assert isinstance(wait, flow.Wait)
    assert wait.delay == action.delay


@pytest.mark.parametrize(("waiter", "listens"), [("", True), ("w", False)])
def test_the_flow_says_sleep_to_a_try_that_cannot_hear_releases(waiter, listens):
    acquire = attempt(waiter, listens)
    action = acquire.after(failed_round(acquire))
    assert isinstance(action, flow.Sleep)


def test_the_flow_says_give_up_past_the_deadline():
    acquire = attempt()
    step = failed_round(acquire, end=6.0)
    action = acquire.after(step)
    assert isinstance(action, flow.GiveUp)
    assert action.error is step.error


def test_actions_carry_no_dict():
    for action in (flow.Sleep(0.1), flow.Wait(0.1), flow.Subscribe("k", 0.1)):
        assert not hasattr(action, "__dict__")


# -- the drifts, fixed: both managers, injected clock and sleep --------------------------------

RETRY = 0.05  # the back-off cap is then 0.2 s (flow.retry_delay): 0.05, 0.1, 0.2 ...
# Without the back-off every delay is RETRY * [0.5, 1.5]; with it the third is 0.2 * [0.5, 1.5].
NO_BACKOFF_MAX = RETRY * 1.5


class JumpingClock(FakeClock):
    """A fake clock that reads 100 s later once ``engine`` has heard from a quorum: the first
    contact with the nodes "takes" 100 s. An acquire that began before it (a ``timeout`` of
    5 s) would give up after its first try; one that began after it tries again."""

    engine: Engine | None = None

    def __call__(self) -> float:
        engine = self.engine
        heard = engine is not None and len(engine.quarantine.heard) >= engine.quorum
        return self.now + (100.0 if heard else 0.0)


def holder_of(cluster: Any, name: str) -> Lease:
    return LockManager(cluster.urls).acquire(name, ttl=30.0)


def test_a_sync_poll_with_an_injected_sleep_backs_off(cluster3, clock):
    held = holder_of(cluster3, "drift-sleep")
    manager = LockManager(cluster3.urls, retry_delay=RETRY, clock=clock, sleep=clock.sleep)
    with pytest.raises(LockContended):
        manager.acquire("drift-sleep", timeout=2.0)
    assert len(clock.sleeps) > 3
    assert clock.sleeps[2] > NO_BACKOFF_MAX  # the polls were counted (flow.Acquire.waited)
    held.release()


def test_an_asyncio_poll_with_an_injected_sleep_backs_off(cluster3, clock):
    held = holder_of(cluster3, "drift-sleep-async")

    async def sleep(seconds: float) -> None:
        clock.sleep(seconds)

    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, retry_delay=RETRY, clock=clock, sleep=sleep)
        with pytest.raises(LockContended):
            await manager.acquire("drift-sleep-async", timeout=2.0)
        await manager.aclose()

    asyncio.run(main())
    assert len(clock.sleeps) > 3
    assert clock.sleeps[2] > NO_BACKOFF_MAX
    held.release()


def test_the_sync_first_contact_does_not_count_against_the_timeout(cluster3):
    held = holder_of(cluster3, "drift-contact")
    clock = JumpingClock()
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep)
    clock.engine = manager.engine
    with pytest.raises(LockContended) as caught:
        manager.acquire("drift-contact", timeout=5.0)
    assert caught.value.attempts > 1
    held.release()


def test_the_asyncio_first_contact_does_not_count_against_the_timeout(cluster3):
    held = holder_of(cluster3, "drift-contact-async")
    clock = JumpingClock()

    async def sleep(seconds: float) -> None:
        clock.sleep(seconds)

    async def main() -> int:
        manager = AsyncLockManager(cluster3.urls, clock=clock, sleep=sleep)
        clock.engine = manager.engine
        try:
            with pytest.raises(LockContended) as caught:
                await manager.acquire("drift-contact-async", timeout=5.0)
            return caught.value.attempts
        finally:
            await manager.aclose()

    assert asyncio.run(main()) > 1
    held.release()


def test_the_jumping_clock_would_catch_a_first_contact_counted(cluster3):
    """The clock above does catch the drift: an acquire that begins before the first
    contact (here: a manager whose engine heard the nodes already, with the jump applied
    from its first reading) gives up after one try."""
    held = holder_of(cluster3, "drift-control")
    clock = JumpingClock()
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep)
    engine = manager.engine
    attempt = engine.begin(
        "drift-control",
        engine.check_arguments(None, True, 5.0, False, None, None),
        "",
        Shape(engine.key("drift-control")),
        listens=False,
    )
    clock.engine = engine
    manager.holder("drift-control")  # the first contact happens here, after begin
    assert engine.contact() is None
    step = failed_round_at(attempt, clock)
    assert step.give_up
    held.release()


def failed_round_at(acquire: flow.Acquire, clock: JumpingClock) -> flow.Failed:
    acquire.next_round(0)
    now = clock()
    step = acquire.judge([5000, 5000, 5000], 0, now, now)
    assert isinstance(step, flow.Failed)
    return step


def test_every_lease_is_hosted_by_the_engine(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("hosted", ttl=5.0)
    assert isinstance(lease, BaseLease)
    assert lease.host is manager.engine
    assert lease.host.clock is manager.engine.clock
    lease.release()


@pytest.mark.parametrize("default_timeout", [None, 0.0, 3.0])
@pytest.mark.parametrize("blocking", [False, True])
def test_default_options_are_checked_as_the_general_path_checks_them(default_timeout, blocking):
    """check_arguments answers the all-default call from a table built once per engine: it
    is the answer the checks give for the same options spelled out (a table built with a
    wrong wait, ttl or origin fails here)."""
    from django_redlock.procedures.options import MANAGER_DEFAULT

    engine = Engine(["redis://127.0.0.1:1"], ttl=7.5, default_timeout=default_timeout)
    fast = engine.check_arguments(None, blocking, MANAGER_DEFAULT, False, None, None)
    wait = default_timeout if blocking else None
    general = engine.check_arguments(engine.ttl, blocking, wait, False, None, None)
    assert fast == general
    assert type(fast) is type(general)
    assert fast.ttl == 7.5
    assert fast.wait == wait
    assert fast.origin is None


def test_default_options_still_refuse_a_blocking_that_is_no_bool():
    """The table is keyed by the bools only: ``blocking=1`` (equal to True, and hashing
    like it) still goes through the checks and is refused."""
    from django_redlock.procedures.options import MANAGER_DEFAULT

    engine = Engine(["redis://127.0.0.1:1"])
    with pytest.raises(TypeError, match="blocking must be a bool"):
        engine.check_arguments(None, 1, MANAGER_DEFAULT, False, None, None)
