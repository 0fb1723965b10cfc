"""The object store port's pure parts (streamlog/remote/store.py, remote/s3.py): URLs,
Retrying's backoff and deadline and its idempotent conditional puts, the S3 adapter's
options and error translation. No network: Retrying runs over the in-memory twin with
a fake sleep that moves a manual clock; obstore's errors are built from the messages
it gives (tests/integration/test_s3_store.py pins those against a loopback server)."""

from __future__ import annotations

import pathlib
import random

import obstore.exceptions as obstore_errors
import pytest

from streamlog.errors import (InvalidArgument, ObjectNotFound, PreconditionFailed,
                              StoreError, StoreUnavailable)
from streamlog.remote.s3 import (S3Store, bare_etag, http_status, s3_options,
                                 translate_error)
from streamlog.remote.store import (ObjectStore, RetryPolicy, Retrying, StoreURL,
                                    backoff_delay_s, parse_url)
from streamlog.testing import MemoryBucket, MemoryStore
from streamlog.testing.clock import ManualClock

# -- URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize("url, expected", [
    ("s3://bucket/logs/orders", ("s3", "bucket", "logs/orders")),
    ("s3://bucket/logs/orders/", ("s3", "bucket", "logs/orders")),
    ("s3://bucket", ("s3", "bucket", "")),
    ("s3://bucket/", ("s3", "bucket", "")),
    ("s3://my.bucket-1/a", ("s3", "my.bucket-1", "a")),
    ("memory://test/prefix", ("memory", "test", "prefix")),
])
def test_a_store_url_is_scheme_bucket_and_prefix(url, expected):
    assert parse_url(url) == StoreURL(*expected)


@pytest.mark.parametrize("url, why", [
    ("gs://bucket/prefix", "unsupported object store URL"),
    ("/var/log/streamlog", "unsupported object store URL"),
    ("s3:/bucket/prefix", "unsupported object store URL"),
    ("S3://bucket/prefix", "unsupported object store URL"),
    ("s3://", "no valid bucket name"),
    ("s3:///prefix", "no valid bucket name"),
    ("s3://key:secret@bucket/prefix", "no valid bucket name"),
    ("s3://bucket/prefix?region=eu", "query or fragment"),
    ("s3://bucket/prefix#x", "query or fragment"),
    ("s3://bucket//prefix", "empty, '.' or '..' part"),
    ("s3://bucket/a//b", "empty, '.' or '..' part"),
    ("s3://bucket/a/../b", "empty, '.' or '..' part"),
])
def test_any_other_url_is_invalid_argument_saying_why(url, why):
    with pytest.raises(InvalidArgument, match=why.replace(".", r"\.").replace("?", r"\?")):
        parse_url(url)


def test_a_url_that_is_not_a_string_is_invalid_argument():
    with pytest.raises(InvalidArgument, match="not PosixPath"):
        parse_url(pathlib.Path("s3://bucket/prefix"))


# -- backoff ---------------------------------------------------------------------------


def test_each_wait_is_uniform_below_a_cap_that_doubles_up_to_the_max():
    policy = RetryPolicy(delay_base_s=0.1, delay_max_s=1.0)
    caps = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    rng, replay = random.Random(5), random.Random(5)
    for retry, cap in enumerate(caps, start=1):
        assert backoff_delay_s(policy, retry, rng) == replay.uniform(0.0, cap)
    waits = [backoff_delay_s(policy, 3, random.Random(seed)) for seed in range(500)]
    assert all(0.0 <= wait <= 0.4 for wait in waits) and max(waits) > 0.35
    assert backoff_delay_s(policy, 10_000, rng) <= 1.0  # no overflow, however late


@pytest.mark.parametrize("options", [{"attempts_max": 0}, {"attempts_max": 2.0},
                                     {"delay_base_s": -1}, {"deadline_s": "60"},
                                     {"delay_max_s": float("nan")}])
