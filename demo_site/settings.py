"""Settings of the demo site: SQLite, and the lock nodes started by ``./run demo``.

``REDLOCK_DEMO_NODES`` (comma-separated URLs) is set by ``demo_site/run_demo.py`` after it
starts three local nodes; run ``manage.py`` by hand with it set to use your own servers.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = "demo-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redlock",
    "demo_site",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "demo_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("REDLOCK_DEMO_DB", str(BASE_DIR / "db.sqlite3")),
        # Several worker processes write at once: wait for SQLite's write lock instead of
        # failing, and take it at BEGIN so two transactions never deadlock upgrading to it.
        "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
    }
}

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDLOCK = {
    "NODES": [url for url in os.environ.get("REDLOCK_DEMO_NODES", "").split(",") if url],
    "TTL": 10.0,
    # The demo's nodes fsync every write (appendfsync always, so they vote at once without
    # being declared fresh): on a busy disk an fsync can outlast the 50 ms default.
    "NODE_TIMEOUT": 0.25,
    "KEY_PREFIX": "demo:",
}

# The buyers' lost leases are expected in the demo: log them to a file (when the demo runner
# names one) instead of over the live view.
if os.environ.get("REDLOCK_DEMO_LOG"):
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": os.environ["REDLOCK_DEMO_LOG"]}
        },
        "loggers": {"django_redlock": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
