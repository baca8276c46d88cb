"""The app's configuration: registers the system checks and wires the settings to the
signals, without reading a setting or contacting a node."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks
from django.core.signals import setting_changed


class RedlockConfig(AppConfig):
    name = "django_redlock"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registration only: no settings are read and no node is contacted here.
        from django_redlock import default_manager, signals
        from django_redlock.checks import check_settings

        checks.register(check_settings)
        setting_changed.connect(default_manager.reset, dispatch_uid="django_redlock.reset")
        # The managers get_manager() builds send the lock signals and count the metrics.
        default_manager.set_manager_factory(signals.observed_manager)
