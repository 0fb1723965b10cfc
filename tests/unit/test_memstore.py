"""The ObjectStore contract (streamlog/remote/store.py), held against the in-memory twin
(streamlog/testing/memstore.py), against the S3 adapter over obstore's own in-memory
store (so the twin and the real adapter agree), and through Retrying; then the twin's
injected faults, one by one. No network, no disk."""

from __future__ import annotations

import hashlib
import random
import threading

import pytest
from obstore.store import MemoryStore as ObstoreMemory

from streamlog.errors import (InvalidArgument, ObjectNotFound, PreconditionFailed,
                              StoreError, StoreUnavailable)
from streamlog.remote.s3 import S3Store
from streamlog.remote.store import OBJECT_BYTES_MAX, ObjectStore, Retrying
from streamlog.testing import MemoryBucket, MemoryStore
from streamlog.testing.clock import ManualClock


def _memory(prefix: str, shared: dict) -> ObjectStore:
    return MemoryStore(shared.setdefault("bucket", MemoryBucket()), prefix=prefix)


def _s3_adapter(prefix: str, shared: dict) -> ObjectStore:
    inner = shared.setdefault("inner", ObstoreMemory())
    # obstore's in-memory store compares If-Match verbatim with its quoted ETags.
    return S3Store(inner, url=f"s3://bucket/{prefix}", if_match_quotes=True)


def _retrying(prefix: str, shared: dict) -> ObjectStore:
    return Retrying(_memory(prefix, shared), sleep=lambda seconds: None)


@pytest.fixture(params=[_memory, _s3_adapter, _retrying],
                ids=["memstore", "s3-over-obstore-memory", "retrying"])
def opener(request):
    """`opener(prefix)`: a client on `prefix` of one bucket shared within the test."""
    shared: dict = {}
    return lambda prefix="log": request.param(prefix, shared)


@pytest.fixture
def store(opener) -> ObjectStore:
    return opener()


# -- the contract ----------------------------------------------------------------------

def test_each_implementation_is_an_object_store(store):
    assert isinstance(store, ObjectStore)
    assert store.url.endswith("/log")


def test_a_put_is_read_back_whole_and_its_etag_is_the_heads(store):
    etag = store.put("segments/00000000000000000000.log", b"frame bytes")
    assert store.get("segments/00000000000000000000.log") == b"frame bytes"
    meta = store.head("segments/00000000000000000000.log")
    assert (meta.key, meta.size, meta.etag) == ("segments/00000000000000000000.log", 11, etag)
    assert meta.last_modified_us > 0


def test_a_plain_put_replaces_the_object_and_its_etag(store):
    first = store.put("k", b"one")
    second = store.put("k", b"two, longer")
    assert store.get("k") == b"two, longer"
    assert second != first and store.head("k").etag == second


def test_an_empty_object_is_an_object(store):
    store.put("empty", b"")
    assert store.get("empty") == b"" and store.head("empty").size == 0


def test_a_conditional_create_writes_once_and_then_fails_without_writing(store):
    etag = store.put("manifest/00000001", b"generation 1", if_absent=True)
    with pytest.raises(PreconditionFailed) as raised:
        store.put("manifest/00000001", b"someone else's", if_absent=True)
    assert raised.value.key == "manifest/00000001"
    assert store.get("manifest/00000001") == b"generation 1"
    assert store.head("manifest/00000001").etag == etag


def test_a_conditional_overwrite_needs_the_current_etag(store):
    first = store.put("lease", b"epoch 1", if_absent=True)
    second = store.put("lease", b"epoch 2", if_match=first)
    assert store.get("lease") == b"epoch 2" and second != first
    with pytest.raises(PreconditionFailed):  # `first` is stale now
        store.put("lease", b"epoch 3", if_match=first)
    assert store.get("lease") == b"epoch 2"
    assert store.put("lease", b"epoch 3", if_match=second) == store.head("lease").etag


def test_the_twin_compares_etags_quotes_aside_as_aws_does():
    store = MemoryStore()
    etag = store.put("lease", b"epoch 1")
    assert etag.startswith('"') and etag.endswith('"')
    store.put("lease", b"epoch 2", if_match=etag.strip('"'))
    assert store.get("lease") == b"epoch 2"


