"""The Django-free core above the wire: argument checks, the lease extender, operator queries
and in-process metrics. The two managers (``django_redlock.redlock`` and
``django_redlock.aredlock``) are built from these and from ``django_redlock.wire``.

Nothing here imports Django (ruff's TID251 ban and ``tests/core/test_import_isolation.py``).
"""
