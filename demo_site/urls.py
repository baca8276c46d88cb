from __future__ import annotations

from django.contrib import admin
from django.urls import path

from demo_site import views

urlpatterns = [
    path("", views.home, name="home"),
    path("lock/", views.take_and_release, name="take-and-release"),
    path("admin/", admin.site.urls),
]
