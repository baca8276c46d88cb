"""Which server process each node reached, so that two addresses of one server count once.

Two node URLs can reach one server process: three databases of one server, or a host name
and its DNS alias. A quorum made of them is a quorum of one machine (a crash of it loses every
"independent" vote at once), so Redlock's majority would be fake. The hello tells each
connection the server's ``run_id`` (``INFO server``); two labels that reached one run_id are
*twins*: the one listed later is sent nothing (the transports refuse it with
:func:`twin_error`, so a round waits for the other nodes instead of counting one server twice).
On new connections, before the hellos are answered, both twins may be sent their commands and
both say yes: a round whose yes votes reach the quorum is counted again then, one vote per
server (:meth:`~django_redlock.wire.rounds.Round.counted_twice`), and waits for the other
nodes if it was short; the engine counts one vote per server too (:meth:`Servers.distinct`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django_redlock.wire.errors import NotSent

if TYPE_CHECKING:
    from django_redlock.wire.rounds import Round
    from django_redlock.wire.scripts import Commands

__all__ = ["Servers", "Twins", "keep_apart", "twin_error"]

Twins = dict[int, tuple[int, str]]
"""The nodes (by index) whose server an earlier node of the list reached, each with that
earlier node's index and label (``Servers.twins``)."""


class Servers:
    """The server processes each node label's connections reached (run_ids from the hello),
    shared by the engine and both transports of one manager.

    ``same`` maps the label of each node whose server an earlier node of the list reached to
    that earlier label; ``twins`` maps the same nodes by index, to the earlier node's index
    and label. Both are empty while every
    node is its own server (the usual case: the transports test ``twins`` once per round).
    They are changed in place, under a lock, only when a connection reports a run_id not
    seen for its label; readers take no lock (a dict read is atomic).

    A label keeps every run_id it reached (a restart gives the server a new one, a cluster
    node's shards each have their own): two labels are twins while their sets meet, so a
    server that restarted stays one server with its alias, whichever reconnected first. A
    twin is sent nothing, so an alias re-pointed to another server is learnt only when its
    first reconnects (or the process starts again): an availability cost, never a double
    count.
    """

    __slots__ = ("_lock", "index", "labels", "runs", "same", "twins")

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = tuple(labels)
        self.index = {label: position for position, label in enumerate(self.labels)}
        self.runs: dict[str, set[str]] = {}
        self.same: dict[str, str] = {}
        self.twins: Twins = {}
        self._lock = threading.Lock()

    def report(self, node: str, run_id: str) -> None:
        """Node ``node``'s connection reached the server process ``run_id``."""
        runs = self.runs.get(node)
        if runs is not None and run_id in runs:
            return  # the usual report: a reconnection to the same process
        with self._lock:
            self.runs.setdefault(node, set()).add(run_id)
            same: dict[str, str] = {}
            seen: dict[str, str] = {}  # run_id -> the first label (in list order) reaching it
            for label in self.labels:
                reached = self.runs.get(label, ())
                first = next((seen[run] for run in reached if run in seen), None)
                if first is not None:
                    same[label] = first
                for run in reached:
                    seen.setdefault(run, label if first is None else first)
            if same != self.same:
                self.same.clear()
                self.same.update(same)
                self.twins.clear()
                self.twins.update(
                    {self.index[label]: (self.index[first], first) for label, first in same.items()}
                )

    def distinct(self, labels: Sequence[str], granted: Sequence[bool]) -> int:
        """How many different servers are among the nodes that ``granted``."""
        same = self.same
        return len(
            {same.get(label, label) for label, yes in zip(labels, granted, strict=True) if yes}
        )

    def after_fork_in_child(self) -> None:
        """A forked child's lock is made anew (the parent's may have been held by a thread
        that the child does not have)."""
        self._lock = threading.Lock()


def twin_error(first: str) -> NotSent:
    """The result of a node sent nothing because node ``first`` reached its server."""
    return NotSent(
        f"same server as {first} (one run_id): not an independent node, so not asked; list "
        "each Redlock node once, on its own server"
    )


def keep_apart(answer: Round, commands: Commands, twins: Twins) -> Commands:
    """``commands`` without those for a twin (``Servers.twins``): each such node is refused
    in ``answer`` (:func:`twin_error`, a no), so the round waits for the other nodes rather
    than end on a "quorum" that counts one server twice. The transports then send the rest
    as usual, leaving a refused node's result as it is."""
    kept = list(commands)
    for index, (_, first) in list(twins.items()):  # a copy: a hello may change it meanwhile
        if kept[index] is not None:
            kept[index] = None
            answer.refuse(index, twin_error(first))
    return kept
