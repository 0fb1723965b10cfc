"""The object store port: what the log asks of S3 (or of its in-memory twin), and the
retrying wrapper in front of it.

Strategy: the log needs few things from a store (DESIGN 11): write an object once, or
replace it only if nobody else did (the manifest, the writer's lease); read it whole
or by byte ranges (segments, their indexes); list a folder; delete. `ObjectStore` says
exactly that and no more, with S3's semantics, so the in-memory twin
(streamlog/testing/memstore.py) and the real one (s3.py) can be held to one contract
by the same tests. Calls are synchronous: the partition's writer is a thread.

Keys are relative: a store is opened on `s3://BUCKET/PREFIX` and joins every key under
PREFIX itself (`KeySpace`), so the log never spells its location. A key is folders and
a name joined by "/", each part non-empty and not "." or "..": what S3 and obstore
both take as it is.

Errors (streamlog/errors.py): `ObjectNotFound`, `PreconditionFailed` (a conditional
write lost), `StoreUnavailable` (5xx, throttling, timeouts, connections: try again)
and `StoreError` for the rest. Only `StoreUnavailable` is worth retrying, and
`Retrying` is where that happens, with exponential backoff and full jitter
(AWS Architecture Blog, "Exponential Backoff And Jitter"): each wait is uniform in
[0, min(delay_max_s, delay_base_s * 2**(retry - 1))], so clients that failed together
do not come back together. Retrying a write whose response was lost is what makes a
conditional write subtle; `Retrying.put` says how it stays idempotent.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import re
import threading
import time
from typing import Callable, NamedTuple, Protocol, TypeVar, runtime_checkable

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import InvalidArgument, ObjectNotFound, PreconditionFailed, StoreUnavailable

# S3's limits: a key is at most 1024 bytes of UTF-8 (prefix included); one PUT carries
# at most 5 GiB. Objects are always written in one PUT (never multipart), so that a
# conditional write is one atomic request.
KEY_BYTES_MAX = 1024
OBJECT_BYTES_MAX = 5 * 2**30
SCHEMES = ("s3", "memory")

T = TypeVar("T")


class ObjectMeta(NamedTuple):
    """What the store says about one object. `etag` is the store's opaque version tag
    as it gave it (S3: quotes included), what `put(..., if_match=)` takes back;
    `last_modified_us` is the store's clock, microseconds since the Unix epoch."""

    key: str
    size: int
    etag: str
    last_modified_us: int


@runtime_checkable
class ObjectStore(Protocol):
    """An object store under one prefix, with S3's semantics.

    Every method may raise StoreUnavailable (try again later: a write may or may not
    have taken effect) or StoreError (no retry helps); InvalidArgument for a malformed
    key or range, before any request. Thread-safe: the writer thread and readers share
    one store.
    """

    url: str  # where it is: "s3://BUCKET/PREFIX", for messages

    def put(self, key: str, data: bytes, *, if_absent: bool = False,
            if_match: str | None = None) -> str:
        """Write `data` as the whole object `key`, atomically; returns its new ETag.

        `if_absent` (If-None-Match: *) writes only when no object has the key;
        `if_match` (If-Match) only when the object's ETag is that one. Either condition
        failing raises PreconditionFailed (a missing object fails `if_match` too); at
        most one of the two may be given. Without either, the write replaces any
        object. Objects are limited to OBJECT_BYTES_MAX bytes."""

    def get(self, key: str) -> bytes:
        """The whole object. Raises ObjectNotFound."""

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object: shorter when the object ends first (empty
        when it ends at or before `start`), as a slice would be, so a caller that needs
        them all checks the length. Raises ObjectNotFound."""

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """`get_range` for each (start, end), in order, in as few requests as the store
        can (nearby ranges are fetched together). Raises ObjectNotFound, whatever the
        ranges (an empty list included)."""

    def head(self, key: str) -> ObjectMeta:
        """The object's size, ETag and modification time. Raises ObjectNotFound."""

    def list(self, prefix: str = "") -> list[ObjectMeta]:
        """Every object under the folder `prefix` ("" for all), at any depth, sorted by
        key. Folders are matched whole: "seg" lists "seg/a" but not "segments/a"."""

    def delete(self, key: str) -> None:
        """Remove the object; a missing one is not an error (S3 does not say)."""


# -- URLs and keys ---------------------------------------------------------------------

class StoreURL(NamedTuple):
    scheme: str  # "s3" or "memory"
    bucket: str  # the bucket (s3) or the in-memory bucket's name (memory)
    prefix: str  # "" or folders joined by "/", no slash at either end


