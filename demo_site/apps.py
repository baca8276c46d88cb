from __future__ import annotations

from django.apps import AppConfig


class DemoSiteConfig(AppConfig):
    name = "demo_site"
    verbose_name = "Demo"
