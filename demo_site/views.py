"""The demo's pages: node state, and a button that takes and releases a lock."""

from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from django_redlock import LockNotAcquired, get_manager
from django_redlock.health import probe


def home(request: HttpRequest) -> HttpResponse:
    manager = get_manager()
    nodes = [probe(address) for address in manager.addresses]
    reachable = sum(1 for node in nodes if node.reachable)
    return render(
        request,
        "demo/home.html",
        {
            "manager": manager,
            "nodes": nodes,
            "reachable": reachable,
            "quorum_ok": reachable >= manager.quorum,
            "result": request.session.pop("result", None),
        },
    )


@require_POST
def take_and_release(request: HttpRequest) -> HttpResponse:
    manager = get_manager()
    started = time.perf_counter()
    try:
        with manager.lock("demo:button", ttl=10.0, timeout=2.0, origin="demo_site.views") as lease:
            held_for = lease.validity
        request.session["result"] = {
            "ok": True,
            "text": f"Took and released 'demo:button' in "
            f"{(time.perf_counter() - started) * 1000:.2f} ms; validity at acquire was "
            f"{held_for:.3f} s of a 10 s lease.",
        }
    except LockNotAcquired as exc:
        request.session["result"] = {"ok": False, "text": f"{type(exc).__name__}: {exc}"}
    return redirect("home")