_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<bucket>[^/]*)(?P<path>.*)\Z",
                  re.DOTALL)
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def parse_url(url: str) -> StoreURL:
    """`s3://BUCKET/PREFIX` or `memory://NAME/PREFIX` -> (scheme, bucket, prefix).

    The prefix may be empty (the bucket's root) and may end with one "/". Raises
    InvalidArgument for any other form: another scheme, no bucket, a query, a
    fragment, credentials in the URL, an empty, "." or ".." folder."""
    if not isinstance(url, str):
        raise InvalidArgument(f"an object store URL is a string, not {type(url).__name__}")
    match = _URL.match(url)
    if match is None or match["scheme"] not in SCHEMES:
        raise InvalidArgument(f"unsupported object store URL {url!r}: expected "
                              f"s3://BUCKET/PREFIX (or memory://NAME/PREFIX for the "
                              f"in-memory store)")
    if not _BUCKET.match(match["bucket"]):
        raise InvalidArgument(f"object store URL {url!r} has no valid bucket name "
                              f"(letters, digits, '.', '-' and '_')")
    path = match["path"]
    if "?" in path or "#" in path:
        raise InvalidArgument(f"object store URL {url!r} has a query or fragment; "
                              f"options go in storage_options")
    prefix = path.removeprefix("/").removesuffix("/")
    if prefix:
        check_key(prefix, what=f"the prefix of {url!r}")
    return StoreURL(match["scheme"], match["bucket"], prefix)


def check_key(key: str, *, what: str = "key") -> None:
    """Raise InvalidArgument unless `key` is folders and a name joined by "/"."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{what} must be a non-empty string, not {key!r}")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidArgument(f"{what} {key!r} has an empty, '.' or '..' part; "
                                  f"parts are joined by single slashes")
        if any(ord(char) < 0x20 or ord(char) == 0x7F for char in part):
            raise InvalidArgument(f"{what} {key!r} has a control character")


def check_ranges(ranges: list[tuple[int, int]]) -> None:
    """Raise InvalidArgument unless each range is two ints with 0 <= start <= end."""
    for item in ranges:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise InvalidArgument(f"a byte range is a (start, end) tuple, not {item!r}")
        start, end = item
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (start, end)):
            raise InvalidArgument(f"byte range {item!r} must be two ints")
        if not 0 <= start <= end:
            raise InvalidArgument(f"byte range {item!r} must have 0 <= start <= end")


def check_put(data, *, if_absent: bool, if_match: str | None) -> None:
    """Raise InvalidArgument for a put no store would take."""
    if if_absent and if_match is not None:
        raise InvalidArgument("a put is conditional on the object being absent or on "
                              "its ETag, not both")
    if if_match is not None and (not isinstance(if_match, str) or not if_match):
        raise InvalidArgument(f"if_match must be an ETag string, not {if_match!r}")
    if len(data) > OBJECT_BYTES_MAX:
        raise InvalidArgument(f"an object is at most {OBJECT_BYTES_MAX} bytes (one PUT); "
                              f"got {len(data)}")


class KeySpace:
    """The keys of one store: relative keys joined under its prefix, and back."""

    def __init__(self, prefix: str) -> None:
        assert not prefix.startswith("/") and not prefix.endswith("/"), prefix
        self.prefix = prefix

    def full(self, key: str) -> str:
        """The bucket's key for `key`. Raises InvalidArgument for a malformed key."""
        check_key(key)
        full = f"{self.prefix}/{key}" if self.prefix else key
        if len(full.encode()) > KEY_BYTES_MAX:
            raise InvalidArgument(f"key {full!r} is longer than {KEY_BYTES_MAX} bytes")
        return full

    def folder(self, prefix: str) -> str:
        """The bucket's folder for a `list(prefix)`: "" is the store's own folder."""
        if prefix == "":
            return self.prefix
        return self.full(prefix)

    def relative(self, full: str) -> str:
        """The relative key of a bucket key under this prefix."""
        if not self.prefix:
            return full
        assert full.startswith(self.prefix + "/"), (full, self.prefix)
        return full[len(self.prefix) + 1:]

    def under(self, full: str, folder: str) -> bool:
        """Is bucket key `full` in bucket folder `folder` ("" is everything)?"""
        return folder == "" or full.startswith(folder + "/")


