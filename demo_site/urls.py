from __future__ import annotations

from django.contrib import admin
from django.urls import path

from demo_site import views

urlpatterns = [
    path("", views.home, name="home"),
    path("seats/<int:pk>/book/", views.book, name="book"),
    path("admin/", admin.site.urls),
]
