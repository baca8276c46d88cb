from __future__ import annotations

from django.db import models


class Invoice(models.Model):
    number = models.CharField(max_length=20)
    total = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.number
