"""The demo's story: buyers race for seats while a nemesis pauses nodes and buyers.

Two runs of the same code. In the first, seats are ``FencedModel`` rows, so a buyer whose
lease ran out while it was paused has its late write refused by the database
(``StaleFencingToken``). In the second, fencing is off (``lock_for(seat, fencing=False)``, what
a plain Redis lock gives you) and the same pauses sell seats twice. Each buyer is a separate
process running ``demo_site.services.book_seat``; the nemesis (in this process) SIGSTOPs a
buyer in the middle of its checkout for longer than its lease, SIGSTOPs one node at a time
(a minority: the locks keep working), and now and then SIGKILLs a buyer mid-checkout
(its hold is then cleared by ``manage.py clear_expired_holds``, a ``@locked_command``).
The payment provider takes at most ``PAYMENT_SLOTS`` calls at once from all buyers: each
payment holds a slot of a semaphore (``manager.semaphore``); a buyer paused mid-payment
loses its slot to the next one, and is told so (``LockLost``) when it resumes.

Everything here runs after ``django.setup()``; ``demo_site/run_demo.py`` is the entry point.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from django.core.management import call_command

from django_redlock.localnodes import LocalCluster

# Lease of a buyer's seat lock (s). Short, so the story moves: a pause longer than this is a
# lost lease. The nemesis pauses buyers for PAUSE_FACTOR times as long.
TTL = 1.0
PAUSE_FACTOR = 1.6
HOLD_SECONDS = TTL / 2  # a checkout that dies leaves a hold this long (then it is stale)
LOCK_TIMEOUT = 3.0  # how long a buyer waits for a seat's lock before trying another seat
# The payment provider takes at most this many calls at once, from every buyer: a semaphore
# (manager.semaphore). A buyer paused mid-payment keeps its slot only until its lease runs out.
PAYMENT_SLOTS = 2

# What each buyer is doing, shared with the driver (one int per buyer).
IDLE, WAITING, PAYING, DONE = 0, 1, 2, 3
STATE_NAMES = {IDLE: "idle", WAITING: "waiting", PAYING: "paying", DONE: "done"}
# Outcome counters, one row of these per buyer.
COUNTERS = ("sold", "taken", "busy", "refused", "lost", "errors", "slots_lost")


@dataclass
class Shared:
    """Memory the buyers and the driver share."""

    buyers: int
    state: Any = None  # multiprocessing.Array('i', buyers)
    seat: Any = None  # the seat id each buyer is on (0: none)
    counts: Any = None  # multiprocessing.Array('i', buyers * len(COUNTERS))

    def __post_init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.state = context.Array("i", self.buyers, lock=False)
        self.seat = context.Array("i", self.buyers, lock=False)
        self.counts = context.Array("i", self.buyers * len(COUNTERS), lock=False)

    def total(self, counter: str) -> int:
        offset = COUNTERS.index(counter)
        return sum(self.counts[i * len(COUNTERS) + offset] for i in range(self.buyers))


def buyer_main(index: int, event_id: int, seed: int, shared: Shared) -> None:
    """One buyer process: buy seats of ``event_id`` until none is left."""
    _end_with_the_demo()
    import django

    django.setup()
    from demo_site.models import Seat
    from demo_site.services import Outcome, book_seat
    from django_redlock import LockLost, QuorumUnreachable, get_manager

    rng = random.Random(seed)
    row = index * len(COUNTERS)

    def count(counter: str) -> None:
        shared.counts[row + COUNTERS.index(counter)] += 1

    provider = get_manager().semaphore("payment-provider", PAYMENT_SLOTS)

    def pay() -> None:
        # At most PAYMENT_SLOTS calls to the payment provider at once, cluster-wide. A buyer
        # paused mid-payment loses its slot when the lease runs out (another buyer takes
        # it); it learns so when it leaves the block, as with a seat's lock.
        shared.state[index] = PAYING
        try:
            with provider.acquire(ttl=TTL, timeout=LOCK_TIMEOUT, auto_extend=True):
                time.sleep(rng.uniform(0.2, 0.4))  # the payment provider
        except LockLost:
            count("slots_lost")
        shared.state[index] = WAITING

    sale = 0
    while True:
        shared.state[index] = IDLE
        shared.seat[index] = 0
        try:
            # Everybody wants the best seats: pick one of the first two still unsold.
            choices = list(
                Seat.objects.filter(event_id=event_id, sold_to="")
                .select_related("event")
                .order_by("id")[:2]
            )
            if not choices:
                break
            seat = rng.choice(choices)
            shared.seat[index] = seat.pk
            shared.state[index] = WAITING
            sale += 1
            result = book_seat(
                seat,
                f"customer {index}.{sale}",
                worker=f"buyer {index} (pid {os.getpid()})",
                pay=pay,
                ttl=TTL,
                timeout=LOCK_TIMEOUT,
                hold_seconds=HOLD_SECONDS,
            )
        except QuorumUnreachable:
            count("errors")
            time.sleep(0.05)
            continue
        except Exception as error:  # the demo keeps going; the errors count shows it
            print(f"buyer {index}: {type(error).__name__}: {error}", file=sys.stderr)
            count("errors")
            time.sleep(0.05)
            continue
        if result.lease_lost:
            count("lost")
        count(
            {
                Outcome.SOLD: "sold",
                Outcome.TAKEN: "taken",
                Outcome.BUSY: "busy",
                Outcome.REFUSED: "refused",
            }[result.outcome]
        )
    shared.state[index] = DONE


def _end_with_the_demo() -> None:
    """End this buyer when the demo's process ends, however it ended (SIGKILL included, where
    no clean-up of the demo ran). Not by the parent-death signal: that follows the thread that
    started the buyer, and the nemesis' thread (which restarts killed buyers) ends before the
    buyers do. multiprocessing gives a child a sentinel that closes when its parent process
    exits; a thread waits on it. (A buyer the nemesis had stopped is woken by the kernel: the
    demo's death leaves its process group orphaned, and a stopped member of an orphaned
    group gets SIGHUP and SIGCONT.)"""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait_for_the_demo() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=wait_for_the_demo, name="end-with-the-demo", daemon=True).start()


@dataclass
class Nemesis:
    """Pauses buyers mid-checkout and nodes, and kills buyers, at seeded random moments."""

    cluster: LocalCluster
    seed: int
    log: list[str] = field(default_factory=list)
    pauses: int = 0
    node_pauses: int = 0
    kills: int = 0

    def run(self, story: Phase, stop: threading.Event) -> None:
        rng = random.Random(self.seed)
        started = time.monotonic()

        def paying_now() -> list[int]:
            return [i for i in range(story.shared.buyers) if story.shared.state[i] == PAYING]

        while not stop.wait(rng.uniform(0.2, 0.5)):
            roll = rng.random()
            paying = paying_now()
            # The story's point is a buyer paused past its lease: until one was, wait for a
            # buyer at the payment step (a run that happened never to catch one showed
            # nothing: "0 seats sold twice" without the fence, seed 7216).
            while not self.pauses and not paying and not stop.wait(0.02):
                paying = paying_now()
            at = f"{time.monotonic() - started:5.1f}s"
            if (roll < 0.55 or not self.pauses) and paying:
                index = rng.choice(paying)
                pid = story.processes[index].pid
                assert pid is not None
                seat = story.seat_label(story.shared.seat[index])
                pause = TTL * PAUSE_FACTOR
                self.log.append(
                    f"{at} paused buyer {index} mid-checkout of {seat} for {pause:.1f} s"
                )
                story.paused.add(index)
                os.kill(pid, signal.SIGSTOP)
                stop.wait(pause)
                os.kill(pid, signal.SIGCONT)
                story.paused.discard(index)
                self.pauses += 1
            elif roll < 0.8 or not paying:
                node = rng.randrange(len(self.cluster))
                self.log.append(f"{at} paused node {node} for 0.5 s")
                story.paused_nodes.add(node)
                self.cluster[node].pause()
                stop.wait(0.5)
                self.cluster[node].resume()
                story.paused_nodes.discard(node)
                self.node_pauses += 1
            elif paying:
                index = rng.choice(paying)
                seat = story.seat_label(story.shared.seat[index])
                self.log.append(f"{at} killed buyer {index} mid-checkout of {seat}; restarted it")
                story.restart_buyer(index, kill=True)
                self.kills += 1


class Phase:
    """One run of the story on one event."""

    def __init__(
        self, *, fenced: bool, seats: int, buyers: int, seed: int, cluster: LocalCluster
    ) -> None:
        from demo_site.models import Event, Seat

        self.fenced = fenced
        self.seed = seed
        self.cluster = cluster
        name = "Concert, fencing on" if fenced else "Concert, fencing off"
        self.event = Event.objects.create(name=name, fenced=fenced)
        rows = "ABCDEFGH"
        Seat.objects.bulk_create(
            Seat(event=self.event, label=f"{rows[i // 8 % len(rows)]}{i % 8 + 1}")
            for i in range(seats)
        )
        self.labels = dict(Seat.objects.filter(event=self.event).values_list("id", "label"))
        self.seats = seats
        self.shared = Shared(buyers)
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.paused: set[int] = set()
        self.paused_nodes: set[int] = set()
        self.restarts = 0
        self.sweeps = 0
        self.holds_cleared = 0

    def seat_label(self, seat_id: int) -> str:
        return self.labels.get(seat_id, "?")

    def restart_buyer(self, index: int, *, kill: bool = False) -> None:
        old = self.processes[index] if index < len(self.processes) else None
        if kill and old is not None and old.pid is not None:
            os.kill(old.pid, signal.SIGKILL)
            old.join(5)
            self.restarts += 1
        context = multiprocessing.get_context("spawn")
        process = context.Process(
            target=buyer_main,
            args=(
                index,
                self.event.pk,
                self.seed * 1000 + index + 100 * self.restarts,
                self.shared,
            ),
            daemon=True,
        )
        self.shared.state[index] = IDLE
        process.start()
        if old is None:
            self.processes.append(process)
        else:
            self.processes[index] = process

    def sold(self) -> int:
        from demo_site.models import Seat

        return Seat.objects.filter(event=self.event).exclude(sold_to="").count()

    def run(self, view: LiveView, limit: float) -> None:
        nemesis = Nemesis(self.cluster, self.seed)
        stop = threading.Event()
        for index in range(self.shared.buyers):
            self.restart_buyer(index)
        chaos = threading.Thread(target=nemesis.run, args=(self, stop), daemon=True)
        chaos.start()
        started = time.monotonic()
        last_sweep = started
        try:
            while True:
                sold = self.sold()
                alive = any(p.is_alive() for p in self.processes)
                view.draw(self, nemesis, sold, time.monotonic() - started)
                if sold >= self.seats or not alive or time.monotonic() - started > limit:
                    break
                if time.monotonic() - last_sweep > 1.0:
                    # The housekeeping a cron job would do: one run at a time, cluster-wide.
                    with contextlib.redirect_stdout(_Counter(self)):
                        call_command("clear_expired_holds")
                    self.sweeps += 1
                    last_sweep = time.monotonic()
                time.sleep(0.2)
        finally:
            stop.set()
            chaos.join(10)
            interrupted = sys.exc_info()[0] is not None
            for process in self.processes:
                if interrupted and process.pid is not None:
                    os.kill(process.pid, signal.SIGCONT)  # in case the nemesis had it paused
                    process.kill()
                process.join(15)
                if process.is_alive():
                    process.kill()
                    process.join(5)
        self.nemesis = nemesis
        self.elapsed = time.monotonic() - started
        view.draw(self, nemesis, self.sold(), self.elapsed, final=True)

    def report(self) -> dict[str, Any]:
        from demo_site.views import event_report

        report = event_report(self.event)
        return {
            "name": self.event.name,
            "seats": self.seats,
            "sold": report["sold"],
            "sales": report["sales"],
            "doubles": len(report["doubles"]),
            "refused": report["rejection_count"],
            "lost_leases": report["lost_leases"],
            "buyer_pauses": self.nemesis.pauses,
            "node_pauses": self.nemesis.node_pauses,
            "kills": self.nemesis.kills,
            "sweeps": self.sweeps,
            "holds_cleared": self.holds_cleared,
            "busy": self.shared.total("busy"),
            "slots_lost": self.shared.total("slots_lost"),
            "errors": self.shared.total("errors"),
            "seconds": self.elapsed,
        }


class _Counter:
    """Reads ``clear_expired_holds``' output ("cleared N expired holds") into the phase."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase

    def write(self, text: str) -> int:
        words = text.split()
        if len(words) >= 2 and words[0] == "cleared" and words[1].isdigit():
            self.phase.holds_cleared += int(words[1])
        return len(text)

    def flush(self) -> None:
        pass


