"""The log API, defined once: what a local `Log` and a daemon's `RemoteLog` both offer.

Strategy: a `typing.Protocol` lists every operation a caller may use without knowing
where the log lives; `open_log(path)` and `open_log("streamlog://...")` return objects
that satisfy it, and a test (tests/unit/test_api.py) checks that both classes have each
operation with the same parameters, so the remote API cannot drift from the local one.
What only a local log does is not part of it: LOCAL_ONLY names each such public method
of Log and says why (tests/unit/test_api_local_only.py checks that every public method
of Log is one or the other). PUBLIC_MODULES says which modules of the storage core the
packages above it may import (tests/unit/test_layering.py).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class LogAPI(Protocol):
    # -- streams ------------------------------------------------------------------------
    def create_stream(self, name: str, partitions: int = 1) -> int: ...
    def streams(self) -> list[str]: ...
    def partition_count(self, stream: str) -> int: ...

    # -- appends (async, and blocking for code that is not asyncio) ---------------------
    async def append(self, stream: str, value, *, key=None, timestamp_us=None,
                     partition=None, headers=None, kind=..., txn_id: int = 0) -> Any: ...
    def append_sync(self, stream: str, value, *, key=None, timestamp_us=None,
                    partition=None, headers=None, kind=..., txn_id: int = 0) -> Any: ...
    async def append_batch(self, stream: str, values, *, keys=None, timestamps_us=None,
                           partition=None, headers=None, kinds=None,
                           txn_id: int = 0) -> Any: ...
    def append_batch_sync(self, stream: str, values, *, keys=None, timestamps_us=None,
                          partition=None, headers=None, kinds=None,
                          txn_id: int = 0) -> Any: ...
    async def append_columns(self, stream: str, data, *, partition: int | None = None,
                             txn_id: int = 0) -> Any: ...
    def append_columns_sync(self, stream: str, data, *, partition: int | None = None,
                            txn_id: int = 0) -> Any: ...

    def producer(self, stream: str, **options) -> Any: ...

    # -- reads and positions ------------------------------------------------------------
    def reader(self, stream: str, partition: int = 0, *, from_offset=None,
               from_timestamp_us=None, to_offset=None, to_timestamp_us=None,
               follow: bool = False, data_only: bool = True,
               read_committed: bool = True) -> Any: ...
    def offset_for_timestamp(self, stream: str, partition: int, timestamp_us: int) -> int: ...
    def start_offset(self, stream: str, partition: int = 0) -> int: ...
    def end_offset(self, stream: str, partition: int = 0) -> int: ...
    def last_stable_offset(self, stream: str, partition: int = 0) -> int: ...
    def info(self) -> dict: ...
    def refresh(self) -> None: ...

    # -- transactions and truncation ----------------------------------------------------
    @staticmethod
    def new_txn_id() -> int: ...
    def commit_txn(self, stream: str, partition: int, txn_id: int, *, tag: str = "",
                   marker: bytes = b"") -> int: ...
    def abort_txn(self, stream: str, partition: int, txn_id: int) -> int: ...
    def txn_state(self, stream: str, partition: int, txn_id: int): ...
    def init_producer(self, stream: str, partition: int, transactional_id: str) -> int: ...
    def begin_txn(self, stream: str, partition: int, transactional_id: str,
                  epoch: int) -> int: ...
    def last_commit(self, stream: str, partition: int, tag: str) -> bytes | None: ...
    def truncate_after(self, stream: str, partition: int, offset: int) -> int: ...
    def open_transactions(self, stream: str, partition: int) -> dict[int, int]: ...

    # -- retention and durable holds ----------------------------------------------------
    def apply_retention(self, now_us: int | None = None) -> list[str]: ...
    def hold(self, stream: str, partition: int, name: str, offset: int) -> None: ...
    def release_hold(self, stream: str, partition: int, name: str) -> bool: ...
    def holds(self, stream: str, partition: int = 0) -> dict[str, dict]: ...

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None: ...
    async def aclose(self) -> None: ...


OPERATIONS = tuple(name for name in vars(LogAPI) if not name.startswith("_")
                   and callable(getattr(LogAPI, name)))

# Public methods of Log that are not part of the API, and why each is local only (its
# docstring says so too).
LOCAL_ONLY: dict[str, str] = {
    "append_stamped_sync": "a Kafka producer's stamped batch: the Kafka listener runs in "
                           "the process that has the log open",
    "append_prepared": "records already in the writer's form: the daemon's own APPEND "
                       "path; a client sends records (append_batch, append_columns)",
    "submit": "the one door to the partitions' writers, for a Submission the log's own "
              "append rules made (append.py): every append form above comes through it",
    "submit_async": "submit, awaited (the one door)",
    "submit_then": "submit, resolved by the writer thread: the local Producer's batches; "
                   "a client's Producer sends through RemoteLog.send_batch",
    "batch_holding": "hands out a stored batch, the unit of the log's files (an "
                     "operator reading its output backwards); a client reads ranges",
    "wait_for": "a long poll on the live tail, for what runs beside the log (the Kafka "
                "listener's fetch); a client follows with reader(follow=True)",
    "wait_for_async": "wait_for for an event loop",
    "stats": "counters of this process's writer threads, not of the log; a daemon "
             "publishes its own on its metrics port",
    "start_scrubber": "a background thread of the process that has the log open "
                      "(streamlog serve --scrub-mib-per-s)",
    "create_internal_stream": "the door to streamlog's own streams (names starting with "
                              "'__'), for its components beside the log (the Kafka "
                              "listener); clients only read them",
    "append_internal_sync": "the door to streamlog's own streams, as "
                            "create_internal_stream",
    "delete_stream": "the Kafka listener's DeleteTopics, beside the log; the daemon's "
                     "wire protocol does not carry it yet",
    "delete_records": "the Kafka listener's DeleteRecords, beside the log; the daemon's "
                      "wire protocol does not carry it yet",
    "add_partitions": "the Kafka listener's CreatePartitions, beside the log; the "
                      "daemon's wire protocol does not carry it yet",
    "commit_txns": "the Kafka listener's transactions over several partitions, beside "
                   "the log; the daemon's wire protocol does not carry it yet",
}


# -- the storage core's public modules -------------------------------------------------
#
# Code outside the storage core (wire/, kafka/, operators/, cli/, spark_source/,
# spark_sink/) imports from it only these modules, and from each only the names listed
# (None: every name that does not start with "_"). tests/unit/test_layering.py enforces
# it. Each entry says why the module (or the name) is public.
PUBLIC_MODULES: dict[str, tuple[frozenset[str] | None, str]] = {
    "streamlog": (None, "the facade: exactly streamlog.__all__"),
    "streamlog.api": (None, "this module: the operations a local and a remote log share"),
    "streamlog.errors": (None, "the exception tree every caller catches"),
    "streamlog.records": (None, "the values the API takes and returns: Record, RecordKind, "
                                "AppendResult, RecordPosition"),
    "streamlog.config": (None, "LogConfig and its enums: open_log's options, every limit"),
    "streamlog.payload": (None, "the columnar batch payload, pure (bytes in, values out): "
                                "what Reader.slices() yields (Columns), what the daemon's "
                                "APPEND and BATCH carry as stored, and the rows "
                                "Log.append_prepared takes (EncodedRows)"),
    "streamlog.frame": (frozenset({"ProducerStamp", "SEQUENCE_MAX", "Frame", "CODEC_NONE",
                                   "FLAG_HAS_CONTROL", "FLAG_HAS_HEADERS"}),
                        "ProducerStamp and SEQUENCE_MAX: the stamp Log.append_stamped_sync "
                        "takes (Kafka's idempotent producers); Frame and the payload "
                        "flags: a payload travels on the daemon's wire with the flags its "
                        "frame stores, and payload.decode_columns takes a Frame"),
    "streamlog.txn": (frozenset({"TxnState", "new_txn_id"}),
                      "TxnState: what txn_state returns; new_txn_id: Log.new_txn_id"),
    "streamlog.reader": (frozenset({"Reader", "WAIT"}),
                         "Reader, and WAIT: what Reader.slices() yields at the live end"),
    "streamlog.arrowconv": (frozenset({"columns_to_arrow"}),
                            "payload Columns to Arrow, as Reader.arrow() does (a daemon "
                            "client's reader)"),
    "streamlog.columnar": (frozenset({"rows_from", "encode"}),
                           "a daemon client checks and encodes a columnar append with the "
                           "log's own checks (the same errors as Log.append_columns)"),
    "streamlog.validate": (frozenset({"records", "stream_name"}),
                           "a daemon client checks an append's records with the log's own "
                           "checks (the same errors as Log.append_batch); the command "
                           "line checks a stream's name as create_stream does"),
    "streamlog.encoder": (frozenset({"Piece"}),
                          "records as lists in the form a partition's writer takes: one "
                          "of the two forms Log.append_prepared takes"),
    "streamlog.fileio": (frozenset({"FileIO", "OsFileIO", "read_file", "write_file_atomic"}),
                         "the file-system seam open_log(fileio=...) takes, and its "
                         "crash-safe whole-file write, for what keeps files beside the "
                         "log (the Kafka listener's producer state, the daemon's fsync "
                         "timer)"),
    "streamlog.layout": (frozenset({"valid_stream_name", "parse_segment_name",
                                    "is_internal", "INTERNAL_PREFIX"}),
                         "the log directory's names, pure: a stream name's rule and a "
                         "segment file's name (the command line checks and lists them)"),
    "streamlog.check": (None, "the offline check and repair of a partition's files "
                              "(DESIGN 4): what `streamlog verify`, `dump` and `repair` run"),
    "streamlog.integrity": (frozenset({"Verdict"}), "the verdict a check's result carries"),
    "streamlog.connect": (frozenset({"open_log", "open_store"}),
                          "open_log is streamlog.open_log; open_store opens an object store "
                          "from its URL as open_log does (operators' checkpoints in one)"),
    "streamlog.producer": (frozenset({"Producer"}),
                           "the Producer a daemon's client's producer() returns"),
    "streamlog.directory": (frozenset({"take_writer_lock"}),
                            "take_writer_lock makes "
                            "`streamlog repair` the log's only writer"),
}
