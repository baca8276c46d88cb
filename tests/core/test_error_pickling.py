"""Errors cross process boundaries intact (pickle: multiprocessing; Celery's result backends
rebuild an exception as ``cls(*args)``)."""

from __future__ import annotations

import pickle

import pytest

from django_redlock import (
    LeaseNotExtended,
    LeaseReleased,
    LockContended,
    LockLost,
    QuorumUnreachable,
    StaleFencingToken,
)


@pytest.mark.parametrize(
    "error",
    [
        LockContended(
            "orders:1",
            votes=1,
            quorum=2,
            node_errors={"redis://a:1/0": "no answer within 50 ms"},
            retry_after=2.5,
            attempts=3,
            origin="view:x",
        ),
        QuorumUnreachable("orders:1", votes=0, quorum=2),
        LeaseNotExtended("orders:1", 2, 3, {"n0": "no answer within 50 ms"}, 1.5, 2, "counts"),
        LockLost("orders:1", "the lease expired"),
        LockLost("orders:1", "taken by another holder", "taken", 12.5),
        LeaseReleased("orders:1"),
        StaleFencingToken("orders:1", 7, "row 3"),
    ],
)
def test_errors_survive_pickle(error):
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes, just made
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)


@pytest.mark.parametrize(
    "error",
    [
        LockContended("orders:1", 1, 2, {"redis://a:1/0": "refused"}, 2.5, 3, "view:x"),
        LeaseNotExtended("orders:1", 2, 3, {"n0": "no answer within 50 ms"}, 1.5, 2, "counts"),
        LockLost("orders:1", "the lease expired"),
        LockLost("orders:1", "taken by another holder", "taken", 12.5),
        LeaseReleased("orders:1"),
        StaleFencingToken("orders:1", 7, "row 3"),
    ],
)
def test_errors_are_rebuilt_from_their_args_as_celery_does(error):
    copy = type(error)(*error.args)  # celery.backends.base: exception_to_python
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)
