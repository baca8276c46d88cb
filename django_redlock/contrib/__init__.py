"""Integrations with other frameworks, each an optional extra (``django_redlock[celery]``).

Nothing here is imported by ``django_redlock`` itself: importing a submodule is what pulls in
its framework.
"""
