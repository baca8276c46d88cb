from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_redlock", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="ActiveLock",
            fields=[
                ("name", models.CharField(max_length=1024, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "active lock",
                "verbose_name_plural": "active locks",
                "managed": False,
                "default_permissions": ("view",),
                "permissions": [("release_activelock", "Can force-release an active lock")],
            },
        ),
    ]