def test_a_conditional_overwrite_of_a_missing_object_fails_its_condition(store):
    with pytest.raises(PreconditionFailed):
        store.put("lease", b"epoch 1", if_match='"d41d8cd98f00b204e9800998ecf8427e"')
    with pytest.raises(ObjectNotFound):
        store.get("lease")


@pytest.mark.parametrize("options, why", [
    ({"if_absent": True, "if_match": '"x"'}, "not both"),
    ({"if_match": ""}, "if_match must be an ETag string"),
    ({"if_match": 7}, "if_match must be an ETag string"),
])
def test_a_put_with_impossible_conditions_is_refused_before_any_request(store, options, why):
    with pytest.raises(InvalidArgument, match=why):
        store.put("k", b"v", **options)
    with pytest.raises(ObjectNotFound):
        store.head("k")


def test_an_object_over_one_puts_limit_is_refused(store):
    class Huge(bytes):  # claims the size without holding the bytes
        def __len__(self):
            return OBJECT_BYTES_MAX + 1
    with pytest.raises(InvalidArgument, match="at most"):
        store.put("k", Huge(b"x"))


@pytest.mark.parametrize("read", [
    lambda store: store.get("missing"),
    lambda store: store.head("missing"),
    lambda store: store.get_range("missing", 0, 4),
    lambda store: store.get_range("missing", 2, 2),
    lambda store: store.get_ranges("missing", [(0, 4)]),
    lambda store: store.get_ranges("missing", []),
], ids=["get", "head", "get_range", "empty-range", "get_ranges", "no-ranges"])
def test_every_read_of_a_missing_object_is_object_not_found(store, read):
    with pytest.raises(ObjectNotFound) as raised:
        read(store)
    assert raised.value.key == "missing"


@pytest.mark.parametrize("start, end, expected", [
    (0, 4, b"0123"), (3, 7, b"3456"), (0, 10, b"0123456789"),
    (8, 20, b"89"),  # runs past the end: short, as a slice
    (10, 12, b""), (15, 20, b""),  # starts at or past the end: empty
    (5, 5, b""),
])
def test_a_range_reads_like_a_slice(store, start, end, expected):
    store.put("segment", b"0123456789")
    assert store.get_range("segment", start, end) == expected


def test_ranges_come_back_in_the_order_asked_whatever_their_order(store):
    store.put("segment", bytes(range(200)))
    ranges = [(150, 160), (0, 3), (100, 100), (195, 250), (250, 260), (10, 12)]
    assert store.get_ranges("segment", ranges) == [bytes(range(200))[s:e] for s, e in ranges]
    assert store.get_ranges("segment", []) == []


@pytest.mark.parametrize("bad", [(-1, 4), (5, 4), (0.0, 4), (0, True), [0, 4], (0, 1, 2)])
def test_a_malformed_range_is_invalid_argument(store, bad):
    store.put("segment", b"0123456789")
    with pytest.raises(InvalidArgument, match="byte range"):
        store.get_ranges("segment", [bad])
    if isinstance(bad, tuple) and len(bad) == 2:
        with pytest.raises(InvalidArgument, match="byte range"):
            store.get_range("segment", *bad)


def test_list_is_sorted_by_key_and_keys_are_relative(store):
    keys = ["segments/b", "manifest/00000002", "segments/a/deep/er", "manifest/00000010",
            "lease", "segments/a"]
    for key in random.Random(3).sample(keys, len(keys)):
        store.put(key, key.encode())
    listed = store.list()
    assert [meta.key for meta in listed] == sorted(keys)
    assert all(meta.size == len(meta.key) for meta in listed)
    assert [meta.key for meta in store.list("segments")] == [
        "segments/a", "segments/a/deep/er", "segments/b"]


def test_list_matches_whole_folders(store):
    for key in ("seg/1", "segments/1", "seg", "sega"):
        store.put(key, b"x")
    assert [meta.key for meta in store.list("seg")] == ["seg/1"]
    assert store.list("nothing") == []


