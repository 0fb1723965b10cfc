"""The ObjectStore port over S3 (and S3-compatible stores: Ceph's RADOS Gateway, MinIO),
through obstore's synchronous API.

Strategy: obstore (Rust's object_store underneath) does the HTTP, the signing and the
conditional headers; this module fixes how it is configured and turns its answers
into the port's (remote/store.py). `S3Store.from_url("s3://BUCKET/PREFIX",
storage_options)` builds obstore's S3Store; `S3Store(inner, url=...)` wraps any obstore
store, which is how the tests run this module over obstore's in-memory store with no
network.

Configuration (`s3_options`, pure): the standard AWS variables (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), then `storage_options` over
them, passed through to obstore (its S3 config keys; HTTP client keys such as
`timeout` go to its client options). obstore reads the other AWS_* variables
(AWS_SESSION_TOKEN, ...) itself. Two choices are made here:

  * path-style requests (`virtual_hosted_style_request=False`): the bucket goes in the
    path, not the host name, which Ceph RGW and MinIO need (no wildcard DNS);
  * `allow_http` is set when the endpoint is plain http:// (a local RGW in the tests):
    obstore refuses http otherwise. Saying `allow_http=False` with such an endpoint is
    an InvalidArgument, not a request that fails later.

An `if_match` ETag is sent without its quotes: AWS compares If-Match with or without
them, but Ceph RGW (16.2) and DigitalOcean Spaces compare the header as sent with the
unquoted stored ETag, so only the bare form works everywhere.

obstore's own retries are off (`max_retries=0`): `Retrying` decides when to try again
and for how long, with jitter and a deadline the caller chose; and a conditional put
that obstore retried after a lost response would come back as a PreconditionFailed
that Retrying could not tell from a real one (it reads the object back only after a
failure it saw). Objects are
written in one PUT (`use_multipart=False`): a multipart upload is not one conditional
request, and its ETag is not the bytes' MD5.

Errors (`translate_error`): a missing object is ObjectNotFound; a lost condition
(412, or obstore's AlreadyExists for a create) is PreconditionFailed; 5xx, 408, 429,
SlowDown, 409 (S3: a conflicting conditional write was in flight, retry) and
transport failures (refused or dropped connections, timeouts, a cut body) are
StoreUnavailable; the rest (403, other 4xx, a malformed answer) is StoreError. obstore
raises most of these as one GenericError, so the HTTP status is read from its message
("Server returned non-2xx status code: 503 ..."); the messages' forms are pinned by
tests against a loopback server (tests/integration/test_s3_store.py).
"""

from __future__ import annotations

import datetime
import os
import re
from typing import Any, Mapping, NamedTuple

import obstore
import obstore.exceptions
import obstore.store

from ..errors import (InvalidArgument, ObjectNotFound, PreconditionFailed, StoreError,
                      StoreUnavailable)
from .store import KeySpace, ObjectMeta, check_put, check_ranges, parse_url

# The standard AWS variables, and the obstore S3 config key each one sets.
ENVIRONMENT = (("AWS_ENDPOINT_URL", "endpoint"), ("AWS_ACCESS_KEY_ID", "access_key_id"),
               ("AWS_SECRET_ACCESS_KEY", "secret_access_key"), ("AWS_REGION", "region"))
# obstore's HTTP client options (its ClientConfig): these go to `client_options`,
# every other key of storage_options to its S3 config.
CLIENT_OPTIONS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "default_headers", "disable_system_certificates", "http1_only",
    "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle",
    "http2_max_frame_size", "http2_only", "pool_idle_timeout", "pool_max_idle_per_host",
    "proxy_url", "proxy_ca_certificate", "proxy_excludes", "randomize_addresses",
    "read_timeout", "root_certificate", "timeout", "user_agent"})
# Other spellings obstore takes for the keys this module reads or sets, so that one
# setting never arrives twice under two names.
ALIASES = {"aws_endpoint": "endpoint", "aws_endpoint_url": "endpoint",
           "endpoint_url": "endpoint", "aws_access_key_id": "access_key_id",
           "aws_secret_access_key": "secret_access_key", "aws_region": "region",
           "aws_allow_http": "allow_http",
           "aws_virtual_hosted_style_request": "virtual_hosted_style_request"}
RETRY_CONFIG = {"max_retries": 0}
LIST_CHUNK_OBJECTS = 1000  # objects per list chunk: S3's page size
MESSAGE_CHARS_MAX = 600

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_STATUS = re.compile(r"status code: (\d{3})")


class S3Options(NamedTuple):
    """What obstore's S3Store is built from."""

    bucket: str
    prefix: str
    config: dict[str, Any]
    client_options: dict[str, Any]


