"""Views for the decorator tests: every shape a user writes."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_redlock import LockedViewMixin, get_manager, locked_view


def _holder(name: str) -> dict[str, object] | None:
    return get_manager().holder(name)


@locked_view("order:{pk}")
def pay(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse({"holder": _holder(f"order:{pk}")})


@locked_view()
def default_name(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"holder": _holder("tests.views.default_name")})


@locked_view(lambda request, pk: f"custom:{pk}:{request.GET.get('x', '')}")
def by_callable(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse({"holder": _holder(f"custom:{pk}:{request.GET.get('x', '')}")})


@locked_view("order:{pk}")
async def apay(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse({"async": True, "pk": pk})


@locked_view(
    "order:{pk}",
    on_locked=lambda request, error: HttpResponse("busy, sorry", status=409),
    on_unavailable=lambda request, error: HttpResponse("down, sorry", status=502),
)
def polite(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("paid")


@locked_view("order:{missing}")
def misnamed(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("never")


@method_decorator(locked_view("order:{pk}"), name="dispatch")
class PayView(View):
    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse({"holder": _holder(f"order:{pk}")})


class MixinPayView(LockedViewMixin, View):
    lock_name = "order:{pk}"

    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse({"holder": _holder(f"order:{pk}")})


class AsyncMixinPayView(LockedViewMixin, View):
    lock_name = "order:{pk}"

    async def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse({"async": True, "pk": pk})


@locked_view("lose:{pk}")
def lose(request: HttpRequest, pk: int) -> HttpResponse:
    """An operator force-releases the view's lock while it runs."""
    get_manager().force_release(f"lose:{pk}")
    return HttpResponse("done")


@locked_view("lose:{pk}")
async def alose(request: HttpRequest, pk: int) -> HttpResponse:
    get_manager().force_release(f"lose:{pk}")
    return HttpResponse("done")