def test_a_store_sees_only_its_prefix(opener):
    mine, theirs = opener("logs/a"), opener("logs/ab")
    mine.put("k", b"mine")
    theirs.put("k", b"theirs")
    assert mine.get("k") == b"mine" and theirs.get("k") == b"theirs"
    assert [meta.key for meta in mine.list()] == ["k"]
    assert [meta.key for meta in opener("logs").list()] == ["a/k", "ab/k"]


def test_delete_removes_and_a_missing_object_is_no_error(store):
    store.put("k", b"v")
    store.delete("k")
    store.delete("k")
    with pytest.raises(ObjectNotFound):
        store.get("k")
    assert store.list() == []


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", "./a", "a/../b", "a/.", "a\nb", 7])
def test_a_malformed_key_is_invalid_argument_for_every_operation(store, key):
    for call in (lambda: store.put(key, b"v"), lambda: store.get(key),
                 lambda: store.head(key), lambda: store.delete(key),
                 lambda: store.get_range(key, 0, 1), lambda: store.list(key or "/")):
        with pytest.raises(InvalidArgument, match="^key "):
            call()


def test_a_key_longer_than_s3_allows_is_refused(store):
    with pytest.raises(InvalidArgument, match="1024"):
        store.put("k" * 1021, b"v")  # "log/" + 1021 bytes
    store.put("k" * 1020, b"v")