def s3_options(url: str, storage_options: Mapping[str, Any] | None = None, *,
               environ: Mapping[str, str] | None = None) -> S3Options:
    """The obstore configuration for `url`: the AWS variables of `environ` (default
    os.environ), then `storage_options`, then path-style requests and allow_http as
    the module says. Raises InvalidArgument for another scheme, a bucket option that
    the URL already names, or http with allow_http off."""
    scheme, bucket, prefix = parse_url(url)
    if scheme != "s3":
        raise InvalidArgument(f"{url!r} is not an s3:// URL")
    environ = os.environ if environ is None else environ
    config: dict[str, Any] = {"virtual_hosted_style_request": False}
    config.update({name: environ[variable] for variable, name in ENVIRONMENT
                   if environ.get(variable)})
    client: dict[str, Any] = {}
    for name, value in (storage_options or {}).items():
        name = ALIASES.get(name.lower(), name.lower())
        if name in ("bucket", "aws_bucket", "aws_bucket_name", "bucket_name"):
            raise InvalidArgument(f"storage option {name!r}: the URL {url!r} names the "
                                  f"bucket")
        (client if name in CLIENT_OPTIONS else config)[name] = value
    endpoint = str(config.get("endpoint", ""))
    if endpoint.lower().startswith("http://"):
        if "allow_http" in client and not _true(client["allow_http"]):
            raise InvalidArgument(f"endpoint {endpoint} is plain http but allow_http "
                                  f"is off; use https or allow_http=True")
        client["allow_http"] = True
    elif "allow_http" in client:
        client["allow_http"] = _true(client["allow_http"])
    return S3Options(bucket, prefix, config, client)


def bare_etag(etag: str) -> str:
    """`etag` without the double quotes around it (a weak "W/" one is left alone)."""
    if len(etag) >= 2 and etag[0] == etag[-1] == '"':
        return etag[1:-1]
    return etag


