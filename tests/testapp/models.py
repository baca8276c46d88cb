from __future__ import annotations

from django.db import models

from django_redlock.models import FencedManager, FencedModel


class Invoice(models.Model):
    number = models.CharField(max_length=20)
    total = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.number


class Ledger(FencedModel):
    """A fenced row that workers increment under lock_for."""

    value = models.IntegerField(default=0)
    writer = models.CharField(max_length=40, default="")

    def __str__(self) -> str:
        return f"ledger {self.pk}: {self.value}"


class WriteLog(models.Model):
    """One row per accepted fenced write, in the same transaction as the write."""

    ledger = models.ForeignKey(Ledger, on_delete=models.CASCADE)
    token = models.BigIntegerField()
    value = models.IntegerField()
    writer = models.CharField(max_length=40)

    def __str__(self) -> str:
        return f"{self.writer} wrote {self.value} under {self.token}"


class StrictSeat(FencedModel):
    """A fenced row that refuses writes outside lock_for."""

    fencing_required = True
    holder = models.CharField(max_length=40, default="")

    def __str__(self) -> str:
        return f"seat {self.pk}"


class LedgerProxy(Ledger):
    """A proxy of a fenced model: same row, same token, same lock."""

    class Meta:
        proxy = True


class Account(FencedModel):
    """A fenced parent of a multi-table child: its row carries the token."""

    owner = models.CharField(max_length=40, default="")
    balance = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"account {self.pk}"


class SavingsAccount(Account):
    """A multi-table child of a fenced parent (its own table has no token)."""

    rate = models.IntegerField(default=0)


class FencedInvoice(Invoice, FencedModel):
    """Fenced below a plain parent: the token sits in the child's table, the parent's fields
    in the parent's."""

    note = models.CharField(max_length=40, default="")

    # Python's order of bases would give Invoice's plain manager (check W010 says so).
    objects = FencedManager()  # type: ignore[misc]  # stubs see Invoice.objects as a ClassVar
