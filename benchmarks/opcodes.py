"""W1o: Python bytecodes and calls per acquire + release pair, by function (a tracer).

W1i (``benchmarks/instructions.py``) says how many machine instructions a pair costs, not
where: this counts, with ``sys.settrace`` and per-opcode events, the bytecodes each Python
function executes and how many Python calls a pair makes, for ours and the minimal Redlock
on the same nodes. C functions (socket calls, ``poll``, ``secrets.token_hex``'s C part) are
not seen; their Python callers are. The figures are exact and repeatable (no timing), so a
change to the hot path is seen here bytecode by bytecode.

Run: ``python -m benchmarks.opcodes [N] [pairs]`` (default 5 nodes, 20 pairs; it starts
its own local nodes).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

from django_redlock.localnodes import LocalCluster

WARM_UP = 50

PairRunner = Callable[[str], bool]


class Tracer:
    """Counts bytecodes and calls per code object while installed (``with``)."""

    def __init__(self) -> None:
        self.opcodes: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def _where(self, frame: FrameType) -> str:
        code = frame.f_code
        module = frame.f_globals.get("__name__", "?")
        return f"{module}.{code.co_qualname}"

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            self.calls[self._where(frame)] += 1
            return self._trace
        if event == "opcode":
            self.opcodes[self._where(frame)] += 1
        return self._trace

    def __enter__(self) -> Tracer:
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.settrace(None)


def _ours(urls: list[str]) -> PairRunner:
    from django_redlock import LockManager

    manager = LockManager(urls, ttl=10.0, node_timeout=2.0)

    def run(name: str) -> bool:
        manager.acquire(name, blocking=False).release()
        return True

    return run


def _minimal(urls: list[str]) -> PairRunner:
    from benchmarks.minimal_redlock import MinimalRedlock

    floor = MinimalRedlock(urls, 2.0)

    def run(name: str) -> bool:
        held = floor.acquire(f"redlock:{name}", 10_000)
        return held is not None and floor.release(held)

    return run


def measure(run: PairRunner, label: str, pairs: int) -> Tracer:
    """Trace ``pairs`` pairs of ``run`` after a warm-up."""
    for index in range(WARM_UP):
        run(f"w1o:warm:{label}:{index}")
    tracer = Tracer()
    with tracer:
        for index in range(pairs):
            run(f"w1o:{label}:{index}")
    return tracer


def report(label: str, tracer: Tracer, pairs: int, top: int = 25) -> None:
    total = sum(tracer.opcodes.values()) / pairs
    calls = sum(tracer.calls.values()) / pairs
    print(f"\n{label}: {total:,.0f} bytecodes, {calls:,.1f} Python calls per pair")
    for where, count in tracer.opcodes.most_common(top):
        print(f"  {count / pairs:8,.1f}  {tracer.calls[where] / pairs:5.1f} calls  {where}")


def main(argv: list[str]) -> None:
    size = int(argv[0]) if argv else 5
    pairs = int(argv[1]) if len(argv) > 1 else 20
    top = int(argv[2]) if len(argv) > 2 else 25
    with LocalCluster(size) as cluster:
        for label, make in (("ours", _ours), ("minimal", _minimal)):
            report(f"{label}, N={size}", measure(make(cluster.urls), label, pairs), pairs, top)


if __name__ == "__main__":
    main(sys.argv[1:])
