"""A command guarded by @locked_command, as users write them."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_redlock import get_manager, locked_command


class Command(BaseCommand):
    help = "Pretends to build the nightly report; one run at a time."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--fail", action="store_true")

    @locked_command()
    def handle(self, *args: Any, fail: bool = False, **options: Any) -> None:
        if fail:
            raise RuntimeError("report failed")
        owner = get_manager().holder("nightly_report")
        self.stdout.write(f"report built under {owner['origin'] if owner else 'no lock'}")
