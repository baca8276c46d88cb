"""Every model change ships with its migration (users' own `makemigrations --check` in CI
would otherwise flag our app)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_model_change_lacks_a_migration():
    out = io.StringIO()
    # --check exits non-zero (SystemExit) when a migration is missing.
    call_command(
        "makemigrations", "django_redlock", "demo_site", check=True, dry_run=True, stdout=out
    )
    assert "No changes detected" in out.getvalue()