def _true(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise InvalidArgument(f"allow_http must be true or false, not {value!r}")


class S3Store:
    """The ObjectStore port over an obstore store, on the prefix of `url`.

    `if_match_quotes`: send an `if_match` ETag as given, quotes and all, for a store
    that compares the header verbatim with quoted ETags (obstore's in-memory store);
    S3 stores get it bare (the module says why).

    Thread-safe: obstore's stores are, and this keeps no state of its own.
    """

    def __init__(self, inner: Any, *, url: str, if_match_quotes: bool = False) -> None:
        scheme, bucket, prefix = parse_url(url)
        self.url = f"{scheme}://{bucket}/{prefix}".removesuffix("/")
        self.inner = inner
        self._keys = KeySpace(prefix)
        self._if_match_quotes = if_match_quotes

    @classmethod
    def from_url(cls, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 environ: Mapping[str, str] | None = None) -> S3Store:
        """An S3Store on `s3://BUCKET/PREFIX` (see `s3_options`). No request is made:
        a wrong endpoint or credential shows on the first call. Raises
        InvalidArgument for options obstore refuses."""
        options = s3_options(url, storage_options, environ=environ)
        try:
            inner = obstore.store.S3Store(options.bucket, config=options.config,
                                          client_options=options.client_options,
                                          retry_config=RETRY_CONFIG)
        except (obstore.exceptions.BaseError, ValueError) as error:
            raise InvalidArgument(f"cannot open {url}: {_first_line(error)}") from error
        return cls(inner, url=url)

    def put(self, key: str, data: bytes, *, if_absent: bool = False,
            if_match: str | None = None) -> str:
        full = self._keys.full(key)
        check_put(data, if_absent=if_absent, if_match=if_match)
        mode: Any = "overwrite"
        if if_absent:
            mode = "create"
        elif if_match is not None:
            mode = {"e_tag": if_match if self._if_match_quotes else bare_etag(if_match)}
        try:
            result = obstore.put(self.inner, full, data, mode=mode, use_multipart=False)
        except _ERRORS as error:
            raise translate_error(error, where=self._where("put", key), key=key,
                                  put_mode=mode if isinstance(mode, str) else "update"
                                  ) from error
        if not result.get("e_tag"):
            raise StoreError(f"{self._where('put', key)}: the store returned no ETag",
                             key=key)
        return result["e_tag"]

    def get(self, key: str) -> bytes:
        full = self._keys.full(key)
        try:
            return bytes(obstore.get(self.inner, full).bytes())
        except _ERRORS as error:
            raise translate_error(error, where=self._where("get", key), key=key) from error

    def get_range(self, key: str, start: int, end: int) -> bytes:
        full = self._keys.full(key)
        check_ranges([(start, end)])
        if start == end:
            self.head(key)  # the object must exist, as for any read
            return b""
        try:
            return bytes(obstore.get_range(self.inner, full, start=start, end=end))
        except _ERRORS as error:
            if _starts_past_the_end(error):
                return b""  # S3 answers 416 when the object ends at or before `start`
            raise translate_error(error, where=self._where("get_range", key),
                                  key=key) from error

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """`ObjectStore.get_ranges`, after a HEAD: obstore coalesces nearby ranges into
        one GET, and panics (rather than raising) when a range it merged starts past
        the object's end, so every range is cut to the object's size first. (An object
        replaced by a shorter one between the HEAD and the GET can still trip it; the
        log's objects are written once.)"""
        full = self._keys.full(key)
        ranges = list(ranges)
        check_ranges(ranges)
        size = self.head(key).size
        wanted = [(start, min(end, size)) for start, end in ranges if start < min(end, size)]
        fetched: list[bytes] = []
        if wanted:
            try:
                fetched = [bytes(part) for part in obstore.get_ranges(
                    self.inner, full, starts=[start for start, _ in wanted],
                    ends=[end for _, end in wanted])]
            except _ERRORS as error:
                raise translate_error(error, where=self._where("get_ranges", key),
                                      key=key) from error
        parts = iter(fetched)
        return [next(parts) if start < min(end, size) else b"" for start, end in ranges]

    def head(self, key: str) -> ObjectMeta:
        full = self._keys.full(key)
        try:
            raw = obstore.head(self.inner, full)
        except _ERRORS as error:
            raise translate_error(error, where=self._where("head", key), key=key) from error
        return self._meta(raw, key)

    def list(self, prefix: str = "") -> list[ObjectMeta]:
        folder = self._keys.folder(prefix)
        try:
            chunks = obstore.list(self.inner, folder or None, chunk_size=LIST_CHUNK_OBJECTS)
            found = [raw for chunk in chunks for raw in chunk]
        except _ERRORS as error:
            raise translate_error(error, where=self._where("list", prefix or "."),
                                  key=None) from error
        metas = [self._meta(raw, self._keys.relative(raw["path"])) for raw in found
                 if self._keys.under(raw["path"], folder)]
        return sorted(metas, key=lambda meta: meta.key)

    def delete(self, key: str) -> None:
        full = self._keys.full(key)
        try:
            obstore.delete(self.inner, full)
        except _ERRORS as error:
            translated = translate_error(error, where=self._where("delete", key), key=key)
            if not isinstance(translated, ObjectNotFound):
                raise translated from error

    def _where(self, operation: str, key: str) -> str:
        return f"{operation} {key!r} in {self.url}"

    def _meta(self, raw: Mapping[str, Any], key: str) -> ObjectMeta:
        if not raw.get("e_tag"):
            raise StoreError(f"{self._where('head', key)}: the store gave no ETag", key=key)
        modified = raw["last_modified"]
        return ObjectMeta(key, int(raw["size"]), raw["e_tag"],
                          (modified - _EPOCH) // datetime.timedelta(microseconds=1))


# -- errors ----------------------------------------------------------------------------

# What obstore raises for a failed request: its own errors, and FileNotFoundError (an
# OSError) for a missing object.
_ERRORS = (obstore.exceptions.BaseError, OSError)


def http_status(error: BaseException) -> int | None:
    """The HTTP status a failed request got, read from obstore's message; None when
    no response came (a transport failure) or the error is not about one."""
    match = _STATUS.search(str(error))
    return int(match[1]) if match else None


def translate_error(error: BaseException, *, where: str, key: str | None,
                    put_mode: str | None = None) -> StoreError:
    """The port's error for an obstore error. `put_mode` is the request's, for a put:
    "overwrite", or "create" / "update", whose lost condition is PreconditionFailed.
    A put that finds nothing found no bucket (a StoreError, not ObjectNotFound)."""
    message = f"{where}: {_first_line(error)}"
    status = http_status(error)
    text = str(error)
    if isinstance(error, (FileNotFoundError, obstore.exceptions.NotFoundError)):
        return (StoreError if put_mode else ObjectNotFound)(message, key=key)
    if status == 409:  # S3: a conflicting conditional request was in flight; retry
        return StoreUnavailable(message, key=key)
    if isinstance(error, (obstore.exceptions.PreconditionError,
                          obstore.exceptions.AlreadyExistsError)):
        conditional = put_mode in ("create", "update")
        return (PreconditionFailed if conditional else StoreError)(message, key=key)
    if isinstance(error, (obstore.exceptions.PermissionDeniedError,
                          obstore.exceptions.UnauthenticatedError)):
        return StoreError(message, key=key)
    if "SlowDown" in text:  # S3's throttling answer, whatever status a store sends
        transient = True
    elif status is not None:
        transient = status >= 500 or status in (408, 429)
    else:  # no response: refused, reset, timed out, cut short
        transient = "HTTP error" in text or isinstance(error, (ConnectionError, TimeoutError))
    return (StoreUnavailable if transient else StoreError)(message, key=key)


def _starts_past_the_end(error: BaseException) -> bool:
    """A range read that starts at or past the object's end: S3's 416, or obstore's
    own check (its in-memory store)."""
    return http_status(error) == 416 or "StartTooLarge" in str(error)


def _first_line(error: BaseException) -> str:
    """obstore's message without the Rust debug dump it appends."""
    text = str(error).split("\n\nDebug source:", 1)[0].strip()
    text = " ".join(text.split())
    return text[:MESSAGE_CHARS_MAX] or type(error).__name__
