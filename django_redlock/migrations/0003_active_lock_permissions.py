"""The Active locks page's permissions (view only, plus force release)."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_redlock", "0002_activelock"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="activelock",
            options={
                "default_permissions": ("view",),
                "managed": False,
                "permissions": (("release_activelock", "Can force-release an active lock"),),
                "verbose_name": "active lock",
                "verbose_name_plural": "active locks",
            },
        ),
    ]