# -- retrying --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long one call may keep trying a store that cannot answer now.

    attempts_max: attempts per call, the first included (1: never retry); the reads
        with which a put checks what it wrote after a lost response count too.
    delay_base_s: the cap of the first wait; each later cap doubles...
    delay_max_s: ...up to this.
    deadline_s: no attempt starts later than this after the call began; an attempt
        in flight is not cut short (the HTTP client's own timeout bounds it).
    """

    attempts_max: int = 10
    delay_base_s: float = 0.1
    delay_max_s: float = 5.0
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        if (not isinstance(self.attempts_max, int) or isinstance(self.attempts_max, bool)
                or self.attempts_max < 1):
            raise InvalidArgument(f"attempts_max must be an int >= 1, not "
                                  f"{self.attempts_max!r}")
        for name in ("delay_base_s", "delay_max_s", "deadline_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise InvalidArgument(f"{name} must be a number of seconds >= 0, not "
                                      f"{value!r}")


def backoff_delay_s(policy: RetryPolicy, retry: int, rng: random.Random) -> float:
    """The wait before retry number `retry` (1 = the first retry): full jitter."""
    assert retry >= 1, retry
    cap_s = min(policy.delay_max_s, policy.delay_base_s * 2 ** min(retry - 1, 62))
    return rng.uniform(0.0, cap_s)


class _Budget:
    """One call's attempts and its start, shared by every request the call makes."""

    __slots__ = ("started_s", "failures")

    def __init__(self, started_s: float) -> None:
        self.started_s = started_s
        self.failures = 0  # attempts that raised StoreUnavailable


class Retrying:
    """An ObjectStore that retries StoreUnavailable on `store` under `policy`.

    PreconditionFailed and ObjectNotFound are answers, not failures: never retried.
    When the attempts or the deadline run out, the last StoreUnavailable is raised.
    `sleep`, `rng` and `clock` are injected so tests see every wait and need not wait.
    Thread-safe when `store` is: a call's attempts and start live in the call.
    """

    def __init__(self, store: ObjectStore, policy: RetryPolicy = RetryPolicy(), *,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.policy = policy
        self.url = store.url
        # requests by operation (each attempt counts), and attempts that failed
        # (StoreUnavailable): what /metrics shows
        self.requests: collections.Counter = collections.Counter()
        self.failures: collections.Counter = collections.Counter()
        self._counts_lock = threading.Lock()
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock

    def put(self, key: str, data: bytes, *, if_absent: bool = False,
            if_match: str | None = None) -> str:
        """`ObjectStore.put`, retried, and idempotent under lost responses.

        A PUT whose response was lost may have taken effect. For a plain put a retry
        just writes the same bytes again. A conditional one cannot: its retry finds the
        object it wrote itself and fails its condition. So when a retry of a
        conditional put raises PreconditionFailed after an attempt of this call raised
        StoreUnavailable, the object is read back, and if it holds exactly `data` the
        put succeeded: its ETag is returned. That is what makes a conditional create
        (and a conditional overwrite) idempotent. It relies on the bytes naming their
        writer (a manifest carries the writer's epoch): another writer's identical
        bytes would pass for ours, and since they are identical, nothing is lost.
        """
        budget = self._budget()
        try:
            return self._attempt(budget, lambda: self.store.put(
                key, data, if_absent=if_absent, if_match=if_match), "put")
        except PreconditionFailed:
            conditional = if_absent or if_match is not None
            if not conditional or budget.failures == 0:
                raise
            etag = self._etag_if_holding(budget, key, data)
            if etag is None:
                raise
            return etag

    def get(self, key: str) -> bytes:
        return self._attempt(self._budget(), lambda: self.store.get(key), "get")

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._attempt(self._budget(), lambda: self.store.get_range(key, start, end),
                             "get")

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        return self._attempt(self._budget(), lambda: self.store.get_ranges(key, ranges),
                             "get")

    def head(self, key: str) -> ObjectMeta:
        return self._attempt(self._budget(), lambda: self.store.head(key), "head")

    def list(self, prefix: str = "") -> list[ObjectMeta]:
        return self._attempt(self._budget(), lambda: self.store.list(prefix), "list")

    def delete(self, key: str) -> None:
        return self._attempt(self._budget(), lambda: self.store.delete(key), "delete")

    # -- the loop ------------------------------------------------------------------------

    def _budget(self) -> _Budget:
        return _Budget(self._clock.monotonic_s())

    def _attempt(self, budget: _Budget, call: Callable[[], T], operation: str) -> T:
        while True:
            with self._counts_lock:
                self.requests[operation] += 1
            try:
                return call()
            except StoreUnavailable:
                with self._counts_lock:
                    self.failures[operation] += 1
                budget.failures += 1
                delay_s = self._delay_s(budget)
                if delay_s is None:
                    raise  # out of attempts or of time: the last failure is the answer
                self._sleep(delay_s)

    def _delay_s(self, budget: _Budget) -> float | None:
        """The wait before the next attempt, or None when the call must give up."""
        if budget.failures >= self.policy.attempts_max:
            return None
        remaining_s = self.policy.deadline_s - (self._clock.monotonic_s() - budget.started_s)
        if remaining_s <= 0:
            return None
        return min(backoff_delay_s(self.policy, budget.failures, self._rng), remaining_s)

    def _etag_if_holding(self, budget: _Budget, key: str, data: bytes) -> str | None:
        """The object's ETag if it holds exactly `data`, else None (gone, or other
        bytes). The size is compared first, so a mismatch costs no download."""
        try:
            meta = self._attempt(budget, lambda: self.store.head(key), "head")
            if meta.size != len(data):
                return None
            stored = self._attempt(budget, lambda: self.store.get(key), "get")
        except ObjectNotFound:
            return None
        return meta.etag if stored == bytes(data) else None

