"""A worker process for the fencing tests: ``python -m tests.fence_worker MODE LEDGER_PK ...``.

Runs with ``DJANGO_SETTINGS_MODULE=tests.settings``, ``REDLOCK_TEST_NODES`` and
``REDLOCK_TEST_DB_NAME`` set by the test, so it locks on the test's nodes and writes to the
test's database.

Modes:
- ``pause PK TTL``: take ``lock_for(ledger)`` without auto-extension, read, print
  ``read <token>``, stop itself with SIGSTOP (a GC pause), and once resumed try the write;
  print ``stale`` (refused) or ``wrote``.
- ``soak PK TTL SECONDS NAME [TIMINGS]``: increment the ledger under ``lock_for`` until
  SECONDS pass; every accepted write also logs (token, value) in the same transaction. Prints
  a JSON summary: accepted and refused counts. With TIMINGS, appends one JSON line per
  acquire to that file: its start and end on the system-wide monotonic clock (from the
  ``lock_acquired``/``lock_busy`` signals, so the database mint is not counted) and outcome.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import django


def main() -> int:
    django.setup()
    from django.db import transaction

    from django_redlock import LockLost, LockNotAcquired, StaleFencingToken, lock_for
    from tests.testapp.models import Ledger, WriteLog

    mode, pk, ttl = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ledger = Ledger.objects.get(pk=pk)

    if mode == "pause":
        try:
            with lock_for(ledger, ttl=ttl, auto_extend=False) as lease:
                ledger.refresh_from_db()
                print(f"read {lease.fencing_token}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)  # the "GC pause", between read and write
                ledger.value += 1
                ledger.writer = "A"
                try:
                    ledger.save()
                except StaleFencingToken:
                    print("stale", flush=True)
                else:
                    print("wrote", flush=True)
        except LockLost:
            pass  # expected: the lease ran out during the pause
        return 0

    if mode == "soak":
        seconds, name = float(sys.argv[4]), sys.argv[5]
        if len(sys.argv) > 6:
            record_timings(sys.argv[6])
        accepted = refused = busy = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                with lock_for(ledger, ttl=ttl, auto_extend=False, timeout=2.0) as lease:
                    ledger.refresh_from_db()
                    time.sleep(0.02)  # the work between read and write
                    ledger.value += 1
                    ledger.writer = name
                    assert lease.fencing_token is not None
                    try:
                        with transaction.atomic():
                            ledger.save()
                            WriteLog.objects.create(
                                ledger=ledger,
                                token=lease.fencing_token,
                                value=ledger.value,
                                writer=name,
                            )
                        accepted += 1
                    except StaleFencingToken:
                        refused += 1
            except LockLost:
                pass  # paused past the ttl: counted above as refused (or it did not write)
            except LockNotAcquired:
                busy += 1
        print(json.dumps({"accepted": accepted, "refused": refused, "busy": busy}), flush=True)
        return 0

    raise SystemExit(f"unknown mode {mode!r}")


def record_timings(path: str) -> None:
    from django_redlock.signals import lock_acquired, lock_busy

    timings = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process' life

    def write(outcome: str, waited: float) -> None:
        end = time.monotonic()
        line = {"pid": os.getpid(), "start": end - waited, "end": end, "outcome": outcome}
        timings.write(json.dumps(line) + "\n")

    lock_acquired.connect(lambda **kw: write("acquired", kw["waited"]), weak=False)
    lock_busy.connect(lambda **kw: write(type(kw["error"]).__name__, kw["waited"]), weak=False)


if __name__ == "__main__":
    sys.exit(main())
