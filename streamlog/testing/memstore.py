"""An in-memory object store with injected faults: the twin of remote/s3.py.

Strategy: two objects, as in the real world. A `MemoryBucket` is the server: the
objects, with S3's semantics (ETags, conditional writes, last-modified times from an
injected clock). A `MemoryStore` is one client of it, opened on a prefix: the whole
`ObjectStore` protocol (streamlog/remote/store.py) plus the faults a test injects into
what this client sees, as TigerBeetle's `src/testing/storage.zig` does for a disk.
Two writers of one log are two MemoryStores on one MemoryBucket, each with its own
faults; `MemoryStore.from_url("memory://NAME/PREFIX", buckets=...)` finds or makes the
bucket NAME in a dict the test keeps.

S3, as modelled: a put is atomic and replaces the whole object; `if_absent` fails
with PreconditionFailed when any object has the key (If-None-Match: *), `if_match`
when the object's ETag differs (quotes aside, as AWS compares) or there is no object
(If-Match). An ETag is the quoted MD5 of the bytes, as S3 gives for a single-part
upload: writing the same bytes again gives the same ETag, so an `if_match` cannot tell
the two writes apart (as on S3). Lists are sorted by key and match whole folders,
reads past the end are short.

Faults, in the order a call meets them (each call counts in `calls[operation]` first,
each error it raises in `errors[operation]`):

    slow(seconds)                 every call sleeps first (through the injected sleep)
    down() / up()                 while down, every call raises StoreUnavailable
    fail_next(operation, n, E)    the next n calls of `operation` raise E, no effect
    failure_rate (seeded rng)     each call raises StoreUnavailable with this chance
    lose_response_next(op, n)     the next n calls of `op` take effect, then raise
                                  StoreUnavailable, as if the response was lost

and behind the client's back (not calls, not counted): `flip_bit(key, position)`
(media damage: the ETag stays, as the store computed it at upload) and `remove(key)`.

Thread-safety: the bucket's lock serialises the objects, the client's lock its faults
and counters; a slow call sleeps holding neither.
"""

from __future__ import annotations

import collections
import hashlib
import random
import threading
import time
from typing import Callable, NamedTuple

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import (InvalidArgument, ObjectNotFound, PreconditionFailed, StoreError,
                      StoreUnavailable)
from ..remote.store import (KeySpace, ObjectMeta, check_put, check_ranges, parse_url)

OPERATIONS = ("put", "get", "get_range", "get_ranges", "head", "list", "delete")


class _Object(NamedTuple):
    data: bytes
    etag: str
    last_modified_us: int


