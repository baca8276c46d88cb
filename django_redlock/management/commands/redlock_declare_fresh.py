"""``manage.py redlock_declare_fresh [--node URL ...]``: let brand-new nodes vote at once.

A node that restarted without its data must not vote until every lease it may have granted
has run out (the restart quarantine, see docs/explanation/guarantees.md). A brand-new node, or one
shut down cleanly with its data, lost nothing: declaring it fresh lets its current server
process vote at once. The declaration names that process (its run_id), so any later restart
is judged again. Prints what it did per node; exits non-zero when a node was not declared.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_redlock.core.health import declare_fresh
from django_redlock.default_manager import get_manager


class Command(BaseCommand):
    help = (
        "Declare lock nodes fresh (brand-new, or shut down cleanly): their current server "
        "process votes at once, with no restart quarantine."
    )
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django reads a plain list

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--node",
            action="append",
            dest="nodes",
            metavar="URL",
            help="only this node (its URL as in REDLOCK['NODES'], password optional); repeat "
            "for several; default: every node",
        )
        parser.add_argument(
            "--timeout", type=float, default=1.0, help="seconds per command on each node"
        )

    def handle(self, *args: Any, nodes: list[str] | None, timeout: float, **options: Any) -> None:
        try:
            manager = get_manager()
            addresses = manager.addresses_of(nodes)
        except ImproperlyConfigured as exc:
            raise CommandError(f"REDLOCK is not usable: {exc}") from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        done = declare_fresh(addresses, timeout=timeout)
        for item in done:
            style = self.style.SUCCESS if item.declared else self.style.ERROR
            self.stdout.write(style(f"{item.node}: {item.detail}"))
        failed = [item.node for item in done if not item.declared]
        if failed:
            raise CommandError(f"not declared: {', '.join(failed)}")
