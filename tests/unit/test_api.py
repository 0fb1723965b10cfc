"""The log API is defined once (streamlog/api.py): the local Log and the daemon's
RemoteLog both have every operation, with the same parameters."""

import inspect

import pytest

from streamlog.api import OPERATIONS, LogAPI
from streamlog.log import Log
from streamlog.wire.client import RemoteLog


def _shape(function) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


def test_the_protocol_names_every_shared_operation():
    assert len(OPERATIONS) >= 20
    assert {"append_batch", "reader", "commit_txn", "truncate_after"} <= set(OPERATIONS)


@pytest.mark.parametrize("implementation", [Log, RemoteLog], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", OPERATIONS)
def test_each_implementation_has_each_operation_with_its_parameters(implementation, name):
    expected, found = getattr(LogAPI, name), getattr(implementation, name, None)
    assert found is not None, f"{implementation.__name__} has no {name}"
    assert _shape(found) == _shape(expected), f"{implementation.__name__}.{name}"
    assert inspect.iscoroutinefunction(found) == inspect.iscoroutinefunction(expected), name
