from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("testapp", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Ledger",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("fencing_token", models.BigIntegerField(default=0, editable=False)),
                ("value", models.IntegerField(default=0)),
                ("writer", models.CharField(default="", max_length=40)),
            ],
            options={"abstract": False},
        ),
        migrations.CreateModel(
            name="StrictSeat",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("fencing_token", models.BigIntegerField(default=0, editable=False)),
                ("holder", models.CharField(default="", max_length=40)),
            ],
            options={"abstract": False},
        ),
        migrations.CreateModel(
            name="WriteLog",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("token", models.BigIntegerField()),
                ("value", models.IntegerField()),
                ("writer", models.CharField(max_length=40)),
                (
                    "ledger",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, to="testapp.ledger"
                    ),
                ),
            ],
        ),
    ]
