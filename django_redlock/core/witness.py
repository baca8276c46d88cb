"""Which nodes were ever seen voting, remembered by the *other* nodes: how
``redlock_declare_fresh`` tells a brand-new node from one that restarted empty. Imports no
Django.

A node that crashed and came back empty looks exactly like a new one: its own data says
nothing. So every node keeps a record of the other nodes' server processes seen voting
(``scripts/voters_record.lua``: address -> run_id and when), written by

* the clients, through :class:`VoteRecorder` (once per node process seen voting, then again
  every :data:`REFRESH` seconds while the client process lives, in a background thread: never
  on an acquire's path);
* every ``redlock_status`` run (:func:`record_votes`, for each node that votes now);
* every declaration (:func:`~django_redlock.core.health.declare_fresh` records the process it
  declares, before any client sees it vote).

:func:`assess` then judges a node that does not vote yet:

* **seen**: some node holds a record of it: it may have granted leases that still run. It
  waits out its quarantine; the verdict says how long and why.
* **new**: no node holds a record of it, and enough other nodes are *witnesses*: each has kept
  its record, in its current process, for longer than the quarantine plus :data:`REFRESH`.
  Any lease the node may have granted and that could still run was granted less than a
  quarantine ago, and the client that got it had recorded that process on every node at most
  :data:`REFRESH` before, so a witness would hold that record.
* **unknown**: too few witnesses answered (a new cluster, peers restarted or down): the
  command asks before acting.

What the witness rule cannot see: a record that never reached a witness (the write failed and
the next refresh did not land before the crash either), a witness whose data was flushed or
evicted, or a node whose first grant it is (a client records it right after, a few ms later).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from django_redlock.core.fanout import LockNodes, each_node
from django_redlock.wire.clients import client_for
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.scripts import Script, load_script

__all__ = [
    "REFRESH",
    "VOTERS_KEY",
    "Freshness",
    "VoteRecorder",
    "assess",
    "field_of",
    "record_votes",
]

CLIENTS_RECORD_VOTES = True
"""Whether the managers record the votes they see: every engine hands each node's first grant
in its process to its :class:`VoteRecorder` (``core/engine.py``), so a node that voted has a
record on the other nodes a few milliseconds after its first grant, refreshed every
:data:`REFRESH` seconds while the client lives. Were it false (only ``redlock_status`` runs and
declarations writing records), a missing record would prove nothing, and :func:`judge` would
never answer "new"."""

CLIENT_SEEN = "0"
"""The run_id a client records for a node it saw grant: the client's connections know their
node's process, its lock path does not, and the rule needs only that some process at that
address voted (any record makes the node "seen")."""

logger = logging.getLogger("django_redlock")

VOTERS_KEY = "\x00django_redlock:voters"
"""The hash, on each node, of the other nodes' processes seen voting. The NUL byte keeps it
apart from every lock key (lock names cannot contain control characters)."""

REFRESH = 300.0
"""Seconds between two records of one node process by one client process. A witness must have
kept its record for the quarantine plus this long before its silence counts."""

RECORD = load_script("voters_record")
WITNESS = load_script("voters_witness")


def field_of(address: NodeAddress) -> str:
    """A node's name in the records: its identity (host without case, ``localhost`` as its
    loopback address, port, db), never its password or user."""
    host, port, path, db = address.identity
    return f"unix:{path}?db={db}" if path is not None else f"{host}:{port}/{db}"


def _run(client: redis.Redis, script: Script, keys: Sequence[str], args: Sequence[str]) -> Any:
    """EVALSHA, or EVAL when the node does not have the script yet."""
    try:
        return client.evalsha(script.sha.decode(), len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        return client.eval(script.source.decode(), len(keys), *keys, *args)


def record_votes(
    addresses: Sequence[NodeAddress],
    voted: Mapping[NodeAddress, str],
    *,
    timeout: float,
) -> int:
    """Record on every node of ``addresses`` the processes in ``voted`` (node -> run_id) that
    are not its own, all nodes at once. Best effort: a node that fails is skipped (its record
    is only as good as the writes that reach it). Returns how many nodes took the records."""
    fields = {address: (field_of(address), run_id) for address, run_id in voted.items() if run_id}

    def write(peer: NodeAddress) -> bool:
        pairs = [item for address, pair in fields.items() if address != peer for item in pair]
        if not pairs:
            return False
        try:
            with client_for(peer, timeout) as client:
                _run(client, RECORD, (VOTERS_KEY,), pairs)
        except redis.RedisError:
            return False
        return True

    return sum(each_node(list(addresses), write))


class VoteRecorder:
    """Records, for one client process, the node processes it saw vote (see the module).

    :meth:`saw_vote` costs one dict lookup and never does I/O: a daemon thread writes the
    records to the other nodes, at once for a process not recorded yet, then every
    :data:`REFRESH` seconds for every process it was told of (the latest per node), for as long
    as the client process lives. Fork-safe: a child starts its own thread on its first call.

    Args:
        addresses: the manager's nodes.
        timeout: seconds per node for each write.
        refresh: seconds between two records of one process (tests shorten it).
    """

    def __init__(
        self, addresses: Sequence[NodeAddress], timeout: float = 1.0, refresh: float = REFRESH
    ) -> None:
        self.addresses = tuple(addresses)
        self.timeout = timeout
        self.refresh = refresh
        self._seen: dict[NodeAddress, str] = {}
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._pid = 0
        self.written = 0  # rounds of writes done (for tests and metrics)
        # Set while every record it was told of has been written (or tried): tests that
        # count a node's commands wait for it (wait_idle) so the writes fall outside.
        self._idle = threading.Event()
        self._idle.set()
        self._told = 0  # how many times it was told of a new record
        self.thread: threading.Thread | None = None  # its writer, once told of a record

    def saw_vote(self, address: NodeAddress, run_id: str) -> None:
        """``address`` granted a vote from its process ``run_id`` (:data:`CLIENT_SEEN` when the
        caller does not know it). Called by the engine on each node's first grant in this
        process."""
        if not run_id or (self._seen.get(address) == run_id and self._pid == os.getpid()):
            return
        with self._lock:
            self._seen[address] = run_id
            self._told += 1
            self._idle.clear()
            if self._pid != os.getpid():  # its first record in this process (or a forked one)
                self._pid = os.getpid()
                self._wake = threading.Event()  # this process's own (a fork copies the old)
                # The thread holds the recorder weakly: a manager dropped lets its recorder
                # go, whose finalizer wakes the thread to end.
                self.thread = threading.Thread(
                    target=_record_loop,
                    args=(weakref.ref(self), self._wake, self.refresh),
                    name="django_redlock-voters",
                    daemon=True,
                )
                self.thread.start()
                weakref.finalize(self, self._wake.set)
            # Under the lock: the thread clears the event under it with its snapshot, so a
            # wake-up always brings news (no second write of what it just wrote).
            self._wake.set()

    def after_fork_in_child(self) -> None:
        """Start afresh in a forked child: the parent's thread does not exist here, and its
        locks and events may have been copied held (a fork while that thread took its
        snapshot would deadlock the child's first record)."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._seen = {}
        self._pid = 0
        self.thread = None

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every record this recorder was told of has
        been written (or tried); False if it has not by then."""
        return self._idle.wait(timeout)


def _record_loop(ref: weakref.ref[VoteRecorder], wake: threading.Event, refresh: float) -> None:
    """A recorder's thread: writes its records at once when told of a new one, then every
    ``refresh`` seconds, until the recorder is gone or the process forked away from it."""
    pid = os.getpid()
    while True:
        recorder = ref()
        if recorder is None or recorder._pid != pid:
            return
        with recorder._lock:
            wake.clear()
            seen = dict(recorder._seen)
            idle = recorder._idle
            told = recorder._told
        addresses, timeout = recorder.addresses, recorder.timeout
        del recorder  # not held while writing or waiting
        try:
            record_votes(addresses, seen, timeout=timeout)
        except Exception:  # best effort, as each write is: the thread must go on refreshing
            logger.debug("recording votes failed", exc_info=True)
        recorder = ref()
        if recorder is not None:
            recorder.written += 1
            with recorder._lock:
                if recorder._told == told:  # told of nothing new meanwhile
                    idle.set()
        del recorder
        wake.wait(refresh)


@dataclass(frozen=True)
class Freshness:
    """What :func:`assess` found of one node.

    Attributes:
        node: the node's label (no password).
        verdict: "votes" (nothing to do), "new" (no node saw it vote, enough witnesses),
            "seen" (some node saw a process of it vote: it may have forgotten locks),
            "unknown" (too few witnesses to tell), or "down" (not reached).
        detail: the reason, for operators.
        left_s: seconds until it votes by itself (quarantined nodes; None when unknown).
        run_id: its current server process.
        address: the node.
    """

    node: str
    verdict: str
    detail: str
    left_s: float | None = None
    run_id: str | None = None
    address: NodeAddress | None = None


def _ask(peer: NodeAddress, field: str, timeout: float) -> tuple[str, int] | None:
    """A peer's record of ``field`` and how long it has kept records (ms, -1: not trusted),
    or None when it did not answer."""
    try:
        with client_for(peer, timeout) as client:
            record, kept = _run(client, WITNESS, (VOTERS_KEY,), (field,))
    except (redis.RedisError, ValueError, TypeError):
        return None
    return (record.decode() if isinstance(record, bytes) else str(record)), int(kept)


def _ago(ms: int) -> str:
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def judge(
    label: str,
    run_id: str,
    left_s: float | None,
    answers: Mapping[str, tuple[str, int] | None],
    *,
    horizon_ms: int,
    needed: int,
    clients_record: bool | None = None,
) -> tuple[str, str]:
    """The verdict ("seen", "new" or "unknown") and its reason for a quarantined node
    (process ``run_id``, ``left_s`` seconds from voting), from the other nodes' ``answers``
    (peer label -> :func:`_ask`'s answer). Pure: the rule the module docstring states.
    ``clients_record`` (default :data:`CLIENTS_RECORD_VOTES`): whether a missing record can
    show a node never voted."""
    if clients_record is None:
        clients_record = CLIENTS_RECORD_VOTES
    wait = f"it votes by itself in {left_s:.0f} s" if left_s is not None else "wait"
    for peer, answer in answers.items():
        if answer is not None and answer[0]:
            seen_run, _, ago = answer[0].partition(" ")
            was = (
                "this process"
                if seen_run == run_id
                else "a process"
                if seen_run == CLIENT_SEEN
                else f"process {seen_run[:8]}"
            )
            return (
                "seen",
                f"{peer} saw {was} of it vote {_ago(int(ago or 0))} ago: it may have forgotten "
                f"locks whose leases still run; {wait}",
            )
    witnesses = [
        peer for peer, answer in answers.items() if answer is not None and answer[1] >= horizon_ms
    ]
    if len(witnesses) >= needed and not clients_record:
        return (
            "unknown",
            "no node recorded it voting, but clients do not record their votes yet (only "
            "redlock_status runs and declarations do), so that does not show it never voted; "
            f"{wait}",
        )
    if len(witnesses) >= needed:
        return (
            "new",
            f"no node saw it vote ({', '.join(witnesses)} kept records for more than "
            f"{horizon_ms / 1000:.0f} s)",
        )
    answered = sum(1 for answer in answers.values() if answer is not None)
    return (
        "unknown",
        f"cannot tell whether it ever voted: {len(witnesses)} of the {len(answers)} other "
        f"nodes ({answered} answered) have kept records of votes for {horizon_ms / 1000:.0f} s "
        f"(needs {needed}); {wait}",
    )


def assess(
    manager: LockNodes,
    targets: Sequence[NodeAddress],
    report: Any,
    *,
    timeout: float = 1.0,
) -> list[Freshness]:
    """Judge each node of ``targets``: does it vote, is it brand-new, was it seen voting, or
    can nobody tell (the module docstring states the rule)? ``report`` is a
    :class:`~django_redlock.core.health.Report` of every node taken just before (health
    imports this module, so it is not named here; its status also records the voting
    nodes). Never raises for node failures."""
    by_label = {node.node: node for node in report.nodes}
    addresses = manager.addresses
    horizon = report.quarantine_ms + round(REFRESH * 1000)
    needed = max(1, manager.quorum - 1)

    def one(target: NodeAddress) -> Freshness:
        node = by_label[target.label]
        if not node.reachable:
            return Freshness(target.label, "down", "; ".join(node.problems) or "no answer")
        if node.vote == "votes":
            return Freshness(target.label, "votes", node.vote_detail, 0.0, node.run_id, target)
        left = node.quarantine_left_s if (node.quarantine_left_s or 0) >= 0 else None
        peers = [peer for peer in addresses if peer != target]
        answers = dict(
            zip(
                [peer.label for peer in peers],
                each_node(peers, lambda peer: _ask(peer, field_of(target), timeout)),
                strict=True,
            )
        )
        verdict, detail = judge(
            target.label, node.run_id or "", left, answers, horizon_ms=horizon, needed=needed
        )
        return Freshness(target.label, verdict, detail, left, node.run_id, target)

    return [one(target) for target in targets]
