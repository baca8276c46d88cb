"""The "Active locks" admin page: node health, the locks held, and force release.

A page through an unmanaged model (django-rq's Dashboard pattern): nothing is stored, every
view reads the nodes. Staff with ``django_redlock.view_activelock`` see it; force release
needs ``django_redlock.release_activelock``, is a POST with CSRF after a confirmation page,
bumps the fencing token when the lock guards a FencedModel row (so the evicted holder's
later writes are refused), and is recorded in the admin log. Tokens and passwords never
appear on the page.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from django_redlock.core import metrics
from django_redlock.core.health import status
from django_redlock.core.listing import list_locks
from django_redlock.default_manager import get_manager
from django_redlock.exceptions import FencingUnavailable
from django_redlock.models import ActiveLock, FencedModel
from django_redlock.procedures.arguments import validate_name

logger = logging.getLogger("django_redlock")

RELEASE_PERMISSION = "django_redlock.release_activelock"


def _fenced_target(name: str) -> tuple[type[FencedModel], Any] | None:
    """(FencedModel, canonical pk) of the row a lock name ``"<app_label>.<model_name>:<pk>"``
    guards, or None when the name is not the one ``lock_for`` gives such a row."""
    label, sep, pk = name.partition(":")
    if not sep or "." not in label:
        return None
    app_label, model_name = label.split(".", 1)
    try:
        model = apps.get_model(app_label, model_name)
    except LookupError:
        return None
    if not issubclass(model, FencedModel):
        return None
    from django_redlock.fencing import canonical_pk

    try:
        # Only the name lock_for gives that row (its pk as the field makes it): "07" or a
        # full-width digit is some other lock, and must not bump row 7's or row 1's token.
        value = canonical_pk(model, pk)
    except ValueError:
        return None
    return (model, value) if str(value) == pk else None


def fenced_row(name: str) -> FencedModel | None:
    """The FencedModel row a lock name ``"<app_label>.<model_name>:<pk>"`` guards, if any."""
    target = _fenced_target(name)
    if target is None:
        return None
    model, pk = target
    instance: FencedModel | None = model._base_manager.filter(pk=pk).first()
    return instance


def fenced_tokens(names: list[str]) -> dict[str, int]:
    """Lock name -> fencing token of the row it guards, for the names that guard one: one
    query per model, not one per lock (the page refreshes every few seconds)."""
    wanted: dict[type[FencedModel], dict[Any, str]] = {}
    for name in names:
        target = _fenced_target(name)
        if target is not None:
            wanted.setdefault(target[0], {})[target[1]] = name
    tokens: dict[str, int] = {}
    for model, by_pk in wanted.items():
        rows = model._base_manager.filter(pk__in=list(by_pk)).values_list("pk", "fencing_token")
        for pk, token in rows:
            tokens[by_pk[pk]] = token
    return tokens


if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[ActiveLock]
else:  # ModelAdmin is generic only for type checkers
    _ModelAdmin = admin.ModelAdmin


@admin.register(ActiveLock)
class ActiveLockAdmin(_ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        release = path(
            "release/",
            self.admin_site.admin_view(self.release_view),
            name="django_redlock_activelock_release",
        )
        return [release, *super().get_urls()]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.GET.get("q", "").strip()
        refresh = request.GET.get("refresh", "")
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": "Active locks",
            "opts": self.model._meta,
            "query": query,
            "refresh": refresh if refresh in ("5", "15", "60") else "",
            "can_release": request.user.has_perm(RELEASE_PERMISSION),
            **(extra_context or {}),
        }
        try:
            manager = get_manager()
        except ImproperlyConfigured as exc:
            context["config_error"] = str(exc)
            return TemplateResponse(
                request, "admin/django_redlock/activelock/change_list.html", context
            )
        report = status(manager)
        # The search is part of the listing, so a lock beyond the cap is found too.
        listing = list_locks(
            manager,
            contains=query,
            skip=[node.node for node in report.nodes if not node.reachable],
        )
        locks = listing.locks
        rows = []
        tokens = fenced_tokens([lock.name for lock in locks])
        for lock in locks:
            since = lock.owner.get("acquired_at")
            rows.append(
                {
                    "lock": lock,
                    "fencing_token": tokens.get(lock.name),
                    "acquired": datetime.fromtimestamp(since, UTC)
                    if isinstance(since, int | float)
                    else None,
                }
            )
        context.update(
            report=report,
            rows=rows,
            listing=listing,
            manager=manager,
            process=sorted(metrics.summary().items()),
        )
        return TemplateResponse(
            request, "admin/django_redlock/activelock/change_list.html", context
        )

    def release_view(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm(RELEASE_PERMISSION):
            raise PermissionDenied
        name = request.POST.get("name") if request.method == "POST" else request.GET.get("name")
        try:
            name = validate_name(name)
        except (TypeError, ValueError):
            messages.error(request, "No valid lock name was given.")
            return HttpResponseRedirect(reverse("admin:django_redlock_activelock_changelist"))
        manager = get_manager()
        row = fenced_row(name)
        if request.method != "POST" or request.POST.get("confirm") != "yes":
            owner = manager.holder(name)
            return TemplateResponse(
                request,
                "admin/django_redlock/activelock/release.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Force-release a lock",
                    "opts": self.model._meta,
                    "name": name,
                    "owner": owner,
                    "row": row,
                },
            )
        # Fence the evicted holder off first, then free the lock: the other way round, a
        # waiter woken by the release mints its token before our bump, which then fences
        # off that new, legitimate holder instead.
        bumped = ""
        if row is not None:
            from django_redlock.fencing import mint_for_row

            try:
                token = mint_for_row(row, name)
                bumped = f"; fencing token of {row._meta.label}({row.pk}) bumped to {token}"
            except FencingUnavailable as exc:
                bumped = f"; fencing token NOT bumped: {exc}"
        deleted = manager.force_release(name)
        detail = f"force-released on {deleted}/{len(manager.addresses)} nodes{bumped}"
        assert request.user.pk is not None  # admin_view: a logged-in staff user
        LogEntry.objects.log_actions(
            user_id=request.user.pk,
            queryset=[ActiveLock(name=name)],
            action_flag=DELETION,
            change_message=detail,
            single_object=True,
        )
        logger.warning("%s by %s: %s", name, request.user, detail)
        # Django's admin capitalises the first letter of a message: start with a word, not
        # the lock name ("shop.seat:1" read "Shop.seat:1").
        messages.success(request, f"Lock {name!r} {detail}.")
        return HttpResponseRedirect(reverse("admin:django_redlock_activelock_changelist"))
