"""The demo's models in the admin, beside django_redlock's Active locks page."""

from __future__ import annotations

from django.contrib import admin

from demo_site.models import Event, Rejection, Sale, Seat


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "fenced", "created_at")


@admin.register(Seat)
class SeatAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("label", "event", "held_by", "held_until", "sold_to", "fencing_token")
    list_filter = ("event",)


@admin.register(Sale)
class SaleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("seat", "customer", "worker", "fencing_token", "lease_lost", "at")
    list_filter = ("seat__event", "lease_lost")


@admin.register(Rejection)
class RejectionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("seat", "customer", "worker", "fencing_token", "reason", "at")
    list_filter = ("seat__event",)
