"""``manage.py redlock_declare_fresh [URL ...] [--yes]``: let brand-new nodes vote at once.

A node that restarted without its data must not vote until every lease it may have granted
has run out (the restart quarantine, see docs/explanation/guarantees.md). A brand-new node
lost nothing: declaring it fresh lets its current server process vote at once. The
declaration names that process (its run_id), so any later restart is judged again.

A crashed node that came back empty looks exactly like a new one, so the command first asks
the *other* nodes what they saw (``core/witness.py``), and the rule is (docs/howto/operating.md,
"Restarts"):

* a node that already votes is left alone;
* a node no other node ever saw vote, with enough witnesses, is declared;
* a node some other node saw vote may have forgotten locks: with no node named it is
  refused, with the reason and the seconds it still waits; named on the command line, it is
  declared only after confirmation (for an operator who knows it shut down cleanly);
* where too few other nodes can tell, it asks before declaring.

Confirmation is a "yes" typed at the prompt, or ``--yes``; without a terminal and without
``--yes`` it refuses. So the command as the quarantine messages print it (no node named, no
``--yes``) never lets a node that may have forgotten locks vote without a person saying so.
Exits non-zero when a node it was asked about does not vote afterwards.
"""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_redlock.core.health import declare_fresh, status
from django_redlock.core.witness import Freshness, assess
from django_redlock.default_manager import get_manager


class Command(BaseCommand):
    help = (
        "Let brand-new lock nodes vote at once (no restart quarantine). Declares only nodes "
        "no other node ever saw vote; asks before declaring a node it cannot tell about or "
        "one named here that other nodes saw vote."
    )
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django reads a plain list

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "named",
            nargs="*",
            metavar="URL",
            help="only these nodes (URLs as in REDLOCK['NODES'], password optional, or the "
            "labels the messages print); default: every node",
        )
        parser.add_argument(
            "--node",
            action="append",
            dest="nodes",
            metavar="URL",
            help="the same as a URL argument (kept for scripts); repeat for several",
        )
        parser.add_argument(
            "--yes",
            action="store_true",
            help="confirm without a prompt where the command would ask (see the help above)",
        )
        parser.add_argument(
            "--timeout", type=float, default=1.0, help="seconds per command on each node"
        )

    def handle(
        self,
        *args: Any,
        named: list[str],
        nodes: list[str] | None,
        yes: bool,
        timeout: float,
        **options: Any,
    ) -> None:
        wanted = [*named, *(nodes or [])] or None
        try:
            manager = get_manager()
            targets = manager.addresses_of(wanted)
        except ImproperlyConfigured as exc:
            raise CommandError(f"REDLOCK is not usable: {exc}") from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        found = assess(manager, targets, status(manager, timeout=timeout), timeout=timeout)
        declare: list[Freshness] = []
        ask: list[Freshness] = []
        failed: list[str] = []
        for item in found:
            if item.verdict == "votes":
                self.stdout.write(f"{item.node}: {item.detail}; nothing to do")
            elif item.verdict == "new":
                self.stdout.write(f"{item.node}: brand-new: {item.detail}")
                declare.append(item)
            elif item.verdict == "seen" and wanted is None:
                self.stdout.write(self.style.ERROR(f"{item.node}: not declared: {item.detail}"))
                failed.append(item.node)
            elif item.verdict in ("seen", "unknown"):
                ask.append(item)
            else:
                self.stdout.write(self.style.ERROR(f"{item.node}: not declared: {item.detail}"))
                failed.append(item.node)
        if ask:
            if self._confirmed(ask, yes):
                declare.extend(ask)
            else:
                failed.extend(item.node for item in ask)
        if declare:
            done = declare_fresh(
                [item.address for item in declare if item.address is not None],
                timeout=timeout,
                peers=manager.addresses,
            )
            for result in done:
                style = self.style.SUCCESS if result.declared else self.style.ERROR
                self.stdout.write(style(f"{result.node}: {result.detail}"))
                if not result.declared:
                    failed.append(result.node)
        if failed:
            raise CommandError(f"not declared: {', '.join(failed)}")

    def _confirmed(self, ask: list[Freshness], yes: bool) -> bool:
        """Whether the operator confirms declaring ``ask``: ``--yes``, or "yes" typed at a
        terminal. Says for each node why it asks and how long it would wait instead."""
        for item in ask:
            self.stdout.write(self.style.WARNING(f"{item.node}: {item.detail}"))
        if yes:
            self.stdout.write("--yes given: declaring them fresh")
            return True
        if not sys.stdin.isatty():
            for item in ask:
                self.stdout.write(
                    self.style.ERROR(
                        f"{item.node}: not declared: no terminal to confirm on; run again with "
                        "--yes only if you know it never granted a lock still running"
                    )
                )
            return False
        self.stdout.write(
            "Declaring a node that lost locks whose leases still run lets a second holder "
            "take them (a double grant)."
        )
        answer = input(f"Declare {len(ask)} node(s) fresh anyway? Type yes to confirm: ")
        if answer.strip().lower() == "yes":
            return True
        for item in ask:
            self.stdout.write(self.style.ERROR(f"{item.node}: not declared (not confirmed)"))
        return False
