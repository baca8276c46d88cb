"""Everything that talks to a node: addresses and URLs (``nodes``), RESP (``resp``), the Lua
scripts and their commands (``scripts``), the sync and asyncio transports (``sync``, ``aio``)
and redis-py clients for operator calls (``clients``).

Imports nothing from ``django_redlock.core`` or the managers, and no Django.
"""
