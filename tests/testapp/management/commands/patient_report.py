from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_redlock import locked_command


class Command(BaseCommand):
    @locked_command("nightly_report", on_busy="wait", timeout=20.0)
    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write("patient report built")
