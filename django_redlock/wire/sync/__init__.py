"""The sync transport: one connection set per thread (:mod:`.connections`), each node's
socket (:mod:`.connection`), the wake-up subscriber (:mod:`.subscriber`), and the driver that
runs the procedures over them (:mod:`.driver`). :mod:`django_redlock.wire.asyncio` has the same
modules for an event loop."""
