"""W1's pair split by step, in client instructions, ours beside the same-commands floor.

``./run bench --only profile --nodes 1,5`` (or ``python -m benchmarks.steps 1 5``) prints,
for N=1 and N=5, the client instructions of one acquire + release pair (``benchmarks/pairs.py``:
the pair W1 times and every W2 worker repeats), split into the steps below, for ours and for
the same-commands floor (``benchmarks/floor.py``), and their difference.

How: valgrind's callgrind counts the client process's instructions (user space only, the same
whatever else the machine does), with collection off at the start. Each function listed in
:data:`OURS` and :data:`FLOOR` (and the socket, ``poll`` and ``hiredis`` calls both make) is
wrapped so that, in a run measuring step S, collection is on exactly while a function of S is
the innermost listed function on the stack: a step's count is its own code and whatever
unlisted code it calls (builtins, C), not the listed functions it calls. Code outside every
listed function (the managers' and the procedure's bodies, the driver, the floor's
``acquire``/``release`` bodies, the pair loop) is the step ``rest``. One callgrind run per
step and contender (a step's count does not depend on which step is collected: the same
wrappers run in every run), plus one run without wrappers: the plain total.

The wrappers cost instructions of their own, on both sides of each listed call. They are
measured on a listed no-op (:func:`_calibrate`) and taken off each step by its calls per pair
(counted in a run without valgrind); what remains between the sum of the steps and the plain
total is printed as ``unattributed``. The toggle is a two-line C extension built with the
system's ``gcc`` and ``valgrind/callgrind.h`` (skipped with a note when either is missing).

Under valgrind the client runs about 50 times slower than the servers, so a round's replies
have nearly always arrived when it first polls: ``poll`` loops run about once per round here,
against 1.1 to 1.3 times natively. Both contenders see the same.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WARM_UP = 200
PAIRS = 100  # per callgrind run (STEPS_PAIRS=...): the counts repeat, the run takes long
TIMEOUT = 2.0  # seconds: the client is slow under valgrind, the servers are not
TTL_MS = 10_000

# Steps, in the order printed; each maps to the functions that make it, "module:qualname".
# A function missing here is counted in "rest"; :func:`check` lists what is called per pair.
STEPS = (
    ("checks", "argument checks"),
    ("shape", "shape and options"),
    ("build", "building the requests (token, owner record, commands)"),
    ("round", "the rounds' Python: send and wait loops, the round object"),
    ("socket", "socket calls: send, poll, recv (their user-space side)"),
    ("parse", "reply parsing (hiredis feed, gets)"),
    ("judge", "judging the round (votes, validity, held-on)"),
    ("lease", "lease bookkeeping (lease object, re-entry registry, owner scope)"),
    ("report", "reporting and observers"),
    ("release", "the release's own logic (settle, judge)"),
    ("rest", "the rest: managers, procedure, driver, operation bodies, pair loop"),
)

OURS: dict[str, tuple[str, ...]] = {
    "checks": (
        "django_redlock.procedures.arguments:validate_name",
        "django_redlock.core.engine:Engine.check_arguments",
        "django_redlock.core.engine:Engine.contact",
    ),
    "shape": (
        "django_redlock.procedures.shapes:Shape.__init__",
        "django_redlock.procedures.shapes:Shape.decider",
        "django_redlock.procedures.shapes:Shape.need",
        "django_redlock.procedures.shapes:Shape.votes",
        "django_redlock.procedures.shapes:Shape.won",
    ),
    "build": (
        "django_redlock.procedures.shapes:Shape.acquire",
        "django_redlock.wire.scripts:acquire_command",
        "django_redlock.wire.scripts:release_command",
        "django_redlock.core.owner:OwnerRecords.record",
        "django_redlock.core.engine:Engine.first_try",
        "django_redlock.procedures.flow:FirstTry.__init__",
        "secrets:token_hex",
    ),
    "round": (
        "django_redlock.wire.sync.connections:ConnectionSet.run",
        "django_redlock.wire.sync.connections:ConnectionSet.send_round",
        "django_redlock.wire.sync.connections:ConnectionSet.wait_round",
        "django_redlock.wire.sync.connections:ConnectionSet._poll_once",
        "django_redlock.wire.sync.connections:ThreadConnections.get",
        "django_redlock.wire.rounds:Round.__init__",
    ),
    "judge": (
        "django_redlock.procedures.flow:FirstTry.judge",
        "django_redlock.procedures.flow:validity",
        "django_redlock.procedures.flow:won",
        "django_redlock.procedures.shapes:Shape.granted_on",
        "django_redlock.core.lease:held_on",
    ),
    "lease": (
        "django_redlock.core.engine:Engine.grant",
        "django_redlock.core.engine:Engine.own",
        "django_redlock.core.engine:Engine.forget",
        "django_redlock.core.lease:BaseLease.__init__",
        "django_redlock.core.lease:take_over",
        "django_redlock.core.lease:let_go",
        "django_redlock.core.untracking:track_again",
        "django_redlock.core.reentry:Reentry.put",
        "django_redlock.core.reentry:Reentry.remove",
        "django_redlock.core.lease:forget_in",
        "django_redlock.core.reentry:Reentry.__bool__",
        "django_redlock.core.lease:BaseLease._end_hold",
        "django_redlock.core.owner:owner_scope",
    ),
    "report": (
        "django_redlock.core.reporting:Reporter.granted",
        "django_redlock.core.reporting:Reporter.released",
        "django_redlock.core.reporting:Reporter.released_cleanly",
        "logging:Logger.isEnabledFor",
    ),
    "release": (
        "django_redlock.core.engine:Engine.release",
        "django_redlock.core.lease:release_round",
        "django_redlock.core.lease:BaseLease._settle_release",
        "django_redlock.procedures.flow:judge_release",
    ),
}

FLOOR: dict[str, tuple[str, ...]] = {
    "build": (
        "django_redlock.wire.scripts:acquire_command",
        "django_redlock.wire.scripts:release_command",
        "django_redlock.core.owner:base36",
        "secrets:token_hex",
    ),
    "round": ("benchmarks.minimal_redlock:Rounds._round",),
    "lease": ("benchmarks.floor:Held.__init__",),
}

# Steps both contenders reach through C calls: the methods are wrapped on subclasses and
# proxies installed before any connection is made (see _install_c_hooks).
C_STEPS = {"socket": ("send", "sendall", "recv", "poll"), "parse": ("feed", "gets")}


# Step numbers in the C wrapper: "rest" (nothing listed on the stack) is 0.
_NUMBER = {step: index for index, (step, _) in enumerate(STEPS, start=1)} | {"rest": 0}
_NOOP = 31


def _wrap(step: str, fn: Callable[..., Any]) -> Any:
    import _cgtoggle  # type: ignore[import-not-found]  # built by _build_toggle

    return _cgtoggle.wrap(fn, _NOOP if step == "noop" else _NUMBER[step])


def _resolve(spec: str) -> tuple[Any, str, Any]:
    """(owner object, attribute, function) of ``module:qualname``."""
    module_name, qualname = spec.split(":")
    owner: Any = importlib.import_module(module_name)
    *path, attribute = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attribute, owner.__dict__[attribute]


def _install(table: dict[str, tuple[str, ...]]) -> list[str]:
    """Wrap every function of ``table`` where it is defined and wherever a module imported it
    by name; returns the specs that were not found (a renamed function)."""
    missing = []
    for step, specs in table.items():
        for spec in specs:
            try:
                owner, attribute, fn = _resolve(spec)
            except (ImportError, AttributeError, KeyError):
                missing.append(spec)
                continue
            wrapped = _wrap(step, fn)
            setattr(owner, attribute, wrapped)
            if not isinstance(owner, type):
                for module in list(sys.modules.values()):
                    name = getattr(module, "__name__", "") or ""
                    if name.startswith(("django_redlock", "benchmarks")):
                        for key, value in list(vars(module).items()):
                            if value is fn:
                                setattr(module, key, wrapped)
    return missing


def _install_c_hooks() -> None:
    """Socket, poll and hiredis calls of both contenders, as steps ``socket`` and ``parse``."""
    import select
    import socket

    import hiredis

    base = socket.socket
    for method in ("send", "sendall", "recv"):
        setattr(base, method, _wrap("socket", getattr(base, method)))

    real_poll = select.poll
    poll_step = "socket"

    class PollProxy:
        def __init__(self) -> None:
            self._poller = real_poll()
            self.register = self._poller.register
            self.unregister = self._poller.unregister
            self.modify = self._poller.modify
            self.poll = _wrap(poll_step, self._poller.poll)

    select.poll = PollProxy  # type: ignore[assignment,misc]

    class Reader(hiredis.Reader):
        pass

    for method in ("feed", "gets"):
        setattr(Reader, method, _wrap("parse", getattr(hiredis.Reader, method)))
    hiredis.Reader = Reader  # type: ignore[misc]


def _runner(contender: str, urls: list[str]) -> Callable[[str], bool]:
    if contender == "ours":
        from benchmarks.instructions import natively_paced
        from django_redlock import LockManager

        natively_paced()
        manager = LockManager(urls, ttl=TTL_MS / 1000, node_timeout=TIMEOUT)

        def ours(name: str) -> bool:
            manager.acquire(name, blocking=False).release()
            return True

        return ours
    if contender == "floor":
        from benchmarks.floor import SameCommandsRedlock

        floor = SameCommandsRedlock(urls, TIMEOUT)

        def same_commands(name: str) -> bool:
            held = floor.acquire(f"redlock:{name}", TTL_MS)
            return held is not None and floor.release(held)

        return same_commands
    raise ValueError(contender)


def _noop() -> None:
    pass


def child(mode: str, contender: str, target: str, pairs: int, urls: list[str]) -> None:
    """The measured process. ``mode``: ``plain`` (no wrappers, collect the pairs), ``step``
    (collect ``target`` only), ``count`` (no valgrind: print the calls per step as JSON), or
    ``calibrate`` (collect ``target`` around listed no-ops; ``contender`` unused)."""
    import _cgtoggle

    number = _NOOP if target == "noop" else _NUMBER.get(target, -1)
    counting = mode == "count"
    if mode == "calibrate":
        # A listed no-op called from "rest": its "rest" run counts the caller's side of
        # each wrapper, its "noop" run the callee's side. Unwrapped ("plain") it counts
        # the loop and the call alone.
        noop = _noop if target == "plain" else _wrap("noop", _noop)
        _cgtoggle.configure(number, 1, 0)
        if target in ("rest", "plain"):
            _cgtoggle.toggle()
        for _ in range(pairs):
            noop()
        if target in ("rest", "plain"):
            _cgtoggle.toggle()
        return
    if mode in ("step", "count"):
        table = OURS if contender == "ours" else FLOOR
        _install_c_hooks()
        # Import what the table names before wrapping, so every import site exists.
        importlib.import_module("django_redlock" if contender == "ours" else "benchmarks.floor")
        missing = _install(table)
        if missing:
            raise SystemExit(f"functions not found (renamed?): {', '.join(missing)}")
    run = _runner(contender, urls)
    for index in range(WARM_UP):
        if not run(f"steps:warm:{contender}:{index}"):
            raise SystemExit(f"{contender}: a warm-up pair failed")
    _cgtoggle.configure(number, 1, int(counting))
    collect_rest = mode == "plain" or target == "rest"
    if collect_rest:
        _cgtoggle.toggle()
    for index in range(pairs):
        if not run(f"steps:{contender}:{index}"):
            raise SystemExit(f"{contender}: a pair failed")
    if collect_rest:
        _cgtoggle.toggle()
    _cgtoggle.configure(-1, 0, 0)
    if counting:
        into, out = _cgtoggle.counts()
        names = {number: step for step, number in _NUMBER.items()}
        print(json.dumps({
            "calls": {names[i]: n for i, n in enumerate(into) if n and i in names},
            "out": {names[i]: n for i, n in enumerate(out) if n and i in names},
        }))  # fmt: skip


_TOGGLE_C = r"""
/* A step wrapper in C, so that the wrapping costs few instructions: the innermost listed
   function on the stack decides whether callgrind collects (see the module docstring). */
