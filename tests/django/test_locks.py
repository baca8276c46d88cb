"""lock_for / alock_for with real nodes: names, auto-extension, loss, signals."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_redlock import (
    LockContended,
    LockLost,
    alock_for,
    get_manager,
    lock_for,
)
from django_redlock.locks import lock_name
from django_redlock.signals import lock_acquired, lock_busy, lock_lost, lock_released
from tests.helpers import node_client
from tests.testapp.models import Invoice


@pytest.mark.django_db
@pytest.mark.usefixtures("redlock_nodes")
def test_a_model_instance_locks_app_label_model_name_and_pk():
    invoice = Invoice.objects.create(number="A-1")
    with lock_for(invoice) as lease:
        assert lease.name == f"testapp.invoice:{invoice.pk}"
        owner = get_manager().holder(lease.name)
        assert owner is not None
        assert (
            owner["origin"] == f"{__name__}:test_a_model_instance_locks_app_label_model_name_and_pk"
        )
    assert lease.released


def test_names_for_strings_unsaved_instances_and_other_things():
    assert lock_name("reports:daily") == "reports:daily"
    with pytest.raises(ValueError, match="unsaved Invoice"):
        lock_name(Invoice(number="x"))
    with pytest.raises(TypeError, match="not int"):
        lock_name(42)
    with pytest.raises(ValueError, match="unsaved"), lock_for(Invoice(number="x")):
        pass


@pytest.mark.usefixtures("redlock_nodes")
def test_lock_for_is_auto_extended_by_default(settings):
    with lock_for("auto") as lease:
        assert lease.auto_extended
    with lock_for("manual", auto_extend=False) as lease:
        assert not lease.auto_extended


@pytest.mark.usefixtures("redlock_nodes")
def test_a_busy_lock_times_out_with_lock_contended(held_elsewhere):
    with held_elsewhere("busy"), pytest.raises(LockContended), lock_for("busy", timeout=0.2):
        pass


def test_a_failed_renewal_sends_lock_lost_and_leaving_raises(redlock_nodes):
    lost = threading.Event()
    reasons: list[str] = []
    causes: list[str] = []

    def on_lost(sender, name, reason, cause, at, **kwargs):
        reasons.append(reason)
        causes.append(cause)
        lost.set()

    def lose_it():
        with lock_for("fragile", ttl=0.3) as lease:
            for node in redlock_nodes.nodes[:2]:
                with node_client(node) as client:
                    client.delete(lease.key)
            assert lost.wait(10)
            assert lease.lost

    lock_lost.connect(on_lost)
    try:
        with pytest.raises(LockLost):
            lose_it()
    finally:
        lock_lost.disconnect(on_lost)
    assert reasons
    assert "no longer held by a quorum" in reasons[0]
    assert causes == ["gone"]


def test_an_error_in_the_block_wins_over_a_lost_lease(redlock_nodes):
    def fail():
        with lock_for("fragile2", ttl=0.3) as lease:
            for node in redlock_nodes.nodes:
                with node_client(node) as client:
                    client.delete(lease.key)
            raise KeyError("the block's own error")

    with pytest.raises(KeyError):
        fail()


@pytest.mark.usefixtures("redlock_nodes")
def test_signals_carry_name_origin_and_times(held_elsewhere):
    seen: list[tuple[str, str, object]] = []

    def acquired(sender, name, origin, waited, **kwargs):
        seen.append(("acquired", name, waited >= 0))

    def released(sender, name, origin, held, **kwargs):
        seen.append(("released", name, held >= 0))

    def busy(sender, name, origin, error, waited, **kwargs):
        seen.append(("busy", name, type(error).__name__))

    for signal, receiver in (
        (lock_acquired, acquired),
        (lock_released, released),
        (lock_busy, busy),
    ):
        signal.connect(receiver)
    try:
        with lock_for("signalled"):
            pass
        with (
            held_elsewhere("signalled"),
            pytest.raises(LockContended),
            lock_for("signalled", blocking=False),
        ):
            pass
    finally:
        for signal, receiver in (
            (lock_acquired, acquired),
            (lock_released, released),
            (lock_busy, busy),
        ):
            signal.disconnect(receiver)
    assert seen == [
        ("acquired", "signalled", True),
        ("released", "signalled", True),
        ("busy", "signalled", "LockContended"),
    ]


@pytest.mark.usefixtures("redlock_nodes")
def test_a_receiver_that_raises_never_breaks_locking(caplog):
    def broken(**kwargs):
        raise RuntimeError("metrics are down")

    lock_acquired.connect(broken)
    try:
        with lock_for("robust") as lease:
            assert not lease.lost
    finally:
        lock_acquired.disconnect(broken)
    assert "metrics are down" in caplog.text


@pytest.mark.usefixtures("redlock_nodes")
def test_alock_for_in_async_code(held_elsewhere):
    async def main() -> None:
        async with alock_for("async-job") as lease:
            assert not lease.lost
            assert get_manager().holder("async-job") is not None
        assert lease.released
        with held_elsewhere("async-job"), pytest.raises(LockContended):
            async with alock_for("async-job", timeout=0.1):
                pass

    asyncio.run(main())


@pytest.mark.django_db
def test_shared_blocks_share_and_exclude_an_exclusive_one(redlock_nodes):
    with lock_for("report:7", shared=True) as first, lock_for("report:7", shared=True) as second:
        assert first.kind == second.kind == "read"
        with pytest.raises(LockContended), lock_for("report:7", blocking=False):
            pass
    with lock_for("report:7") as exclusive:
        assert exclusive.kind == "lock"
        with pytest.raises(LockContended), lock_for("report:7", shared=True, blocking=False):
            pass
    with pytest.raises(ValueError, match="fencing=True"), lock_for("r", shared=True, fencing=True):
        pass
    with pytest.raises(TypeError, match="shared"), lock_for("r", shared="yes"):  # type: ignore[arg-type]
        pass


@pytest.mark.django_db
def test_alock_for_takes_a_shared_lease_too(redlock_nodes):
    async def main() -> None:
        async with alock_for("report:8", shared=True) as lease:
            assert lease.kind == "read"
            assert lease.auto_extended
            with pytest.raises(LockContended):
                async with alock_for("report:8", blocking=False):
                    pass
        assert lease.released

    asyncio.run(main())


@pytest.mark.django_db
def test_signals_name_the_kind_of_lease(redlock_nodes):
    seen = []

    def acquired(sender, name, kind, **kwargs):
        seen.append((name, kind))

    lock_acquired.connect(acquired)
    try:
        manager = get_manager()
        manager.semaphore("api", 2).acquire(ttl=10.0).release()
        manager.rwlock("table").write(ttl=10.0).release()
        manager.lock_many(["a", "b"], ttl=10.0).release()
        with lock_for("c"):
            pass
    finally:
        lock_acquired.disconnect(acquired)
    assert seen == [("api", "semaphore"), ("table", "write"), ("a + b", "many"), ("c", "lock")]


def test_lock_for_gives_up_on_a_total_outage_unless_told_to_wait(settings, cluster3):
    """Every node refuses connections: by default the block gives up after two rounds and
    says so; ``timeout=None`` keeps trying (it was read as "not given", and gave up too)."""
    from django_redlock import QuorumUnreachable

    settings.REDLOCK = {"NODES": cluster3.urls, "NODE_TIMEOUT": 0.02, "RETRY_DELAY": 0.01}
    for node in cluster3:
        node.kill()
    with pytest.raises(QuorumUnreachable) as refused, lock_for("outage:1"):
        pass
    assert refused.value.attempts == 2
    assert "timeout=None waits for them" in str(refused.value)

    reporter = get_manager().engine.reporter
    original = reporter.attempt_failed
    failures: list[object] = []

    def failed(error):
        failures.append(error)
        if len(failures) == 5:  # well past the two rounds of giving up: the nodes come back
            for node in cluster3:
                node.start(fresh=True)
        original(error)

    reporter.attempt_failed = failed  # type: ignore[method-assign]
    with lock_for("outage:1", timeout=None) as lease:
        assert lease.validity > 0
    assert len(failures) >= 5
