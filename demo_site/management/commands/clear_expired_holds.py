"""``manage.py clear_expired_holds``: drop the holds of checkouts that died before selling.

Cron may start it every minute on several machines: ``@locked_command`` lets one run at a
time and makes the others exit quietly (``on_busy="skip"``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from demo_site.services import clear_expired_holds
from django_redlock import locked_command


class Command(BaseCommand):
    help = "Clear the seat holds whose checkout died; one run at a time across machines."

    @locked_command(ttl=30.0)
    def handle(self, *args: Any, **options: Any) -> None:
        cleared = clear_expired_holds()
        self.stdout.write(f"cleared {cleared} expired hold{'s' if cleared != 1 else ''}")
