"""Minimal Django settings for the test suite (the demo has its own, in demo_site/)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import dj_database_url

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["testserver", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redlock",
    "tests.testapp",
    "demo_site",  # the demo's booking service is tested like any app's
]

ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

# SQLite by default; PostgreSQL (or anything dj-database-url reads) when DATABASE_URL is set,
# as CI does, so the database-side tests run on both. SQLite uses a file, not memory, so that
# worker processes started by the fencing tests see the same test database; they are told its
# name through REDLOCK_TEST_DB_NAME.
if os.environ.get("DATABASE_URL"):
    _database = dj_database_url.parse(os.environ["DATABASE_URL"])
    if os.environ.get("REDLOCK_TEST_DB_SUFFIX"):
        # Two runs of the suite at once on one server (./run test runs the suite on Valkey and
        # on Redis side by side): each creates and drops a test database of its own.
        suffix = os.environ["REDLOCK_TEST_DB_SUFFIX"]
        _database["TEST"] = {"NAME": f"test_{_database['NAME']}_{suffix}"}
else:
    _path = str(Path(tempfile.gettempdir()) / f"django-redlock-tests-{os.getpid()}.sqlite3")
    _database = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _path,
        "TEST": {"NAME": _path},
        "OPTIONS": {"timeout": 30},
    }
if os.environ.get("REDLOCK_TEST_DB_NAME"):
    _database["NAME"] = os.environ["REDLOCK_TEST_DB_NAME"]
    _database["TEST"] = {"NAME": os.environ["REDLOCK_TEST_DB_NAME"]}
DATABASES = {"default": _database}

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Filled in per test by the fixtures in tests/django/conftest.py, with the nodes they started;
# subprocesses (management commands run from the shell) get them through the environment.
REDLOCK: dict[str, object] = {
    "NODES": [url for url in os.environ.get("REDLOCK_TEST_NODES", "").split(",") if url],
    "RETRY_DELAY": 0.02,
    # Not the default 50 ms: CI runs two lanes of real servers side by side on two cores,
    # and a test that expects contention (LockContended) got QuorumUnreachable once, all
    # three local nodes "no answer within 50 ms". Tests of the timeout itself set their own.
    "NODE_TIMEOUT": 0.25,
}
# The long soak (tests/django/test_soak.py) restarts nodes empty: a short MAX_TTL keeps their
# quarantine short (TTL must stay below it), and its workers get the node timeout its
# invariant checks assume.
for _setting in ("TTL", "MAX_TTL", "NODE_TIMEOUT"):
    if os.environ.get(f"REDLOCK_TEST_{_setting}"):
        REDLOCK[_setting] = float(os.environ[f"REDLOCK_TEST_{_setting}"])
