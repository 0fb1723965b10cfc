"""Core benchmark: durable append, replay, timestamp seek and reopen-after-kill of streamlog,
beside three baselines measured in the same run.

Command (from the repository root; `./dev bench core` runs the same):

    .venv/bin/python bench/core.py                  # 1,000,000 records, 1 GiB reopen log
    .venv/bin/python bench/core.py --quick          # 100,000 records, 0.1 GiB, a smoke run
    .venv/bin/python bench/core.py --records N --workdir DIR --reopen-gb X

Writes bench/results/core.json (flat: named numbers, plus "command" and "cpu_count"),
prints progress on stderr and a table with ratios and targets on stdout.

Data: N records, each a 16-byte random key, a 100-byte random value and a timestamp in
microseconds that rises by 10 us per record with a jitter of +-15 us, so some records are
out of order and some share a timestamp. Every measurement uses the same records.

Baselines (durable: every figure includes its fsyncs):
  plain   One file. Record = u32 length of the rest | i64 timestamp_us | u16 key length |
          key | value (little-endian). Records are packed into a bytearray; each time it
          reaches 1 MiB it is written with os.write and followed by one os.fsync (the last,
          partial chunk is written and fsynced too). Replay reads the file in 8 MiB os.read
          chunks, parses the length prefixes and builds a tuple (seq, timestamp, key, value)
          per record, with the key and value as bytes.
  sqlite  sqlite3, journal_mode=WAL, synchronous=FULL; table records(seq INTEGER PRIMARY
          KEY, ts INTEGER, key BLOB, value BLOB) with an index on ts; 1,000 rows per
          transaction (executemany). Replay: SELECT ... ORDER BY seq, fetchmany(10,000).
  lmdb    python lmdb, sync=True, metasync=True; key = big-endian (timestamp, sequence),
          16 bytes; value = key + value; 1,000 puts per write transaction (putmulti).
          Replay: cursor iteration in one read transaction, splitting key and value.

streamlog (one stream, one partition):
  append_batched_rps     fsync="always", append_batch of 1,000 records awaited one after
                         another; append_batched_mb_s counts key + value bytes.
  append_columns_rps     fsync="always", append_columns of the same records as Arrow
                         record batches of 8,192 rows (value, key, timestamp; built before
                         the clock starts), up to 4 in flight (as a pipeline with a
                         bounded queue keeps them); append_columns_mb_s counts key + value
                         bytes.
  disk_fsync_mb_s        the physical limit in the same run: as many bytes as the records'
                         keys and values, rounded up to whole preallocated 1 MiB buffers,
                         each written with os.write to a file in the work dir and fsynced;
                         no per-record work. append_columns_vs_disk is append_columns_mb_s
                         over it.
  append_concurrent_rps  fsync="always", 1,000 asyncio tasks each awaiting log.append of
                         one record in a loop, until append_concurrent_records are in (at
                         most 200,000 and at most 60 s, whichever comes first): an asyncio
                         service's appends. append_concurrent10_rps: the same with 10
                         tasks (at most 50,000 records and 20 s): at most 10 records can
                         share an fsync, so the disk's fsync latency bounds it.
  append_producer_rps    fsync="always", every record sent alone with log.producer(...)
                         .send (handles dropped), then flush(): single records at
                         group-commit speed (streamlog/producer.py); the baseline of the
                         awaited single appends above (append_concurrent_vs_producer).
  replay_records_rps     reader.records() over the batched log, as Record objects.
  replay_arrow_rps       reader.arrow() over the same log, counting rows.
  timestamp_seek_ms      median time from log.reader(from_timestamp_us=T) to its first
                         record, T random in the middle half of the log (20 seeks), on the
                         N-record log; timestamp_seek_ms_small is the same on an N/10 log.
  reopen_after_kill_s    a child process builds a log of at least --reopen-gb GiB
                         (fsync="never", 1,000-byte values, 4,096-record batches), keeps
                         appending and is killed with SIGKILL; a fresh process then times
                         open_log(path), the writable open that runs recovery.
                         reopen_log_bytes is the size of the log on disk after the kill.

Replays read files just written, so they come from the page cache, for every contender.
A measurement that fails prints its traceback on stderr and leaves its figures out; the
others still run, the results are still written, and the exit status is then 1.
The machine this runs on is shared: compare ratios rather than absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import sqlite3
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
if os.environ.get("PYTHONPATH"):  # another version's code first (bench/reopen.py --compare)
    sys.path.insert(0, os.environ["PYTHONPATH"].split(os.pathsep)[0])

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, finish, GiB, MiB, Row, Stopwatch, Target, attempt, dir_bytes, fresh_dir,
    median, phase, print_table, print_targets, progress, rate, remove, timed,
    write_results)
import _common  # noqa: E402

STREAM = "events"
KEY_BYTES = 16
VALUE_BYTES = 100
BATCH = 1_000
COLUMNS_BATCH = 8_192
COLUMNS_IN_FLIGHT = 4
# (tasks, records at most, seconds at most, figure): the awaited single appends
CONCURRENT_RUNS = ((1_000, 200_000, 60.0, "append_concurrent"),
                   (10, 50_000, 20.0, "append_concurrent10"))
SEEKS = 20
REOPEN_VALUE_BYTES = 1_000
REOPEN_BATCH = 4_096
TS_STEP_US = 10
TS_JITTER_US = 15


# ---------------------------------------------------------------- data

@dataclass
class Dataset:
    keys: list[bytes]
    values: list[bytes]
    timestamps_us: list[int]

    def __len__(self) -> int:
        return len(self.values)

    def payload_bytes(self) -> int:
        return len(self) * (KEY_BYTES + VALUE_BYTES)

    def head(self, count: int) -> "Dataset":
        return Dataset(self.keys[:count], self.values[:count], self.timestamps_us[:count])


def make_dataset(count: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    key_blob = rng.randbytes(count * KEY_BYTES)
    value_blob = rng.randbytes(count * VALUE_BYTES)
    keys = [key_blob[i:i + KEY_BYTES] for i in range(0, len(key_blob), KEY_BYTES)]
    values = [value_blob[i:i + VALUE_BYTES] for i in range(0, len(value_blob), VALUE_BYTES)]
    return Dataset(keys, values, make_timestamps(count, rng))


def make_timestamps(count: int, rng: random.Random) -> list[int]:
    """Rising by TS_STEP_US per record with +-TS_JITTER_US jitter (some out of order)."""
    base = time.time_ns() // 1000 - count * TS_STEP_US
    jitter = rng.randint
    return [base + i * TS_STEP_US + jitter(-TS_JITTER_US, TS_JITTER_US) for i in range(count)]


def batches(count: int, size: int):
    for start in range(0, count, size):
        yield start, min(start + size, count)


# ---------------------------------------------------------------- baseline: plain file

PLAIN_HEADER = struct.Struct("<IqH")  # length of the rest, timestamp_us, key length


def plain_append(path: Path, data: Dataset) -> None:
    pack = PLAIN_HEADER.pack
    fixed = PLAIN_HEADER.size - 4
    buf = bytearray()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for ts, key, value in zip(data.timestamps_us, data.keys, data.values):
            buf += pack(fixed + len(key) + len(value), ts, len(key))
            buf += key
            buf += value
            if len(buf) >= MiB:
                write_all(fd, buf)
                os.fsync(fd)
                buf.clear()
        if buf:
            write_all(fd, buf)
            os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, buf: bytearray) -> None:
    view = memoryview(buf)
    while view:
        view = view[os.write(fd, view):]


def plain_replay(path: Path) -> tuple[int, int]:
    """Return (records, value bytes) read back as (seq, ts, key, value) tuples."""
    unpack = PLAIN_HEADER.unpack_from
    head = PLAIN_HEADER.size
    count = value_bytes = 0
    pending = b""
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, 8 * MiB):
            buf = pending + chunk if pending else chunk
            pos, end = 0, len(buf)
            while pos + head <= end:
                length, ts, key_len = unpack(buf, pos)
                stop = pos + 4 + length
                if stop > end:
                    break
                key_end = pos + head + key_len
                record = (count, ts, buf[pos + head:key_end], buf[key_end:stop])
                count += 1
                value_bytes += len(record[3])
                pos = stop
            pending = buf[pos:]
    finally:
        os.close(fd)
    return count, value_bytes


# ---------------------------------------------------------------- baseline: sqlite

def sqlite_append(path: Path, data: Dataset) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE records (seq INTEGER PRIMARY KEY, ts INTEGER,"
                     " key BLOB, value BLOB)")
        conn.execute("CREATE INDEX records_ts ON records (ts)")
        insert = "INSERT INTO records (ts, key, value) VALUES (?, ?, ?)"
        for start, stop in batches(len(data), BATCH):
            rows = zip(data.timestamps_us[start:stop], data.keys[start:stop],
                       data.values[start:stop])
            with conn:  # one transaction, committed (and fsynced) on exit
                conn.executemany(insert, rows)
    finally:
        conn.close()


def sqlite_replay(path: Path) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    count = value_bytes = 0
    try:
        cursor = conn.execute("SELECT seq, ts, key, value FROM records ORDER BY seq")
        while rows := cursor.fetchmany(10_000):
            for row in rows:
                count += 1
                value_bytes += len(row[3])
    finally:
        conn.close()
    return count, value_bytes


# ---------------------------------------------------------------- baseline: lmdb

LMDB_KEY = struct.Struct(">QQ")  # timestamp_us, sequence


def lmdb_open(path: Path, records: int):
    import lmdb
    map_size = max(256 * MiB, records * 512)
    return lmdb.open(str(path), map_size=map_size, sync=True, metasync=True)


def lmdb_append(path: Path, data: Dataset) -> None:
    env = lmdb_open(path, len(data))
    pack = LMDB_KEY.pack
    ts, keys, values = data.timestamps_us, data.keys, data.values
    try:
        for start, stop in batches(len(data), BATCH):
            items = [(pack(ts[i], i), keys[i] + values[i]) for i in range(start, stop)]
            with env.begin(write=True) as txn:  # committed (and fsynced) on exit
                txn.cursor().putmulti(items)
    finally:
        env.close()


def lmdb_replay(path: Path, records: int) -> tuple[int, int]:
    env = lmdb_open(path, records)
    unpack = LMDB_KEY.unpack
    count = value_bytes = 0
    try:
        with env.begin() as txn:
            for k, v in txn.cursor():
                ts, seq = unpack(k)
                record = (seq, ts, v[:KEY_BYTES], v[KEY_BYTES:])
                count += 1
                value_bytes += len(record[3])
    finally:
        env.close()
    return count, value_bytes


# ---------------------------------------------------------------- baselines, measured

def measure_baselines(work: Path, data: Dataset, figures: dict) -> None:
    n = len(data)
    contenders = [
        ("baseline", "plain file", work / "plain.log", plain_append, plain_replay),
        ("sqlite", "sqlite", work / "sqlite.db", sqlite_append, sqlite_replay),
        ("lmdb", "lmdb", work / "lmdb", lmdb_append, lambda p: lmdb_replay(p, n)),
    ]
    for prefix, label, path, append, replay in contenders:
        remove(path)
        with phase(f"{label}: append {n:,} records"):
            _, seconds = timed(append, path, data)
            figures[f"{prefix}_append_rps"] = rate(n, seconds)
            figures[f"{prefix}_log_bytes"] = file_or_dir_bytes(path)
        with phase(f"{label}: replay"):
            (count, value_bytes), seconds = timed(replay, path)
            check_replay(label, count, value_bytes, n)
            figures[f"{prefix}_replay_rps"] = rate(n, seconds)
        report_rates(label, figures, prefix)
        remove(path)
        for extra in (Path(f"{path}-wal"), Path(f"{path}-shm")):
            remove(extra)


def file_or_dir_bytes(path: Path) -> int:
    return dir_bytes(path) if path.is_dir() else path.stat().st_size


def check_replay(label: str, count: int, value_bytes: int, expected: int) -> None:
    if count != expected or value_bytes != expected * VALUE_BYTES:
        raise RuntimeError(f"{label}: replay returned {count:,} records and {value_bytes:,}"
                           f" value bytes; expected {expected:,} and"
                           f" {expected * VALUE_BYTES:,}")


def report_rates(label: str, figures: dict, prefix: str) -> None:
    progress(f"{label}: append {figures[f'{prefix}_append_rps']:,.0f} rec/s,"
             f" replay {figures[f'{prefix}_replay_rps']:,.0f} rec/s")


# ---------------------------------------------------------------- streamlog: appends

def open_log(path: Path, **config):
    import streamlog
    return streamlog.open_log(str(path), **config)


async def append_batched(path: Path, data: Dataset, fsync: str) -> float:
    """Append data in BATCH-record batches, each awaited before the next; return seconds."""
    log = open_log(path, fsync=fsync)
    log.create_stream(STREAM, partitions=1)
    appended = 0
    watch = Stopwatch()
    for start, stop in batches(len(data), BATCH):
        result = await log.append_batch(
            STREAM, data.values[start:stop], keys=data.keys[start:stop],
            timestamps_us=data.timestamps_us[start:stop], partition=0)
        appended += result.records
    seconds = watch.elapsed
    await log.aclose()
    if appended != len(data):
        raise RuntimeError(f"append_batch acknowledged {appended:,} of {len(data):,} records")
    return seconds


async def append_concurrent(path: Path, data: Dataset, tasks: int, total: int,
                            seconds_max: float) -> tuple[int, float]:
    """`tasks` tasks, each awaiting single-record appends; return (records, s)."""
    log = open_log(path, fsync="always")
    log.create_stream(STREAM, partitions=1)
    next_index = done = 0
    deadline = time.perf_counter() + seconds_max

    async def appender() -> None:
        nonlocal next_index, done
        while next_index < total and time.perf_counter() < deadline:
            i = next_index
            next_index += 1
            await log.append(STREAM, data.values[i], key=data.keys[i],
                             timestamp_us=data.timestamps_us[i], partition=0)
            done += 1

    watch = Stopwatch()
    await asyncio.gather(*(appender() for _ in range(tasks)))
    seconds = watch.elapsed
    await log.aclose()
    return done, seconds


def measure_batched(work: Path, data: Dataset, figures: dict) -> None:
    """Leaves the log at work/batched for the replays and seeks."""
    n = len(data)
    path = work / "batched"
    remove(path)
    with phase(f"streamlog: append_batch x {n // BATCH:,} of {BATCH:,}, fsync=always"):
        seconds = asyncio.run(append_batched(path, data, "always"))
    figures["append_batched_rps"] = rate(n, seconds)
    figures["append_batched_mb_s"] = rate(data.payload_bytes(), seconds) / 1e6
    figures["append_batched_log_bytes"] = dir_bytes(path)
    progress(f"streamlog: batched append {figures['append_batched_rps']:,.0f} rec/s,"
             f" {figures['append_batched_mb_s']:.1f} MB/s")


def arrow_batches(data: Dataset, size: int) -> list:
    """The records as pyarrow RecordBatches of `size` rows (value, key, timestamp)."""
    import pyarrow as pa
    values = pa.array(data.values, pa.binary())
    keys = pa.array(data.keys, pa.binary())
    stamps = pa.array(data.timestamps_us, pa.int64())
    return [pa.record_batch({"value": values[start:stop], "key": keys[start:stop],
                             "timestamp": stamps[start:stop]})
            for start, stop in batches(len(data), size)]


async def append_columns(path: Path, record_batches: list, fsync: str) -> tuple[int, float]:
    """append_columns of each record batch, COLUMNS_IN_FLIGHT at a time (the next starts
    as the oldest is acknowledged); return (records, s)."""
    log = open_log(path, fsync=fsync)
    log.create_stream(STREAM, partitions=1)
    appended = 0
    in_flight: collections.deque = collections.deque()
    watch = Stopwatch()
    for batch in record_batches:
        if len(in_flight) == COLUMNS_IN_FLIGHT:
            appended += (await in_flight.popleft()).records
        in_flight.append(asyncio.ensure_future(log.append_columns(STREAM, batch,
                                                                  partition=0)))
    for pending in in_flight:
        appended += (await pending).records
    seconds = watch.elapsed
    await log.aclose()
    return appended, seconds


def measure_columns(work: Path, data: Dataset, figures: dict) -> None:
    n = len(data)
    path = work / "columns"
    remove(path)
    record_batches = arrow_batches(data, COLUMNS_BATCH)
    with phase(f"streamlog: append_columns x {len(record_batches):,} Arrow batches of"
               f" {COLUMNS_BATCH:,}, {COLUMNS_IN_FLIGHT} in flight, fsync=always"):
        appended, seconds = asyncio.run(append_columns(path, record_batches, "always"))
    if appended != n:
        raise RuntimeError(f"append_columns acknowledged {appended:,} of {n:,} records")
    with phase("streamlog: check the columnar log reads back"):
        check_columns_log(path, data)
    figures["append_columns_rps"] = rate(n, seconds)
    figures["append_columns_mb_s"] = rate(data.payload_bytes(), seconds) / 1e6
    figures["append_columns_log_bytes"] = dir_bytes(path)
    progress(f"streamlog: columnar append {figures['append_columns_rps']:,.0f} rec/s,"
             f" {figures['append_columns_mb_s']:.1f} MB/s")
    remove(path)


def check_columns_log(path: Path, data: Dataset) -> None:
    """The first and last records and the total come back as appended."""
    log = open_log(path)
    try:
        rows = replay_arrow(log)
        if rows != len(data):
            raise RuntimeError(f"columnar log: {rows:,} rows, expected {len(data):,}")
        first = next(iter(log.reader(STREAM, partition=0, from_offset=0).records()))
        last = next(iter(log.reader(STREAM, partition=0,
                                    from_offset=len(data) - 1).records()))
    finally:
        log.close()
    for record, i in ((first, 0), (last, len(data) - 1)):
        if (record.key, record.value, record.timestamp_us) != (
                data.keys[i], data.values[i], data.timestamps_us[i]):
            raise RuntimeError(f"columnar log: record {i} differs from what was appended")


def disk_fsync(path: Path, total_bytes: int) -> float:
    """Write total_bytes (whole 1 MiB buffers, allocated before the clock starts) to a
    new file, fsync after each; return seconds."""
    chunks = max(1, -(-total_bytes // MiB))
    buffer = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        watch = Stopwatch()
        for _ in range(chunks):
            write_all(fd, buffer)
            os.fsync(fd)
        return watch.elapsed
    finally:
        os.close(fd)


def measure_disk(work: Path, data: Dataset, figures: dict) -> None:
    path = work / "disk.bin"
    chunks = max(1, -(-data.payload_bytes() // MiB))
    with phase(f"disk: {chunks:,} x 1 MiB write + fsync"):
        seconds = disk_fsync(path, data.payload_bytes())
    figures["disk_fsync_mb_s"] = rate(chunks * MiB, seconds) / 1e6
    progress(f"disk: {figures['disk_fsync_mb_s']:.1f} MB/s written and fsynced in 1 MiB"
             f" chunks")
    remove(path)


def measure_concurrent(work: Path, data: Dataset, figures: dict, scale: int) -> None:
    for tasks, records_max, seconds_max, name in CONCURRENT_RUNS:
        count = min(len(data), records_max // scale)
        path = work / "concurrent"
        remove(path)
        with phase(f"streamlog: {tasks:,} tasks awaiting single appends, up to {count:,}"
                   f" records or {seconds_max / scale:.0f} s, fsync=always"):
            done, seconds = asyncio.run(
                append_concurrent(path, data, tasks, count, seconds_max / scale))
        figures[f"{name}_rps"] = rate(done, seconds)
        figures[f"{name}_records"] = done
        progress(f"streamlog: {tasks:,} tasks, single appends {figures[f'{name}_rps']:,.0f}"
                 f" rec/s")
        remove(path)


def measure_producer(work: Path, data: Dataset, figures: dict) -> None:
    n = len(data)
    path = work / "producer"
    remove(path)
    log = open_log(path, fsync="always")
    log.create_stream(STREAM, partitions=1)
    with phase(f"streamlog: producer.send x {n:,}, fsync=always"):
        watch = Stopwatch()
        with log.producer(STREAM) as producer:
            send = producer.send
            for key, value, stamp in zip(data.keys, data.values, data.timestamps_us):
                send(value, key=key, timestamp_us=stamp)
            producer.flush()
        seconds = watch.elapsed
    end = log.end_offset(STREAM, 0)
    log.close()
    if end != n:
        raise RuntimeError(f"the producer's log holds {end:,} of {n:,} records")
    figures["append_producer_rps"] = rate(n, seconds)
    progress(f"streamlog: producer {figures['append_producer_rps']:,.0f} rec/s")
    remove(path)


# ---------------------------------------------------------------- streamlog: reads

def replay_records(log) -> tuple[int, int]:
    count = value_bytes = 0
    reader = log.reader(STREAM, partition=0)
    try:
        for record in reader.records():
            count += 1
            value_bytes += len(record.value)
    finally:
        reader.close()
    return count, value_bytes


def replay_arrow(log) -> int:
    rows = 0
    reader = log.reader(STREAM, partition=0)
    try:
        for batch in reader.arrow():
            rows += batch.num_rows
    finally:
        reader.close()
    return rows


def measure_replays(work: Path, data: Dataset, figures: dict) -> None:
    """Replays and timestamp seeks on the log measure_batched left; removes it after."""
    n = len(data)
    path = work / "batched"
    if not path.is_dir():
        raise RuntimeError(f"no log at {path} to replay (the batched append failed)")
    watch = Stopwatch()
    log = open_log(path)
    figures["reopen_clean_s"] = watch.elapsed
    try:
        with phase("streamlog: replay as Record objects"):
            (count, value_bytes), seconds = timed(replay_records, log)
            check_replay("streamlog records()", count, value_bytes, n)
            figures["replay_records_rps"] = rate(n, seconds)
        with phase("streamlog: replay as Arrow record batches"):
            rows, seconds = timed(replay_arrow, log)
            if rows != n:
                raise RuntimeError(f"streamlog arrow(): {rows:,} rows, expected {n:,}")
            figures["replay_arrow_rps"] = rate(n, seconds)
        progress(f"streamlog: replay {figures['replay_records_rps']:,.0f} rec/s as records,"
                 f" {figures['replay_arrow_rps']:,.0f} rec/s as Arrow")
        with phase(f"streamlog: {SEEKS} timestamp seeks on {n:,} records"):
            seeks = timestamp_seeks(log, data.timestamps_us, random.Random(1))
        figures["timestamp_seek_ms"] = median(seeks)
        figures["timestamp_seek_ms_max"] = max(seeks)
    finally:
        log.close()
        remove(path)


def timestamp_seeks(log, timestamps_us: list[int], rng: random.Random) -> list[float]:
    """Milliseconds from reader(from_timestamp_us=T) to its first record, T mid-log."""
    count = len(timestamps_us)
    low, high = timestamps_us[count // 4], timestamps_us[3 * count // 4]
    results = []
    wrong = 0
    for _ in range(SEEKS):
        target = rng.randint(low, high)
        watch = Stopwatch()
        reader = log.reader(STREAM, partition=0, from_timestamp_us=target)
        try:
            first = next(iter(reader.records()))
            results.append(watch.elapsed * 1000)
        finally:
            reader.close()
        if first.timestamp_us < target or first.timestamp_us > target + 4 * TS_JITTER_US:
            wrong += 1
    if wrong:
        progress(f"WARNING: {wrong} of {SEEKS} seeks started at a record whose timestamp is"
                 f" before the target or more than {4 * TS_JITTER_US} us after it")
    return results


def measure_small_seek(work: Path, data: Dataset, figures: dict) -> None:
    small = data.head(max(len(data) // 10, BATCH))
    path = work / "small"
    remove(path)
    with phase(f"streamlog: build a {len(small):,}-record log (fsync=never)"):
        asyncio.run(append_batched(path, small, "never"))
    log = open_log(path)
    try:
        with phase(f"streamlog: {SEEKS} timestamp seeks on {len(small):,} records"):
            seeks = timestamp_seeks(log, small.timestamps_us, random.Random(2))
    finally:
        log.close()
    figures["timestamp_seek_ms_small"] = median(seeks)
    progress(f"streamlog: timestamp seek {figures['timestamp_seek_ms']:.3f} ms"
             f" ({len(data):,} records), {figures['timestamp_seek_ms_small']:.3f} ms"
             f" ({len(small):,})")
    remove(path)


# ---------------------------------------------------------------- reopen after kill

def reopen_writer(path: Path, target_bytes: int) -> None:
    """Child process: append until the log passes target_bytes, say READY, keep going.

    Prints "acked N" after every acknowledged batch and "bytes B" now and then; it never
    stops by itself: the parent kills it with SIGKILL.
    """
    log = open_log(path, fsync="never")
    log.create_stream(STREAM, partitions=1)
    rng = random.Random(3)
    ts = time.time_ns() // 1000
    acked = 0
    ready = False
    while True:
        blob = os.urandom(REOPEN_BATCH * REOPEN_VALUE_BYTES)
        values = [blob[i:i + REOPEN_VALUE_BYTES]
                  for i in range(0, len(blob), REOPEN_VALUE_BYTES)]
        keys = [rng.randbytes(KEY_BYTES) for _ in range(REOPEN_BATCH)]
        stamps = [ts + i * TS_STEP_US for i in range(REOPEN_BATCH)]
        ts += REOPEN_BATCH * TS_STEP_US
        acked += log.append_batch_sync(STREAM, values, keys=keys, timestamps_us=stamps,
                                       partition=0).records
        size = dir_bytes(path)
        print(f"acked {acked}\nbytes {size}", flush=True)
        if not ready and size >= target_bytes:
            print("READY", flush=True)
            ready = True


def reopen_opener(path: Path) -> None:
    """Child process: time the writable open (recovery), then count what it recovered."""
    import streamlog  # noqa: F401  (imported before the clock starts)
    watch = Stopwatch()
    log = open_log(path)
    seconds = watch.elapsed
    try:
        records = replay_arrow(log)
    finally:
        log.close()
    print(json.dumps({"open_s": seconds, "records": records}), flush=True)


def child(mode: str, path: Path, *extra: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), mode, str(path), *extra]


def build_and_kill(path: Path, target_bytes: int) -> int:
    """Run the writer child until READY, let it append a little more, SIGKILL it.

    Returns the number of records the writer had acknowledged when it was killed.
    """
    proc = subprocess.Popen(child("--_reopen-writer", path, str(target_bytes)),
                            stdout=subprocess.PIPE, text=True)
    acked, shown, watch = 0, 0, Stopwatch()
    try:
        for line in proc.stdout:
            word, _, number = line.partition(" ")
            if word == "acked":
                acked = int(number)
            elif word == "bytes" and int(number) >= shown + target_bytes // 8:
                shown = int(number)
                progress(f"  reopen log: {shown / GiB:.2f} GiB"
                         f" ({rate(shown, watch.elapsed) / 1e6:.0f} MB/s)")
            elif word.strip() == "READY":
                time.sleep(0.2)  # the writer is mid-append when it dies
                os.kill(proc.pid, signal.SIGKILL)
                break
        for line in proc.stdout:  # lines printed before the kill: acknowledged batches
            word, _, number = line.partition(" ")
            if word == "acked":
                acked = int(number)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"reopen writer exited with {proc.returncode} before READY")
    return acked


def measure_reopen(work: Path, figures: dict, target_bytes: int) -> None:
    path = work / "reopen"
    remove(path)
    with phase(f"reopen: build a {target_bytes / GiB:.2f} GiB log in a child, SIGKILL it"):
        watch = Stopwatch()
        acked = build_and_kill(path, target_bytes)
        figures["reopen_build_s"] = watch.elapsed
    figures["reopen_log_bytes"] = dir_bytes(path)
    figures["reopen_acked_records"] = acked
    with phase("reopen: open_log (recovery) in a fresh process"):
        out = subprocess.run(child("--_reopen-open", path), check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    opened = json.loads(out.strip().splitlines()[-1])
    figures["reopen_after_kill_s"] = opened["open_s"]
    figures["reopen_recovered_records"] = opened["records"]
    progress(f"reopen: {figures['reopen_log_bytes'] / GiB:.2f} GiB log opened in"
             f" {opened['open_s']:.3f} s; {opened['records']:,} records recovered,"
             f" {acked:,} acknowledged before the kill")
    if opened["records"] < acked:
        progress("WARNING: recovery returned fewer records than were acknowledged")
    remove(path)


# ---------------------------------------------------------------- report

RATIOS = {
    "append_vs_baseline": ("append_batched_rps", "baseline_append_rps"),
    "append_vs_sqlite": ("append_batched_rps", "sqlite_append_rps"),
    "append_vs_lmdb": ("append_batched_rps", "lmdb_append_rps"),
    "append_concurrent_vs_baseline": ("append_concurrent_rps", "baseline_append_rps"),
    "append_concurrent_vs_producer": ("append_concurrent_rps", "append_producer_rps"),
    "append_concurrent10_vs_producer": ("append_concurrent10_rps", "append_producer_rps"),
    "append_producer_vs_batched": ("append_producer_rps", "append_batched_rps"),
    "append_columns_vs_baseline": ("append_columns_rps", "baseline_append_rps"),
    "append_columns_vs_batched": ("append_columns_rps", "append_batched_rps"),
    "append_columns_vs_lmdb": ("append_columns_rps", "lmdb_append_rps"),
    "append_columns_vs_disk": ("append_columns_mb_s", "disk_fsync_mb_s"),
    "append_batched_vs_disk": ("append_batched_mb_s", "disk_fsync_mb_s"),
    "replay_records_vs_baseline": ("replay_records_rps", "baseline_replay_rps"),
    "replay_arrow_vs_baseline": ("replay_arrow_rps", "baseline_replay_rps"),
    "timestamp_seek_vs_small": ("timestamp_seek_ms", "timestamp_seek_ms_small"),
}

APPEND_RATIOS = {"vs plain": "baseline_append_rps", "vs sqlite": "sqlite_append_rps",
                 "vs lmdb": "lmdb_append_rps"}
DISK_RATIOS = {"vs disk": "disk_fsync_mb_s"}
REPLAY_RATIOS = {"vs plain": "baseline_replay_rps", "vs sqlite": "sqlite_replay_rps",
                 "vs lmdb": "lmdb_replay_rps"}

ROWS = [
    Row("plain file append", "baseline_append_rps", "rec/s", APPEND_RATIOS),
    Row("sqlite append", "sqlite_append_rps", "rec/s", APPEND_RATIOS),
    Row("lmdb append", "lmdb_append_rps", "rec/s", APPEND_RATIOS),
    Row("streamlog append, batched", "append_batched_rps", "rec/s", APPEND_RATIOS),
    Row("streamlog append, batched", "append_batched_mb_s", "MB/s", DISK_RATIOS),
    Row("streamlog append, columns", "append_columns_rps", "rec/s", APPEND_RATIOS),
    Row("streamlog append, columns", "append_columns_mb_s", "MB/s", DISK_RATIOS),
    Row("disk write + fsync, 1 MiB", "disk_fsync_mb_s", "MB/s", DISK_RATIOS),
    Row("streamlog append, 1000 concurrent", "append_concurrent_rps", "rec/s", APPEND_RATIOS),
    Row("streamlog append, 10 concurrent", "append_concurrent10_rps", "rec/s", APPEND_RATIOS),
    Row("streamlog producer, single sends", "append_producer_rps", "rec/s", APPEND_RATIOS),
    Row("plain file replay", "baseline_replay_rps", "rec/s", REPLAY_RATIOS),
    Row("sqlite replay", "sqlite_replay_rps", "rec/s", REPLAY_RATIOS),
    Row("lmdb replay", "lmdb_replay_rps", "rec/s", REPLAY_RATIOS),
    Row("streamlog replay, records", "replay_records_rps", "rec/s", REPLAY_RATIOS),
    Row("streamlog replay, arrow", "replay_arrow_rps", "rec/s", REPLAY_RATIOS),
    Row("timestamp seek, median", "timestamp_seek_ms", "ms"),
    Row("timestamp seek, median, N/10", "timestamp_seek_ms_small", "ms"),
    Row("timestamp seek, N vs N/10", "timestamp_seek_vs_small", "x"),
    Row("timestamp seek, max", "timestamp_seek_ms_max", "ms"),
    Row("reopen after SIGKILL", "reopen_after_kill_s", "s"),
    Row("reopen log size", "reopen_log_bytes", "bytes"),
    Row("reopen after clean close", "reopen_clean_s", "s"),
    Row("log size, plain file", "baseline_log_bytes", "bytes"),
    Row("log size, sqlite", "sqlite_log_bytes", "bytes"),
    Row("log size, lmdb", "lmdb_log_bytes", "bytes"),
    Row("log size, streamlog", "append_batched_log_bytes", "bytes"),
]


def seek_is_flat(f: dict) -> bool:
    return f["timestamp_seek_ms"] <= max(2 * f["timestamp_seek_ms_small"],
                                         f["timestamp_seek_ms_small"] + 1.0)


TARGETS = [
    Target("batched append >= 50% of the plain file baseline",
           lambda f: f["append_vs_baseline"] >= 0.5),
    Target("batched append ahead of SQLite", lambda f: f["append_vs_sqlite"] > 1),
    Target("batched append ahead of LMDB", lambda f: f["append_vs_lmdb"] > 1),
    Target("columnar append >= 1.0x the plain file baseline",
           lambda f: f["append_columns_vs_baseline"] >= 1.0),
    Target("columnar append >= 0.7x disk write + fsync MB/s",
           lambda f: f["append_columns_vs_disk"] >= 0.7),
    Target("columnar append >= 2x LMDB", lambda f: f["append_columns_vs_lmdb"] >= 2.0),
    Target("producer single sends >= 0.2x batched append",
           lambda f: f["append_producer_vs_batched"] >= 0.2),
    Target("awaited single appends, 1,000 tasks >= 0.5x producer single sends",
           lambda f: f["append_concurrent_vs_producer"] >= 0.5),
    Target("records replay >= 0.8x the plain file baseline",
           lambda f: f["replay_records_vs_baseline"] >= 0.8),
    Target("Arrow replay >= 3,000,000 rec/s", lambda f: f["replay_arrow_rps"] >= 3e6),
    Target("timestamp seek < 5 ms", lambda f: f["timestamp_seek_ms"] < 5),
    Target("timestamp seek flat: at N within 2x (or +1 ms) of at N/10", seek_is_flat),
    Target("reopen after SIGKILL < 1 s for a 1 GiB log",
           lambda f: (f["reopen_after_kill_s"] < 1.0) if f["reopen_log_bytes"] >= GiB
           else None),
]


def add_ratios(figures: dict) -> None:
    _common.add_ratios(figures, RATIOS)


def report(figures: dict) -> None:
    print()
    print_table(figures, ROWS, ["vs plain", "vs sqlite", "vs lmdb", "vs disk"])
    print_targets(figures, TARGETS)


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, help="records per run (default 1,000,000;"
                        " 100,000 with --quick)")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                        help="where the logs are written (default bench/work/)")
    parser.add_argument("--reopen-gb", type=float, help="GiB of log for the reopen-after-kill"
                        " measurement (default 1.0; 0.1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--baselines-only", action="store_true",
                        help="measure only plain file, sqlite and lmdb")
    parser.add_argument("--keep", action="store_true", help="leave the logs in the workdir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--_reopen-writer", dest="reopen_writer", nargs=2,
                        help=argparse.SUPPRESS)
    parser.add_argument("--_reopen-open", dest="reopen_open", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.records is None:
        args.records = 100_000 if args.quick else 1_000_000
    if args.reopen_gb is None:
        args.reopen_gb = 0.1 if args.quick else 1.0
    return args


def run(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """Every measurement in turn; one that fails is reported and the others still run.

    Returns the figures and the names of the measurements that failed.
    """
    work = fresh_dir(args.workdir.resolve() / "core")
    figures: dict = {"records": args.records, "key_bytes": KEY_BYTES,
                     "value_bytes": VALUE_BYTES, "batch_records": BATCH,
                     "columns_batch_records": COLUMNS_BATCH}
    scale = 10 if args.quick else 1
    failures: list[str] = []
    try:
        with phase(f"generate {args.records:,} records"):
            data = make_dataset(args.records, args.seed)
        steps = [("baselines", lambda: measure_baselines(work, data, figures))]
        if not args.baselines_only:
            steps += [
                ("batched append", lambda: measure_batched(work, data, figures)),
                ("columnar append", lambda: measure_columns(work, data, figures)),
                ("disk fsync limit", lambda: measure_disk(work, data, figures)),
                ("producer", lambda: measure_producer(work, data, figures)),
                ("concurrent append", lambda: measure_concurrent(
                    work, data, figures, scale)),
                ("replay and seek", lambda: measure_replays(work, data, figures)),
                ("seek on the N/10 log", lambda: measure_small_seek(work, data, figures)),
                ("reopen after kill", lambda: measure_reopen(
                    work, figures, int(args.reopen_gb * GiB))),
            ]
        for name, step in steps:
            attempt(name, step, failures)
    finally:
        if not args.keep:
            remove(work)
            if args.workdir.resolve() == DEFAULT_WORKDIR:
                with contextlib.suppress(OSError):
                    DEFAULT_WORKDIR.rmdir()  # only when empty
    add_ratios(figures)
    return figures, failures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.reopen_writer:
        reopen_writer(Path(args.reopen_writer[0]), int(args.reopen_writer[1]))
        return
    if args.reopen_open:
        reopen_opener(Path(args.reopen_open))
        return
    figures, failures = run(args)
    path = write_results("core", figures)
    report(figures)
    finish(path, failures)


if __name__ == "__main__":
    main()