def test_concurrent_conditional_creates_have_exactly_one_winner(opener):
    clients = [opener() for _ in range(8)]
    winners, losers = [], []
    barrier = threading.Barrier(len(clients))

    def race(number: int) -> None:
        barrier.wait()
        try:
            clients[number].put("manifest/00000001", f"writer {number}".encode(),
                                if_absent=True)
            winners.append(number)
        except PreconditionFailed:
            losers.append(number)
    threads = [threading.Thread(target=race, args=(n,)) for n in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1 and len(losers) == len(clients) - 1
    assert clients[0].get("manifest/00000001") == f"writer {winners[0]}".encode()


# -- the twin's own behaviour ----------------------------------------------------------

def test_the_etag_is_s3s_quoted_md5_so_equal_bytes_give_equal_etags():
    store = MemoryStore()
    etag = store.put("a", b"same bytes")
    assert etag == f'"{hashlib.md5(b"same bytes").hexdigest()}"'
    assert store.put("a", b"same bytes") == etag  # an If-Match cannot tell these apart


def test_last_modified_is_the_buckets_clock():
    clock = ManualClock(wall_us=1_000_000)
    store = MemoryStore(MemoryBucket(clock=clock))
    store.put("a", b"1")
    clock.advance(2.5)
    store.put("b", b"2")
    assert [meta.last_modified_us for meta in store.list()] == [1_000_000, 3_500_000]


def test_clients_opened_on_one_named_bucket_share_its_objects():
    buckets: dict[str, MemoryBucket] = {}
    writer = MemoryStore.from_url("memory://shared/logs/one", buckets=buckets)
    reader = MemoryStore.from_url("memory://shared/logs", buckets=buckets)
    other = MemoryStore.from_url("memory://elsewhere/logs/one", buckets=buckets)
    writer.put("k", b"v")
    assert reader.get("one/k") == b"v"
    assert other.list() == [] and sorted(buckets) == ["elsewhere", "shared"]
    assert writer.url == "memory://shared/logs/one"


def test_from_url_takes_only_memory_urls():
    with pytest.raises(InvalidArgument, match="not a memory"):
        MemoryStore.from_url("s3://bucket/prefix")


# -- faults ----------------------------------------------------------------------------

def test_fail_next_fails_that_many_calls_of_that_operation_with_no_effect():
    store = MemoryStore()
    store.fail_next("put", n=2)
    for _ in range(2):
        with pytest.raises(StoreUnavailable, match="injected"):
            store.put("k", b"v")
    with pytest.raises(ObjectNotFound):
        store.get("k")  # neither failed put wrote, and get was not failed
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_fail_next_raises_the_error_asked_for():
    store = MemoryStore()
    store.put("k", b"v")
    store.fail_next("head", error=StoreError)
    store.fail_next("head", error=ObjectNotFound)
    with pytest.raises(StoreError) as raised:
        store.head("k")
    assert type(raised.value) is StoreError and raised.value.key == "k"
    with pytest.raises(ObjectNotFound):
        store.head("k")
    assert store.head("k").size == 1


def test_an_unknown_operation_is_refused():
    with pytest.raises(InvalidArgument, match="unknown store operation 'write'"):
        MemoryStore().fail_next("write")
    with pytest.raises(InvalidArgument):
        MemoryStore().lose_response_next("fsync")


def _outcomes(store: MemoryStore, calls: int) -> list[bool]:
    """True for each of `calls` gets that failed."""
    failed = []
    for _ in range(calls):
        try:
            store.get("k")
            failed.append(False)
        except StoreUnavailable:
            failed.append(True)
    return failed


def test_the_failure_rate_replays_from_its_seed():
    def run(seed: int) -> list[bool]:
        store = MemoryStore(seed=seed, failure_rate=0.3)
        store.bucket.put("k", b"v", if_absent=False, if_match=None)
        return _outcomes(store, 200)
    first = run(11)
    assert first == run(11) and first != run(12)
    assert 30 <= sum(first) <= 90  # about 60 of 200


def test_a_failure_rate_of_zero_never_fails_and_of_one_always_does():
    store = MemoryStore(failure_rate=1.0)
    store.bucket.put("k", b"v", if_absent=False, if_match=None)
    assert all(_outcomes(store, 20))
    store.failure_rate = 0.0
    assert not any(_outcomes(store, 20))


def test_slow_sleeps_before_every_call_through_the_injected_sleep():
    slept: list[float] = []
    store = MemoryStore(sleep=slept.append)
    store.put("k", b"v")
    store.slow(0.25)
    store.get("k")
    store.head("k")
    assert slept == [0.25, 0.25]
    store.slow(0)
    store.list()
    assert slept == [0.25, 0.25]


def test_a_lost_response_took_effect_but_raised():
    store = MemoryStore()
    store.lose_response_next("put")
    with pytest.raises(StoreUnavailable, match="response was lost"):
        store.put("k", b"v", if_absent=True)
    assert store.get("k") == b"v"
    with pytest.raises(PreconditionFailed):  # the retry meets its own write
        store.put("k", b"v", if_absent=True)


def test_a_lost_delete_response_deleted():
    store = MemoryStore()
    store.put("k", b"v")
    store.lose_response_next("delete")
    with pytest.raises(StoreUnavailable):
        store.delete("k")
    with pytest.raises(ObjectNotFound):
        store.get("k")


def test_a_store_that_is_down_fails_every_call_until_up():
    store = MemoryStore()
    store.put("k", b"v")
    store.down()
    for call in (lambda: store.get("k"), lambda: store.put("j", b"w"),
                 lambda: store.list(), lambda: store.delete("k")):
        with pytest.raises(StoreUnavailable, match="down"):
            call()
    store.up()
    assert [meta.key for meta in store.list()] == ["k"]


def test_flip_bit_damages_the_bytes_but_not_the_etag():
    store = MemoryStore(prefix="log")
    etag = store.put("segment", b"\x00\x00\x00")
    store.flip_bit("segment", 1, bit=3)
    assert store.get("segment") == b"\x00\x08\x00"
    assert store.head("segment").etag == etag
    assert store.calls["put"] == 1 and sum(store.calls.values()) == 3  # flip is no call
    with pytest.raises(InvalidArgument, match="no byte at position 3"):
        store.flip_bit("segment", 3)
    with pytest.raises(ObjectNotFound):
        store.flip_bit("missing", 0)


def test_remove_deletes_behind_the_clients_back():
    store = MemoryStore()
    store.put("k", b"v")
    store.remove("k")
    assert store.calls["delete"] == 0
    with pytest.raises(ObjectNotFound):
        store.get("k")
    with pytest.raises(ObjectNotFound):
        store.remove("k")


def test_calls_and_errors_are_counted_per_operation():
    store = MemoryStore()
    store.put("k", b"v")
    store.fail_next("get")
    with pytest.raises(StoreUnavailable):
        store.get("k")
    store.get("k")
    with pytest.raises(ObjectNotFound):
        store.head("missing")
    with pytest.raises(InvalidArgument):
        store.head("")  # refused before it is a call
    assert store.calls == {"put": 1, "get": 2, "head": 1}
    assert store.errors == {"get": 1, "head": 1}
