"""Everything that talks to a node: addresses and URLs (``nodes``), RESP (``resp``), the Lua
scripts and their commands (``scripts``), connection set-up (``setup``), and the two
transports behind one interface (``transport``), ``sync`` and ``asyncio``, packages with the
same modules (``connections``, one set per thread or event loop, over ``connection``, one per
node; ``subscriber`` for pub/sub; ``driver``, which runs the procedures), sharing the round
tally and NOSCRIPT rule (``rounds``), the stall rule (``stall``) and the wake-up names
(``waking``); and redis-py clients for operator calls (``clients``).

Imports nothing from ``django_redlock.core`` or the managers, and no Django.
"""
