from __future__ import annotations

from django.contrib import admin
from django.urls import path

from tests import views

urlpatterns = [
    path("pay/<int:pk>/", views.pay),
    path("default/", views.default_name),
    path("callable/<int:pk>/", views.by_callable),
    path("apay/<int:pk>/", views.apay),
    path("polite/<int:pk>/", views.polite),
    path("misnamed/<int:pk>/", views.misnamed),
    path("cbv/<int:pk>/", views.PayView.as_view()),
    path("mixin/<int:pk>/", views.MixinPayView.as_view()),
    path("amixin/<int:pk>/", views.AsyncMixinPayView.as_view()),
    path("lose/<int:pk>/", views.lose),
    path("alose/<int:pk>/", views.alose),
    path("admin/", admin.site.urls),
]
