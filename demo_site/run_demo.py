"""``./run demo``: the seat-booking story on three local nodes, then the site that shows it.

1. Start three local nodes, migrate a fresh SQLite database, serve the site in the background.
2. Run the story twice (``demo_site/story.py``): buyer processes race for seats while a
   nemesis pauses nodes and buyers, first with fencing on, then with fencing off. The
   terminal shows it live; a summary follows.
3. Keep serving http://127.0.0.1:8000/ (bookings, refused writes, double sales, the admin's
   Active locks page) until Ctrl-C, SIGTERM or SIGHUP, which stop the server and the nodes.

Whatever ends it, the demo leaves no process behind: a signal (SIGINT, SIGTERM, SIGHUP, or
the SIGTERM it asks for when the process that started it dies) unwinds through the clean-ups
that stop the buyers, the server and the nodes; and if it is killed outright, they follow
it by themselves (the server and nodes by their parent-death signal, the buyers by their
parent's sentinel).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from django_redlock.localnodes import (
    DURABLE_ARGS,
    LocalCluster,
    _die_with_parent,
    server_version,
)

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    parser.add_argument("--addr", default="127.0.0.1:8000", help="where to serve")
    parser.add_argument("--buyers", type=int, default=4, help="buyer processes (default 4)")
    parser.add_argument("--seats", type=int, default=24, help="seats per run (default 24)")
    parser.add_argument("--seed", type=int, help="the nemesis' seed (default: random, printed)")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per run at most")
    parser.add_argument(
        "--no-serve", action="store_true", help="exit after the summary instead of serving"
    )
    args = parser.parse_args(argv)
    for option in ("nodes", "buyers", "seats"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be at least 1")
    seed = args.seed if args.seed is not None else random.randrange(10_000)
    stop_on_signals()

    # Started as an operator would, with durable persistence: they vote at once, with nothing
    # declared (a node without it would wait out the restart quarantine first).
    with (
        LocalCluster(args.nodes, extra_args=DURABLE_ARGS, fresh=False) as cluster,
        tempfile.TemporaryDirectory() as scratch,
    ):
        print(
            f"started {args.nodes} nodes ({server_version()}, appendonly yes + appendfsync "
            "always: they vote at once, nothing to declare):"
        )
        for url in cluster.urls:
            print(f"  {url}")
        database = os.environ.get("REDLOCK_DEMO_DB") or str(Path(scratch) / "demo.sqlite3")
        os.environ.update(
            DJANGO_SETTINGS_MODULE="demo_site.settings",
            REDLOCK_DEMO_NODES=",".join(cluster.urls),
            REDLOCK_DEMO_DB=database,
            REDLOCK_DEMO_LOG=str(Path(scratch) / "locks.log"),
        )
        manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run(
            [*manage, "migrate", "--no-input", "-v", "0"], check=True, preexec_fn=_die_with_parent
        )
        server_log = Path(scratch) / "runserver.log"
        with server_log.open("wb") as log:
            server = subprocess.Popen(
                [*manage, "runserver", "--noreload", args.addr],
                stdout=log,
                stderr=log,
                preexec_fn=_die_with_parent,  # never outlives the demo, even a killed one
            )
        try:
            if not serving(server, args.addr):
                print(server_log.read_text(errors="replace"), file=sys.stderr)
                print(
                    f"the site could not be served on {args.addr} (see above); "
                    "pick another address with --addr HOST:PORT",
                    file=sys.stderr,
                )
                return 2
            reports = tell_the_story(cluster, args, seed)
            if args.no_serve:
                print("\n--no-serve: the story is told, nothing is served.", flush=True)
                return 0 if reports[0]["doubles"] == 0 else 1
            print(f"\nThe site: http://{args.addr}/  (admin: admin / admin)", flush=True)
            print("serving until Ctrl-C (or SIGTERM)", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while server.poll() is None:
                    time.sleep(0.5)
            if server.returncode not in (None, 0):
                print(server_log.read_text(errors="replace"), file=sys.stderr)
        finally:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(10)
    return 0


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stop_on_signals() -> None:
    """SIGTERM (kill, a supervisor, a test) and SIGHUP (a closed terminal) unwind like Ctrl-C,
    through the clean-ups that stop the buyers, the server and the nodes, and the demo exits
    with 128 + the signal's number. Ctrl-C is Python's own KeyboardInterrupt, unless the
    demo was started with SIGINT ignored (from a script, in the background): then SIGTERM is
    the way to stop it.

    The process that started the demo dying is one more SIGTERM (Linux: the parent-death
    signal), so that a killed ``./run demo``'s caller, or test, leaves no demo serving."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _unwind)
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # it died before the line above: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def _unwind(signum: int, frame: object) -> None:
    # Once: a second signal must not cut short the clean-ups this exception runs.
    for each in _STOP_SIGNALS:
        signal.signal(each, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def serving(server: subprocess.Popen[bytes], addr: str, timeout: float = 30.0) -> bool:
    """Wait until our site answers on ``addr``; False if the server exits first (a port
    already taken) or ``timeout`` seconds pass. Another program on that port does not count:
    the page must be ours."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://{addr}/", timeout=2) as response:
                if b"Seat booking on django_redlock" in response.read():
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def tell_the_story(
    cluster: LocalCluster, args: argparse.Namespace, seed: int
) -> list[dict[str, Any]]:
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from demo_site.models import Event, Seat
    from demo_site.story import LiveView, Phase, summary

    User = get_user_model()
    if not User.objects.filter(username="admin").exists():
        User.objects.create_superuser("admin", "admin@example.com", "admin")
    Event.objects.all().delete()
    view = LiveView(sys.stdout)
    reports = []
    print(
        f"\n{args.buyers} buyer processes race for {args.seats} seats; a nemesis (seed {seed}) "
        "pauses buyers mid-checkout for longer than their lease, pauses nodes, and kills buyers."
    )
    for fenced in (True, False):
        print(
            "\nRun 1: fencing on. A stale buyer's write is refused by the database."
            if fenced
            else "\nRun 2: the same, fencing off (what a plain Redis lock gives you)."
        )
        phase = Phase(
            fenced=fenced, seats=args.seats, buyers=args.buyers, seed=seed, cluster=cluster
        )
        phase.run(view, args.limit)
        reports.append(phase.report())
    # Seats nobody races for, for visitors to buy from the page.
    open_sale = Event.objects.create(name="Open sale", fenced=True)
    Seat.objects.bulk_create(Seat(event=open_sale, label=f"Z{i}") for i in range(1, 7))

    print("\nSummary (the same buyers, pauses and seed in both runs):")
    for line in summary(reports):
        print(line)
    fenced_report, unfenced_report = reports
    print(
        f"\nWith fencing, no seat was sold twice ({fenced_report['refused']} stale writes "
        f"refused); without, {unfenced_report['doubles']} seat(s) were sold twice."
    )
    return reports


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the site was served: the clean-ups ran
        sys.exit(130)
