"""@locked_view (FBV/CBV, sync/async) and @locked_command against real nodes."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import AsyncClient, Client

from django_redlock import LockManager, get_manager
from tests.helpers import node_client

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/pay/7/"), ("post", "/cbv/7/"), ("post", "/mixin/7/")],
)
@pytest.mark.usefixtures("redlock_nodes")
def test_sync_views_hold_the_named_lock_while_they_run(client: Client, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 200
    holder = response.json()["holder"]
    assert holder["origin"].startswith("view:")
    assert holder["nodes"] >= 2


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/pay/7/"), ("post", "/cbv/7/"), ("post", "/mixin/7/"), ("get", "/polite/7/")],
)
@pytest.mark.usefixtures("redlock_nodes")
def test_a_lock_held_by_another_process_answers_423_with_retry_after(
    client: Client, held_elsewhere, method, path
):
    with held_elsewhere("order:7"):
        response = getattr(client, method)(path)
        other = getattr(client, method)(path.replace("7", "8"))
    if path.startswith("/polite/"):
        assert response.status_code == 409
        assert response.content == b"busy, sorry"
    else:
        assert response.status_code == 423
        assert 1 <= int(response["Retry-After"]) <= 30
    assert other.status_code == 200  # another name is another lock


@pytest.mark.parametrize("path", ["/apay/7/", "/amixin/7/"])
@pytest.mark.usefixtures("redlock_nodes")
def test_async_views_lock_and_answer_423(held_elsewhere, path):
    import asyncio

    client = AsyncClient()
    method = client.get if path.startswith("/apay/") else client.post

    async def call():
        return await method(path)

    assert asyncio.run(call()).json() == {"async": True, "pk": 7}
    with held_elsewhere("order:7"):
        response = asyncio.run(call())
    assert response.status_code == 423
    assert response["Retry-After"]


@pytest.mark.usefixtures("redlock_nodes")
def test_default_and_callable_names(client: Client):
    holder = client.get("/default/").json()["holder"]
    assert holder["origin"] == "view:tests.views.default_name"
    assert client.get("/callable/3/?x=y").json()["holder"] is not None


def test_a_name_over_a_missing_kwarg_is_a_clear_error(client: Client):
    with pytest.raises(ValueError, match="refers to 'missing'"):
        client.get("/misnamed/1/")


def test_no_quorum_answers_503(client: Client, redlock_nodes):
    redlock_nodes[0].pause()
    redlock_nodes[1].kill()
    response = client.get("/pay/7/")
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert client.get("/polite/7/").status_code == 502


def test_bad_decorator_arguments_fail_at_decoration():
    from django_redlock import locked_command, locked_view

    with pytest.raises(TypeError, match="name must be"):
        locked_view(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be"):
        locked_view(timeout=-1)
    with pytest.raises(ValueError, match="on_busy must be"):
        locked_command(on_busy="retry")  # type: ignore[arg-type]


# -- commands ------------------------------------------------------------------------------


@pytest.mark.usefixtures("redlock_nodes")
def test_a_command_runs_under_its_own_name():
    out = io.StringIO()
    call_command("nightly_report", stdout=out)
    assert out.getvalue().strip() == "report built under command:nightly_report"


@pytest.mark.usefixtures("redlock_nodes")
def test_a_busy_command_is_skipped_with_the_holder_named(held_elsewhere):
    out, err = io.StringIO(), io.StringIO()
    with held_elsewhere("nightly_report"):
        call_command("nightly_report", stdout=out, stderr=err)
    assert out.getvalue() == ""
    assert "Skipped: nightly_report is already running" in err.getvalue()
    assert "tests.holder" in err.getvalue()
    assert "pid " in err.getvalue()
    assert " since 20" in err.getvalue()


@pytest.mark.usefixtures("redlock_nodes")
def test_a_busy_command_can_fail_instead(held_elsewhere):
    with held_elsewhere("nightly_report"), pytest.raises(CommandError, match="already running"):
        call_command("strict_report")


def test_a_busy_command_can_wait_for_the_holder(redlock_nodes):
    import threading

    lease = get_manager().acquire("nightly_report", ttl=10.0)
    started = threading.Event()
    out = io.StringIO()

    def run():
        started.set()
        call_command("patient_report", stdout=out)

    worker = threading.Thread(target=run)
    worker.start()
    started.wait(5)
    lease.release()  # the waiting command gets it on its next attempt
    worker.join(30)
    assert out.getvalue().strip() == "patient report built"


@pytest.mark.usefixtures("redlock_nodes")
def test_a_failing_command_releases_its_lock():
    with pytest.raises(RuntimeError, match="report failed"):
        call_command("nightly_report", fail=True)
    out = io.StringIO()
    call_command("nightly_report", stdout=out)
    assert "report built" in out.getvalue()


def test_commands_from_the_shell(redlock_nodes, held_elsewhere):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "REDLOCK_TEST_NODES": ",".join(redlock_nodes.urls),
    }
    command = [sys.executable, "-m", "django", "nightly_report"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "report built under command:nightly_report" in done.stdout
    with held_elsewhere("nightly_report"):
        skipped = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        failed = subprocess.run(
            [sys.executable, "-m", "django", "strict_report"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert skipped.returncode == 0
    assert "Skipped: nightly_report is already running" in skipped.stderr
    assert failed.returncode == 1
    assert "already running" in failed.stderr


def test_retry_after_is_the_holders_time_left_on_the_nodes(client: Client, redlock_nodes):
    # Another holder (a manager of its own: in this thread the view would re-enter ours).
    lease = LockManager(redlock_nodes.urls).acquire("order:9", ttl=30.0)
    for node in redlock_nodes:
        with node_client(node) as node_redis:
            node_redis.pexpire(lease.key, 6_500)  # as if the last renewal was 23.5 s ago
    response = client.get("/pay/9/")
    assert response.status_code == 423
    assert response["Retry-After"] == "7"  # rounded up, not the configured 30
    lease.release()


@pytest.mark.parametrize("path", ["/lose/3/", "/alose/3/"])
@pytest.mark.usefixtures("redlock_nodes")
def test_a_lease_lost_while_the_view_ran_is_logged_and_the_response_kept(
    client: Client, path, caplog
):
    # The view's work is done and its response made: a 500 would hide that. The loss is an
    # operator's business: logged at ERROR (and signalled), for sync and async views alike.
    with caplog.at_level("ERROR", logger="django_redlock"):
        response = client.get(path)
    assert response.status_code == 200
    assert response.content == b"done"
    lost = [r for r in caplog.records if "was lost while the view ran" in r.getMessage()]
    assert len(lost) == 1
    assert "'lose:3'" in lost[0].getMessage()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redlock_nodes")
def test_a_locked_view_in_a_request_transaction_holds_its_lock_until_the_commit():
    # ATOMIC_REQUESTS wraps the decorated view in atomic(): its writes commit after it
    # returns. Released before that, the next request reads the old value and its write
    # overwrites ours (a lost update, found by an adversarial test on PostgreSQL).
    from django.db import transaction
    from django.http import HttpResponse
    from django.test import RequestFactory

    from django_redlock import locked_view

    at_commit: list[bool] = []

    @locked_view("counter")
    def view(request):
        transaction.on_commit(lambda: at_commit.append(get_manager().locked("counter")))
        return HttpResponse("ok")

    with transaction.atomic():  # what the handler does around the view with ATOMIC_REQUESTS
        assert view(RequestFactory().get("/")).status_code == 200
        assert get_manager().locked("counter")  # the writes are not committed yet
    assert at_commit == [True]
    assert not get_manager().locked("counter")  # released by the commit
    view(RequestFactory().get("/"))  # no transaction: released when the view returns
    assert not get_manager().locked("counter")


@pytest.mark.usefixtures("redlock_nodes")
def test_a_lock_name_made_invalid_by_the_request_is_a_400_not_a_500():
    # URL values are the client's: control characters or a huge value make no valid lock
    # name, and that is a bad request (found by an adversarial test: it was a 500).
    from django.http import HttpResponse
    from django.test import RequestFactory
    from django.views import View

    from django_redlock import LockedViewMixin, locked_view

    @locked_view("order:{pk}")
    def view(request, pk):
        return HttpResponse("ok")

    request = RequestFactory().get("/")
    assert view(request, pk="7").status_code == 200
    assert view(request, pk="a\nb").status_code == 400
    assert view(request, pk="x" * 1100).status_code == 400

    class Misnamed(LockedViewMixin, View):
        lock_name = "order:{missing}"

        def get(self, request, pk):
            return HttpResponse("ok")

    with pytest.raises(ValueError, match="refers to 'missing'"):  # the view's own bug
        Misnamed.as_view()(request, pk="7")