#include <Python.h>
#include <stddef.h>
#include <valgrind/callgrind.h>
#define STEPS 32
static int current = 0, target = -1, on = 0, counting = 0;
static long calls[STEPS], outs[STEPS];
typedef struct { PyObject_HEAD PyObject *fn; int step; vectorcallfunc vectorcall; } Wrap;
static PyObject *wrap_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw) {
    Wrap *w = (Wrap *)self;
    int prev = current;
    if (!on || prev == w->step) return PyObject_Vectorcall(w->fn, args, nargsf, kw);
    if (prev == target) CALLGRIND_TOGGLE_COLLECT;
    current = w->step;
    if (w->step == target) CALLGRIND_TOGGLE_COLLECT;
    if (counting) { calls[w->step]++; outs[prev]++; }
    PyObject *result = PyObject_Vectorcall(w->fn, args, nargsf, kw);
    if (w->step == target) CALLGRIND_TOGGLE_COLLECT;
    current = prev;
    if (prev == target) CALLGRIND_TOGGLE_COLLECT;
    return result;
}
static PyObject *wrap_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}
static void wrap_dealloc(PyObject *self) { Py_XDECREF(((Wrap *)self)->fn); PyObject_Free(self); }
static PyTypeObject WrapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_cgtoggle.Wrap", .tp_basicsize = sizeof(Wrap),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Wrap, vectorcall), .tp_call = PyVectorcall_Call,
    .tp_descr_get = wrap_get, .tp_dealloc = wrap_dealloc,
};
static PyObject *wrap(PyObject *self, PyObject *args) {
    PyObject *fn; int step;
    if (!PyArg_ParseTuple(args, "Oi", &fn, &step)) return NULL;
    if (step < 0 || step >= STEPS) { PyErr_SetString(PyExc_ValueError, "step"); return NULL; }
    Wrap *w = PyObject_New(Wrap, &WrapType);
    if (w == NULL) return NULL;
    Py_INCREF(fn); w->fn = fn; w->step = step; w->vectorcall = wrap_call;
    return (PyObject *)w;
}
static PyObject *configure(PyObject *self, PyObject *args) {
    if (!PyArg_ParseTuple(args, "iii", &target, &on, &counting)) return NULL;
    Py_RETURN_NONE;
}
static PyObject *toggle(PyObject *self, PyObject *unused) {
    CALLGRIND_TOGGLE_COLLECT;
    Py_RETURN_NONE;
}
static PyObject *counts(PyObject *self, PyObject *unused) {
    PyObject *into = PyList_New(STEPS), *out = PyList_New(STEPS);
    for (int i = 0; i < STEPS; i++) {
        PyList_SET_ITEM(into, i, PyLong_FromLong(calls[i]));
        PyList_SET_ITEM(out, i, PyLong_FromLong(outs[i]));
    }
    return Py_BuildValue("(NN)", into, out);
}
static PyMethodDef methods[] = {
    {"wrap", wrap, METH_VARARGS, NULL}, {"configure", configure, METH_VARARGS, NULL},
    {"toggle", toggle, METH_NOARGS, NULL}, {"counts", counts, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cgtoggle", NULL, -1, methods};
PyMODINIT_FUNC PyInit__cgtoggle(void) {
    if (PyType_Ready(&WrapType) < 0) return NULL;
    return PyModule_Create(&module);
}
"""


def _build_toggle(directory: Path) -> str | None:
    """Build ``_cgtoggle`` into ``directory``; None, or why it could not be."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt install valgrind)"
    if shutil.which("gcc") is None or not Path("/usr/include/valgrind/callgrind.h").exists():
        return "gcc or valgrind's headers are missing (apt install gcc valgrind)"
    source = directory / "_cgtoggle.c"
    source.write_text(_TOGGLE_C)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    command = [
        "gcc", "-O1", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
        str(source), "-o", str(directory / f"_cgtoggle{suffix}"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"building the toggle failed: {done.stderr[-500:]}"


_COLLECTED = re.compile(rb"Collected : (\d+)")


def _spawn(directory: Path, args: Iterable[str], valgrind: bool) -> bytes:
    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join([str(directory), os.getcwd(), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "benchmarks.steps", "--child", *args]
    if valgrind:
        command = [
            "valgrind", "--tool=callgrind", "--collect-atstart=no",
            "--callgrind-out-file=/dev/null", *command,
        ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: failed:\n{done.stderr.decode()[-2000:]}")
    if not valgrind:
        return done.stdout
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"{' '.join(args)}: no count:\n{done.stderr.decode()[-2000:]}")
    return found[1]


def profile(
    cluster_urls: dict[int, list[str]], pairs: int = PAIRS, jobs: int = 2
) -> dict[str, Any]:
    """Measure and print the table for each node count of ``cluster_urls`` ({N: urls});
    returns the figures (per pair) by N, contender and step."""
    print(f"\nW1 pair by step: client instructions per pair (callgrind, {pairs} pairs a run)")
    with tempfile.TemporaryDirectory(prefix="rl-steps-") as name:
        directory = Path(name)
        why = _build_toggle(directory)
        if why is not None:
            print(f"  skipped: {why}")
            return {}

        def count(args: list[str]) -> float:
            return int(_spawn(directory, args, valgrind=True)) / pairs

        with ThreadPoolExecutor(jobs) as pool:
            calib = {
                side: pool.submit(count, ["calibrate", "-", side, str(pairs * 10)])
                for side in ("plain", "rest", "noop")
            }
            jobs_by: dict[tuple[int, str, str], Any] = {}
            calls: dict[tuple[int, str], Any] = {}
            for nodes, urls in cluster_urls.items():
                for contender in ("ours", "floor"):
                    args = [contender, "-", str(pairs), *urls]
                    jobs_by[nodes, contender, "total"] = pool.submit(count, ["plain", *args])
                    calls[nodes, contender] = pool.submit(
                        _spawn, directory, ["count", *args], False
                    )
                    table = OURS if contender == "ours" else FLOOR
                    for step, _ in STEPS:
                        if step in table or step in C_STEPS or step == "rest":
                            step_args = [contender, step, str(pairs), *urls]
                            jobs_by[nodes, contender, step] = pool.submit(
                                count, ["step", *step_args]
                            )
            # Calibration ran 10x the calls: per call, in instructions.
            plain, rest, noop = (calib[side].result() / 10 for side in ("plain", "rest", "noop"))
            caller_side, callee_side = rest - plain, noop
            print(f"  wrapper cost per listed call: {caller_side:.0f} (caller) + "
                  f"{callee_side:.0f} (callee) instructions, taken off below")  # fmt: skip
            figures: dict[str, Any] = {}
            for nodes in cluster_urls:
                result: dict[str, dict[str, float]] = {}
                for contender in ("ours", "floor"):
                    counted = json.loads(calls[nodes, contender].result())
                    into, out = counted["calls"], counted["out"]
                    row: dict[str, float] = {"total": jobs_by[nodes, contender, "total"].result()}
                    for step, _ in STEPS:
                        job = jobs_by.get((nodes, contender, step))
                        if job is None:
                            row[step] = 0.0
                            continue
                        row[step] = (
                            job.result()
                            - into.get(step, 0) / pairs * callee_side
                            - out.get(step, 0) / pairs * caller_side
                        )
                    result[contender] = row
                figures[str(nodes)] = result
                _print_table(nodes, result)
    return figures


def plain_totals(urls: list[str], pairs: int = PAIRS) -> dict[str, float]:
    """Client instructions per pair of ours and of the floor on ``urls``, no wrappers."""
    with tempfile.TemporaryDirectory(prefix="rl-steps-") as name:
        directory = Path(name)
        why = _build_toggle(directory)
        if why is not None:
            raise RuntimeError(why)
        return {
            contender: int(_spawn(directory, ["plain", contender, "-", str(pairs), *urls], True))
            / pairs
            for contender in ("ours", "floor")
        }


def _print_table(nodes: int, result: dict[str, dict[str, float]]) -> None:
    ours, floor = result["ours"], result["floor"]
    print(f"\n  N={nodes}{'':52} {'ours':>9} {'floor':>9} {'ours-floor':>11}")
    for step, label in STEPS:
        print(f"  {label[:56]:56} {ours[step]:9,.0f} {floor[step]:9,.0f} "
              f"{ours[step] - floor[step]:+11,.0f}")  # fmt: skip
    for row in (ours, floor):
        attributed = sum(row[step] for step, _ in STEPS)
        row["unattributed"] = row["total"] - attributed
    print(f"  {'unattributed (plain total - sum of steps)':56} {ours['unattributed']:9,.0f} "
          f"{floor['unattributed']:9,.0f}")  # fmt: skip
    print(
        f"  {'plain total (no wrappers)':56} {ours['total']:9,.0f} {floor['total']:9,.0f} "
        f"{ours['total'] - floor['total']:+11,.0f}  ({ours['total'] / floor['total']:.2f}x)"
    )


def check(urls: list[str], contender: str = "ours", pairs: int = 100) -> None:
    """List the functions one pair calls (cProfile) that no step names: they count in rest."""
    import cProfile
    import pstats

    table = OURS if contender == "ours" else FLOOR
    listed = {spec.split(":")[1].split(".")[-1] for specs in table.values() for spec in specs}
    run = _runner(contender, urls)
    for index in range(WARM_UP):
        run(f"check:warm:{index}")
    profiler = cProfile.Profile()
    profiler.enable()
    for index in range(pairs):
        run(f"check:{index}")
    profiler.disable()
    stats: Any = pstats.Stats(profiler)
    for (filename, line, function), (_, calls, *_rest) in sorted(stats.stats.items()):
        if filename != "~" and function not in listed:
            print(f"  rest: {calls / pairs:5.2f} per pair  {function}  {filename}:{line}")


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--child":
        mode, contender, target, pairs, *urls = argv[1:]
        child(mode, contender, target, int(pairs), urls)
        return
    from django_redlock.localnodes import LocalCluster

    totals = "--totals" in argv  # the plain totals only: a quick before/after of a change
    argv = [part for part in argv if part != "--totals"]
    counts = [int(part) for part in argv] or [1, 5]
    clusters = []
    try:
        for n in counts:
            clusters.append(LocalCluster(n).start())
        if os.environ.get("STEPS_CHECK"):
            check(clusters[-1].urls)
        per_run = int(os.environ.get("STEPS_PAIRS", PAIRS))
        if totals:
            for cluster in clusters:
                print(json.dumps({len(cluster): plain_totals(cluster.urls, per_run)}))
            return
        print(json.dumps(profile({len(c): c.urls for c in clusters}, per_run)))
    finally:
        for cluster in clusters:
            cluster.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
