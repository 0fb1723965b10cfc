"""Every public method of a local Log is either part of the API (api.LogAPI: a daemon's
RemoteLog has it too) or deliberately local (api.LOCAL_ONLY, which says why, and its
docstring says so): nothing is left undecided."""

import inspect

import pytest

import streamlog
from streamlog.api import LOCAL_ONLY, OPERATIONS, LogAPI
from streamlog.log import Log
from streamlog.wire.client import RemoteLog

# What a Log is as an object rather than a log: context managers.
OBJECT_PROTOCOL = {"__enter__", "__exit__", "__aenter__", "__aexit__"}


def _public_methods(cls) -> set[str]:
    """Its own and its bases' (a Log is one class written in three modules)."""
    return {name for klass in cls.__mro__ if klass is not object
            for name, member in vars(klass).items()
            if callable(member) or isinstance(member, staticmethod)
            if not name.startswith("_")}


def test_each_public_method_of_log_is_in_the_api_or_local_only():
    undecided = _public_methods(Log) - set(OPERATIONS) - set(LOCAL_ONLY)
    assert not undecided, f"neither in LogAPI nor in api.LOCAL_ONLY: {sorted(undecided)}"
    assert set(LOCAL_ONLY) <= _public_methods(Log)
    assert not set(LOCAL_ONLY) & set(OPERATIONS)


@pytest.mark.parametrize("name", sorted(LOCAL_ONLY))
def test_a_local_only_method_says_so_and_why(name):
    assert len(LOCAL_ONLY[name]) > 20
    if name.endswith("_async"):  # (the twin of one that says so)
        name = name.removesuffix("_async")
    assert "Local only" in inspect.getdoc(getattr(Log, name)), name


@pytest.mark.parametrize("name", sorted(LOCAL_ONLY))
def test_a_daemon_client_does_not_pretend_to_have_a_local_only_method(name):
    assert not hasattr(RemoteLog, name)


@pytest.mark.parametrize("name", ["hold", "release_hold", "holds", "open_transactions",
                                  "apply_retention"])
def test_holds_retention_and_open_transactions_are_part_of_the_api(name):
    assert name in OPERATIONS
    declared = inspect.signature(getattr(LogAPI, name))
    assert inspect.signature(getattr(Log, name)).parameters.keys() == declared.parameters.keys()
    assert inspect.signature(getattr(RemoteLog, name)) == declared


def test_the_facade_exports_the_client_and_the_transaction_states():
    assert {"RemoteLog", "TxnState", "LogAPI", "Log"} <= set(streamlog.__all__)
    assert streamlog.RemoteLog is RemoteLog
    assert streamlog.TxnState.COMMITTED.name == "COMMITTED"
    assert all(hasattr(streamlog, name) for name in streamlog.__all__)