def test_a_policy_out_of_range_is_invalid_argument(options):
    with pytest.raises(InvalidArgument, match=next(iter(options))):
        RetryPolicy(**options)


class _Waits:
    """A fake sleep that records each wait and moves the clock by it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock, self.waits = clock, []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)


def _retrying(inner, policy=RetryPolicy(), seed=1):
    clock = ManualClock()
    waits = _Waits(clock)
    return Retrying(inner, policy, sleep=waits, rng=random.Random(seed), clock=clock), waits


def test_retrying_waits_full_jitter_between_attempts_then_succeeds():
    inner = MemoryStore()
    inner.put("k", b"v")
    inner.fail_next("get", n=4)
    store, waits = _retrying(inner, RetryPolicy(delay_base_s=0.5, delay_max_s=2.0), seed=9)
    assert store.get("k") == b"v"
    replay = random.Random(9)
    assert waits.waits == [replay.uniform(0, cap) for cap in (0.5, 1.0, 2.0, 2.0)]
    assert inner.calls["get"] == 5


class _Numbered:
    """A store whose every get fails with a numbered StoreUnavailable."""

    url = "memory://numbered"

    def __init__(self) -> None:
        self.attempts = 0

    def get(self, key: str) -> bytes:
        self.attempts += 1
        raise StoreUnavailable(f"failure {self.attempts}", key=key)


def test_retrying_gives_up_after_its_attempts_with_the_last_failure():
    inner = _Numbered()
    store, waits = _retrying(inner, RetryPolicy(attempts_max=4, deadline_s=1e9))
    with pytest.raises(StoreUnavailable, match="failure 4"):
        store.get("k")
    assert inner.attempts == 4 and len(waits.waits) == 3


def test_retrying_starts_no_attempt_after_the_deadline():
    clock = ManualClock()
    waits = _Waits(clock)
    inner = MemoryStore(sleep=waits)  # each call takes 1.5 s of the fake clock
    inner.slow(1.5)
    inner.down()
    policy = RetryPolicy(attempts_max=1000, delay_base_s=1.0, delay_max_s=1.0, deadline_s=10.0)
    store = Retrying(inner, policy, sleep=waits, rng=random.Random(2), clock=clock)
    started = clock.monotonic_s()
    with pytest.raises(StoreUnavailable, match="down"):
        store.head("k")
    backoffs = waits.waits[1::2]  # the store's own 1.5 s sleeps are the others
    assert all(0 <= wait <= 1.0 for wait in backoffs)
    # Every attempt started by the deadline; the one that ended past it was the last.
    last_start = clock.monotonic_s() - 1.5
    assert last_start - started <= 10.0 < clock.monotonic_s() - started
    assert inner.calls["head"] == len(backoffs) + 1 >= 5


def test_the_last_wait_is_cut_to_the_deadline():
    inner = _Numbered()
    store, waits = _retrying(inner, RetryPolicy(attempts_max=100, delay_base_s=10.0,
                                                delay_max_s=10.0, deadline_s=3.0), seed=4)
    with pytest.raises(StoreUnavailable):
        store.get("k")
    assert sum(waits.waits) == pytest.approx(3.0)


@pytest.mark.parametrize("error", [PreconditionFailed, ObjectNotFound, StoreError])
def test_answers_and_permanent_errors_are_never_retried(error):
    inner = MemoryStore()
    inner.put("k", b"v")
    inner.fail_next("get", error=error)
    store, waits = _retrying(inner)
    with pytest.raises(error) as raised:
        store.get("k")
    assert type(raised.value) is error
    assert inner.calls["get"] == 1 and waits.waits == []


def test_retrying_is_an_object_store_on_the_same_url():
    inner = MemoryStore(prefix="log")
    store, _ = _retrying(inner)
    assert isinstance(store, ObjectStore) and store.url == inner.url == "memory://memory/log"


def test_every_operation_is_retried():
    inner = MemoryStore()
    store, _ = _retrying(inner)
    for operation in ("put", "get", "get_range", "get_ranges", "head", "list", "delete"):
        inner.fail_next(operation, n=2)
    store.put("k", b"value")
    assert store.get("k") == b"value"
    assert store.get_range("k", 1, 3) == b"al"
    assert store.get_ranges("k", [(0, 1), (4, 9)]) == [b"v", b"e"]
    assert store.head("k").size == 5
    assert [meta.key for meta in store.list()] == ["k"]
    store.delete("k")
    assert all(inner.calls[op] == 3 for op in inner.calls) and len(inner.calls) == 7


# -- lost responses --------------------------------------------------------------------


def test_a_conditional_create_whose_response_was_lost_succeeds_on_retry():
    inner = MemoryStore()
    store, _ = _retrying(inner)
    inner.lose_response_next("put")
    etag = store.put("manifest/00000001", b"epoch 3, generation 1", if_absent=True)
    assert etag == inner.head("manifest/00000001").etag
    assert inner.get("manifest/00000001") == b"epoch 3, generation 1"
    assert inner.calls["put"] == 2  # the lost one, and the retry that found it


def test_a_conditional_overwrite_whose_response_was_lost_succeeds_on_retry():
    inner = MemoryStore()
    store, _ = _retrying(inner)
    first = store.put("lease", b"epoch 3, renewal 1", if_absent=True)
    inner.lose_response_next("put")
    second = store.put("lease", b"epoch 3, renewal 2", if_match=first)
    assert second == inner.head("lease").etag != first


def test_after_a_lost_response_other_bytes_mean_the_condition_really_failed():
    bucket = MemoryBucket()
    inner, rival = MemoryStore(bucket), MemoryStore(bucket)
    clock = ManualClock()
    # While this writer waits to retry, a rival replaces the object it had created.
    store = Retrying(inner, sleep=lambda s: rival.put("manifest/1", b"rival's bytes"),
                     rng=random.Random(1), clock=clock)
    inner.lose_response_next("put")
    with pytest.raises(PreconditionFailed):
        store.put("manifest/1", b"our bytes", if_absent=True)
    assert inner.get("manifest/1") == b"rival's bytes"


def test_after_a_lost_response_an_object_gone_means_the_condition_failed():
    inner = MemoryStore()
    store = Retrying(inner, sleep=lambda s: None, rng=random.Random(1))
    first = inner.put("lease", b"epoch 1")
    inner.lose_response_next("put")
    inner.fail_next("head", error=ObjectNotFound)  # deleted before the read-back
    with pytest.raises(PreconditionFailed):
        store.put("lease", b"epoch 2", if_match=first)


def test_a_size_that_differs_settles_it_without_a_download():
    inner = MemoryStore()
    inner.put("manifest/1", b"someone else's, longer")
    store, _ = _retrying(inner)
    inner.fail_next("put")  # failed before reaching the store: the rival's is there
    with pytest.raises(PreconditionFailed):
        store.put("manifest/1", b"ours", if_absent=True)
    assert inner.calls["head"] == 1 and inner.calls["get"] == 0


def test_a_condition_that_fails_at_once_is_not_read_back():
    inner = MemoryStore()
    inner.put("manifest/1", b"ours")
    store, _ = _retrying(inner)
    with pytest.raises(PreconditionFailed):
        store.put("manifest/1", b"ours", if_absent=True)
    assert inner.calls["head"] == 0 and inner.calls["get"] == 0


def test_a_plain_put_whose_response_was_lost_is_written_again():
    inner = MemoryStore()
    store, _ = _retrying(inner)
    inner.lose_response_next("put")
    assert store.put("k", b"v") == inner.head("k").etag
    assert inner.calls["put"] == 2


# -- the S3 adapter's options ----------------------------------------------------------


def test_the_aws_variables_configure_the_store_and_options_override_them():
    environ = {"AWS_ENDPOINT_URL": "https://rgw.example:7480", "AWS_ACCESS_KEY_ID": "id",
               "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "eu-west-1",
               "AWS_UNRELATED": "x"}
    options = s3_options("s3://logs/orders/", {"region": "us-east-1", "timeout": "5s"},
                         environ=environ)
    assert (options.bucket, options.prefix) == ("logs", "orders")
    assert options.config == {"virtual_hosted_style_request": False,
                              "endpoint": "https://rgw.example:7480",
                              "access_key_id": "id", "secret_access_key": "secret",
                              "region": "us-east-1"}
    assert options.client_options == {"timeout": "5s"}


def test_a_plain_http_endpoint_turns_allow_http_on():
    options = s3_options("s3://b/p", {"AWS_ENDPOINT_URL": "http://127.0.0.1:7480"},
                         environ={})
    assert options.config["endpoint"] == "http://127.0.0.1:7480"  # an alias, normalised
    assert options.client_options == {"allow_http": True}
    from_environ = s3_options("s3://b/p", environ={"AWS_ENDPOINT_URL": "HTTP://rgw:80"})
    assert from_environ.client_options == {"allow_http": True}


@pytest.mark.parametrize("value, expected", [("true", True), ("0", False), (True, True)])
def test_allow_http_may_be_a_string(value, expected):
    options = s3_options("s3://b/p", {"allow_http": value}, environ={})
    assert options.client_options == {"allow_http": expected}


def test_allow_http_off_with_an_http_endpoint_is_invalid_argument():
    with pytest.raises(InvalidArgument, match="plain http but allow_http is off"):
        s3_options("s3://b/p", {"endpoint": "http://rgw:7480", "allow_http": "false"},
                   environ={})
    with pytest.raises(InvalidArgument, match="true or false"):
        s3_options("s3://b/p", {"allow_http": "maybe"}, environ={})


def test_path_style_is_the_default_and_may_be_overridden():
    assert s3_options("s3://b/p", environ={}).config == {
        "virtual_hosted_style_request": False}
    options = s3_options("s3://b/p", {"virtual_hosted_style_request": True}, environ={})
    assert options.config == {"virtual_hosted_style_request": True}


@pytest.mark.parametrize("url, storage_options, why", [
    ("memory://b/p", None, "not an s3:// URL"),
    ("s3://b/p", {"bucket": "other"}, "names the bucket"),
    ("s3://b/p", {"AWS_BUCKET_NAME": "other"}, "names the bucket"),
])
def test_options_that_contradict_the_url_are_invalid_argument(url, storage_options, why):
    with pytest.raises(InvalidArgument, match=why):
        s3_options(url, storage_options, environ={})


def test_an_s3_store_is_built_with_no_request():
    store = S3Store.from_url("s3://logs/orders/", {"endpoint": "http://127.0.0.1:9",
                                                   "access_key_id": "id",
                                                   "secret_access_key": "secret"},
                             environ={})
    assert store.url == "s3://logs/orders" and isinstance(store, ObjectStore)
    assert store.inner.retry_config["max_retries"] == 0  # Retrying decides
    assert store.inner.client_options == {"allow_http": "true"}  # obstore's own form


@pytest.mark.parametrize("storage_options", [{"no_such_option": "1"}, {"timeout": "soon"}])
def test_options_obstore_refuses_are_invalid_argument(storage_options):
    with pytest.raises(InvalidArgument, match="cannot open s3://b/p"):
        S3Store.from_url("s3://b/p", storage_options, environ={})


# -- the S3 adapter's errors -----------------------------------------------------------

def _failed(status_line: str, method: str = "PUT") -> str:
    """obstore's message for a request answered with `status_line` (its first line;
    the Rust debug dump after it is not read)."""
    return (f"Generic S3 error: Error performing {method} http://127.0.0.1:7480/b/p/k in "
            f"1.2ms - Server returned non-2xx status code: {status_line}\n\nDebug source:\n"
            f"Generic {{ ... }}")


_TRANSPORT = ("Generic S3 error: Error performing PUT http://127.0.0.1:7480/b/p/k in "
              "300ms - HTTP error: error sending request\n\nDebug source:\n"
              "HttpError {{ kind: {kind}, ... }}")


@pytest.mark.parametrize("error, put_mode, expected", [
    (FileNotFoundError("Object at location p/k not found: ..."), None, ObjectNotFound),
    (obstore_errors.NotFoundError("not found"), None, ObjectNotFound),
    (FileNotFoundError("Object at location p/k not found: " + _failed(
        "404 Not Found: <Error><Code>NoSuchBucket</Code></Error>")), "create", StoreError),
    (obstore_errors.PreconditionError(
        "Request precondition failure for path p/k: " + _failed("412 Precondition Failed: ")),
     "create", PreconditionFailed),
    (obstore_errors.AlreadyExistsError(
        "Object at location p/k already exists: " + _failed("412 Precondition Failed: ")),
     "create", PreconditionFailed),
    (obstore_errors.AlreadyExistsError("Object already exists at that location: p/k"),
     "create", PreconditionFailed),
    (obstore_errors.PreconditionError("Request precondition failure for path p/k: \"0\" "
                                      "does not match \"1\""), "update", PreconditionFailed),
    (obstore_errors.PreconditionError("Request precondition failure for path p/k"),
     None, StoreError),
    (obstore_errors.AlreadyExistsError(
        "Object at location p/k already exists: " + _failed(
            "409 Conflict: <Error><Code>ConditionalRequestConflict</Code></Error>")),
     "create", StoreUnavailable),
    (obstore_errors.GenericError(_failed(
        "503 Service Unavailable: <Error><Code>SlowDown</Code></Error>")), None,
     StoreUnavailable),
    (obstore_errors.GenericError(_failed("500 Internal Server Error: ")), None,
     StoreUnavailable),
    (obstore_errors.GenericError(_failed("429 Too Many Requests: ")), None, StoreUnavailable),
    (obstore_errors.GenericError(_failed("408 Request Timeout: ")), None, StoreUnavailable),
    (obstore_errors.GenericError(_failed("400 Bad Request: <Code>SlowDown</Code>")), None,
     StoreUnavailable),  # throttling, whatever status a store sends it with
    (obstore_errors.GenericError(_failed("400 Bad Request: ")), None, StoreError),
    (obstore_errors.GenericError(_failed("416 Range Not Satisfiable: ", "GET")), None,
     StoreError),
    (obstore_errors.PermissionDeniedError(
        "The operation lacked the necessary privileges to complete for path k: "
        + _failed("403 Forbidden: ")), None, StoreError),
    (obstore_errors.UnauthenticatedError("The operation lacked valid authentication"),
     None, StoreError),
    (obstore_errors.GenericError(_TRANSPORT.format(kind="Connect")), None, StoreUnavailable),
    (obstore_errors.GenericError(_TRANSPORT.format(kind="Timeout")), None, StoreUnavailable),
    (obstore_errors.GenericError("Generic S3 error: Unable to extract metadata from "
                                 "headers: ETag Header missing from response"), None,
     StoreError),
    (ConnectionResetError("reset"), None, StoreUnavailable),
])
def test_obstore_errors_become_the_ports(error, put_mode, expected):
    translated = translate_error(error, where="put 'k' in s3://b/p", key="k",
                                 put_mode=put_mode)
    assert type(translated) is expected
    assert translated.key == "k"
    assert str(translated).startswith("put 'k' in s3://b/p: ")
    assert "Debug source" not in str(translated)


@pytest.mark.parametrize("etag, bare", [('"abc"', "abc"), ("abc", "abc"),
                                        ('W/"abc"', 'W/"abc"'), ('"', '"')])
def test_if_match_etags_are_sent_bare(etag, bare):
    assert bare_etag(etag) == bare


def test_the_status_is_read_from_obstores_message():
    assert http_status(obstore_errors.GenericError(_failed("503 Service Unavailable: "))) == 503
    assert http_status(obstore_errors.GenericError(_TRANSPORT.format(kind="Connect"))) is None