class LiveView:
    """The terminal view: redrawn in place on a terminal, a line a second otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.drawn = 0
        self.last_line = 0.0

    def draw(
        self, phase: Phase, nemesis: Nemesis, sold: int, elapsed: float, final: bool = False
    ) -> None:
        shared = phase.shared
        width = 30
        filled = width * sold // max(1, phase.seats)
        bar = "#" * filled + "." * (width - filled)
        buyers = " ".join(
            f"b{i}:{'PAUSED' if i in phase.paused else STATE_NAMES.get(shared.state[i], '?')}"
            for i in range(shared.buyers)
        )
        nodes = " ".join(
            f"n{i}:{'PAUSED' if i in phase.paused_nodes else 'up'}"
            for i in range(len(phase.cluster))
        )
        lines = [
            f"[{bar}] {sold}/{phase.seats} sold  {elapsed:4.1f}s  "
            f"refused by fencing {shared.total('refused')}  lost leases {shared.total('lost')}",
            f"  buyers {buyers}",
            f"  nodes  {nodes}",
            f"  nemesis: {nemesis.log[-1] if nemesis.log else '(waiting)'}",
        ]
        if self.tty:
            if self.drawn:
                self.out.write(f"\x1b[{self.drawn}F\x1b[J")
            self.out.write("\n".join(lines) + "\n")
            self.drawn = len(lines)
            if final:
                self.drawn = 0
        elif final or time.monotonic() - self.last_line >= 1.0:
            self.out.write(lines[0] + "\n")
            self.last_line = time.monotonic()
        self.out.flush()


def summary(reports: Sequence[dict[str, Any]]) -> Iterator[str]:
    """The closing table, one column per run."""
    rows = [
        ("seats sold", "sold"),
        ("sales recorded", "sales"),
        ("seats sold twice", "doubles"),
        ("stale writes refused", "refused"),
        ("sales after a lost lease", "lost_leases"),
        ("buyers paused > ttl", "buyer_pauses"),
        ("nodes paused", "node_pauses"),
        ("buyers killed", "kills"),
        ("sweeper runs", "sweeps"),
        ("payment slots run out", "slots_lost"),
        ("expired holds it cleared", "holds_cleared"),
        ("seconds", "seconds"),
    ]
    yield f"{'':26}" + "".join(f"{report['name']:>24}" for report in reports)
    for label, key in rows:
        cells = []
        for report in reports:
            value = report[key]
            cells.append(f"{value:>24.1f}" if isinstance(value, float) else f"{value:>24}")
        yield f"{label:26}" + "".join(cells)
