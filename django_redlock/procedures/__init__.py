"""Each operation on the nodes written once, as a sans-I/O procedure.

A procedure is a generator: it yields what it needs done (an effect of
:mod:`django_redlock.procedures.effects`: a round to send and wait for, commands to post
without waiting, a sleep, a subscription, a wait for a wake-up, the grants heard) and is sent
its outcome; it returns the operation's result or raises its error. It decides every step
and does no I/O: three drivers carry the effects out, the sync one
(``django_redlock.wire.sync.driver``), the asyncio one (``django_redlock.wire.asyncio.driver``)
and the simulator's (``tests/sim/world.py``), so what the simulator checks is what ships.

An error the driver meets while carrying out an effect (an interrupt, a cancellation) is
thrown into the procedure at its ``yield``, so the procedure's own clean-ups (posts, which
never wait) run before it re-raises; a driver therefore never closes a procedure it has not
run to its end.

This package is the pure part of the library: the procedures (``acquire``, ``lease``,
``operators``, their ``effects``) and the modules they decide with: ``flow`` (the Redlock
steps over replies), ``shapes`` (what each kind of lease sends and counts), ``options`` and
``arguments`` (what a caller may ask, checked). It imports no socket, thread, asyncio,
selectors or Django (``tests/core/test_import_isolation.py`` proves it), only the commands of
``wire.scripts`` and ``wire.primitives``.
"""
