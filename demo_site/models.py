"""The demo's booking data: events with seats (fenced rows), and the log of what happened.

``Sale`` and ``Rejection`` are append-only logs written next to the seat update, so the page
can show what each worker *believed* it sold: two sales of one seat is a double sale, whatever
the seat row says now.
"""

from __future__ import annotations

from django.db import models

from django_redlock.models import FencedModel


class Event(models.Model):
    """One run of the story: ``fenced`` says whether its seats' writes carry fencing tokens."""

    name = models.CharField(max_length=100)
    fenced = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Seat(FencedModel):
    """A seat: on hold during a checkout, then sold. Written only under ``lock_for(seat)``."""

    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="seats")
    label = models.CharField(max_length=10)
    held_by = models.CharField(max_length=100, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)
    sold_to = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ("event", "id")
        constraints = (models.UniqueConstraint(fields=("event", "label"), name="one_seat_label"),)

    def __str__(self) -> str:
        return f"{self.event} {self.label}"


class Sale(models.Model):
    """A sale as the selling worker recorded it, in the same transaction as the seat update."""

    seat = models.ForeignKey(Seat, on_delete=models.CASCADE, related_name="sales")
    customer = models.CharField(max_length=100)
    worker = models.CharField(max_length=40)
    fencing_token = models.BigIntegerField(null=True)
    lease_lost = models.BooleanField(default=False)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.seat} to {self.customer}"


class Rejection(models.Model):
    """A write the database refused because a newer holder had fenced the seat."""

    seat = models.ForeignKey(Seat, on_delete=models.CASCADE, related_name="rejections")
    customer = models.CharField(max_length=100)
    worker = models.CharField(max_length=40)
    fencing_token = models.BigIntegerField()
    reason = models.CharField(max_length=300)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.seat}: token {self.fencing_token} refused"
