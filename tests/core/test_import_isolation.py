"""The core imports and works with Django absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_core_runs_without_django(cluster3):
    script = textwrap.dedent(
        f"""
        import sys

        class NoDjango:
            # Make `import django` fail, as on a machine without Django installed.
            def find_spec(self, name, path=None, target=None):
                if name == "django" or name.startswith("django."):
                    raise ImportError("Django is not installed")
                return None

        sys.meta_path.insert(0, NoDjango())
        import django_redlock
        from django_redlock import AsyncLease, AsyncLockManager, LockContended, LockManager
        from django_redlock.localnodes import LocalCluster

        manager = LockManager({cluster3.urls!r})
        rival = LockManager({cluster3.urls!r})
        with manager.lock("no-django", ttl=5.0) as lease:
            try:
                rival.acquire("no-django", blocking=False)
            except LockContended:
                pass
            else:
                raise SystemExit("second acquire should have been contended")
        assert not any(m == "django" or m.startswith("django.") for m in sys.modules)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