class MemoryBucket:
    """The objects of one in-memory bucket: the server every MemoryStore on it shares.
    Keys here are the bucket's (prefix included); its errors say why, and the client
    that made the call says which key of its own it was about."""

    def __init__(self, name: str = "memory", *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._objects: dict[str, _Object] = {}

    def put(self, key: str, data: bytes, *, if_absent: bool, if_match: str | None) -> str:
        data = bytes(data)
        with self._lock:
            current = self._objects.get(key)
            if if_absent and current is not None:
                raise PreconditionFailed("an object already has this key (If-None-Match)")
            if if_match is not None and (current is None
                                         or current.etag.strip('"') != if_match.strip('"')):
                found = "there is no object" if current is None else f"its ETag is {current.etag}"
                raise PreconditionFailed(f"{found}, not {if_match} (If-Match)")
            etag = f'"{hashlib.md5(data).hexdigest()}"'
            self._objects[key] = _Object(data, etag, self._clock.wall_us())
            return etag

    def object(self, key: str) -> _Object:
        with self._lock:
            found = self._objects.get(key)
        if found is None:
            raise ObjectNotFound("no such object")
        return found

    def keys(self, folder: str) -> list[str]:
        """The bucket keys in `folder` ("" for all), sorted."""
        with self._lock:
            keys = list(self._objects)
        return sorted(key for key in keys if folder == "" or key.startswith(folder + "/"))

    def delete(self, key: str) -> bool:
        """Remove `key`; True when there was an object."""
        with self._lock:
            return self._objects.pop(key, None) is not None

    def flip_bit(self, key: str, position: int, bit: int) -> None:
        assert 0 <= bit < 8, bit
        with self._lock:
            found = self._objects.get(key)
            if found is None:
                raise ObjectNotFound("no such object")
            if not 0 <= position < len(found.data):
                raise InvalidArgument(f"object {key!r} has no byte at position {position}")
            damaged = bytearray(found.data)
            damaged[position] ^= 1 << bit
            self._objects[key] = found._replace(data=bytes(damaged))


class MemoryStore:
    """One client of a MemoryBucket, on a prefix, with injected faults.

    Args:
        bucket: the server (a new one when None).
        prefix: folders every key is joined under ("" for the bucket's root).
        seed: seeds the rng that `failure_rate` draws from, so a run replays.
        failure_rate: the chance that a call raises StoreUnavailable (0 to 1).
        sleep: what `slow` sleeps with (tests pass a fake that moves a clock).
    """

    def __init__(self, bucket: MemoryBucket | None = None, *, prefix: str = "",
                 seed: int = 0, failure_rate: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.bucket = bucket if bucket is not None else MemoryBucket()
        self._keys = KeySpace(prefix)
        self.url = f"memory://{self.bucket.name}/{prefix}".removesuffix("/")
        self.failure_rate = failure_rate
        self.calls: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self._rng = random.Random(seed)
        self._sleep = sleep
        self._lock = threading.Lock()
        self._delay_s = 0.0
        self._down = False
        self._failures: dict[str, collections.deque[type[Exception]]] = {
            operation: collections.deque() for operation in OPERATIONS}
        self._lost_responses: collections.Counter[str] = collections.Counter()

    @classmethod
    def from_url(cls, url: str, *, buckets: dict[str, MemoryBucket] | None = None,
                 **options) -> MemoryStore:
        """A client of bucket NAME of `memory://NAME/PREFIX`: the one in `buckets` (a
        dict the test keeps, so clients share it), made and added when missing."""
        scheme, name, prefix = parse_url(url)
        if scheme != "memory":
            raise InvalidArgument(f"{url!r} is not a memory:// URL")
        buckets = {} if buckets is None else buckets
        bucket = buckets.setdefault(name, MemoryBucket(name))
        return cls(bucket, prefix=prefix, **options)

    # -- faults ------------------------------------------------------------------------

    def fail_next(self, operation: str, n: int = 1,
                  error: type[Exception] = StoreUnavailable) -> None:
        """The next `n` calls of `operation` raise `error` and change nothing."""
        _check_operation(operation)
        assert n >= 0 and issubclass(error, Exception), (n, error)
        with self._lock:
            self._failures[operation].extend([error] * n)

    def lose_response_next(self, operation: str = "put", n: int = 1) -> None:
        """The next `n` calls of `operation` take effect, then raise StoreUnavailable."""
        _check_operation(operation)
        assert n >= 0, n
        with self._lock:
            self._lost_responses[operation] += n

    def slow(self, seconds: float) -> None:
        """Every call sleeps `seconds` first (0: no more)."""
        assert seconds >= 0, seconds
        self._delay_s = seconds

    def down(self) -> None:
        """Every call raises StoreUnavailable until `up()`."""
        self._down = True

    def up(self) -> None:
        self._down = False

    def flip_bit(self, key: str, position: int, bit: int = 0) -> None:
        """Flip bit `bit` of byte `position` of the object, behind the client's back."""
        try:
            self.bucket.flip_bit(self._keys.full(key), position, bit)
        except ObjectNotFound:
            raise ObjectNotFound(f"no object {key!r} in {self.url} to damage",
                                 key=key) from None

    def remove(self, key: str) -> None:
        """Delete the object behind the client's back (another process, a lifecycle
        rule). Raises ObjectNotFound when there is none: the test meant one."""
        if not self.bucket.delete(self._keys.full(key)):
            raise ObjectNotFound(f"no object {key!r} in {self.url} to remove", key=key)

    # -- the ObjectStore protocol ------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False,
            if_match: str | None = None) -> str:
        full = self._keys.full(key)
        check_put(data, if_absent=if_absent, if_match=if_match)
        return self._call("put", key, lambda: self.bucket.put(
            full, data, if_absent=if_absent, if_match=if_match))

    def get(self, key: str) -> bytes:
        full = self._keys.full(key)
        return self._call("get", key, lambda: self.bucket.object(full).data)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        full = self._keys.full(key)
        check_ranges([(start, end)])
        return self._call("get_range", key, lambda: self.bucket.object(full).data[start:end])

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        full = self._keys.full(key)
        ranges = list(ranges)
        check_ranges(ranges)

        def read() -> list[bytes]:
            data = self.bucket.object(full).data
            return [data[start:end] for start, end in ranges]
        return self._call("get_ranges", key, read)

    def head(self, key: str) -> ObjectMeta:
        full = self._keys.full(key)

        def meta() -> ObjectMeta:
            found = self.bucket.object(full)
            return ObjectMeta(key, len(found.data), found.etag, found.last_modified_us)
        return self._call("head", key, meta)

    def list(self, prefix: str = "") -> list[ObjectMeta]:
        folder = self._keys.folder(prefix)

        def listing() -> list[ObjectMeta]:
            found = []
            for full in self.bucket.keys(folder):
                try:
                    item = self.bucket.object(full)
                except ObjectNotFound:
                    continue  # deleted between the two looks, as a list may miss it
                found.append(ObjectMeta(self._keys.relative(full), len(item.data),
                                        item.etag, item.last_modified_us))
            return found
        return self._call("list", None, listing)

    def delete(self, key: str) -> None:
        full = self._keys.full(key)

        def remove() -> None:
            self.bucket.delete(full)  # a missing object is no error (S3 does not say)
        self._call("delete", key, remove)

    # -- the faults, around each call --------------------------------------------------

    def _call(self, operation: str, key: str | None, run: Callable):
        """Run one call through the faults, in the order the module's table gives."""
        with self._lock:
            self.calls[operation] += 1
            delay_s = self._delay_s
        if delay_s:
            self._sleep(delay_s)
        try:
            self._maybe_fail(operation, key)
            try:
                result = run()
            except (ObjectNotFound, PreconditionFailed) as answer:  # the bucket's: name our key
                raise type(answer)(f"{operation} {key!r} in {self.url}: {answer}",
                                   key=key) from None
            self._maybe_lose_response(operation, key)
            return result
        except Exception:
            with self._lock:
                self.errors[operation] += 1
            raise

    def _maybe_lose_response(self, operation: str, key: str | None) -> None:
        with self._lock:
            lost = self._lost_responses[operation] > 0
            if lost:
                self._lost_responses[operation] -= 1
        if lost:
            raise StoreUnavailable(f"{operation} {key!r} in {self.url}: the response was "
                                   f"lost (injected; the call took effect)", key=key)

    def _maybe_fail(self, operation: str, key: str | None) -> None:
        """Raise the injected failure this call meets, if any (it then has no effect)."""
        error: type[Exception] = StoreUnavailable
        with self._lock:
            if self._down:
                why = "the store is down (injected)"
            elif self._failures[operation]:
                error, why = self._failures[operation].popleft(), "injected failure"
            elif self.failure_rate and self._rng.random() < self.failure_rate:
                why = f"injected failure (rate {self.failure_rate})"
            else:
                return
        message = f"{operation} {key!r} in {self.url}: {why}"
        raise error(message, key=key) if issubclass(error, StoreError) else error(message)


def _check_operation(operation: str) -> None:
    if operation not in OPERATIONS:
        raise InvalidArgument(f"unknown store operation {operation!r}; one of "
                              f"{', '.join(OPERATIONS)}")
