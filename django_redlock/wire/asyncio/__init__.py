"""The asyncio transport: one connection set per event loop (:mod:`.connections`), each
node's connection (:mod:`.connection`), the wake-up subscriber (:mod:`.subscriber`), and the
driver that runs the procedures over them (:mod:`.driver`). :mod:`django_redlock.wire.sync` has
the same modules for threads."""
