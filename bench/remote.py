"""Object-store benchmark: a log tiered to S3 (Ceph's RADOS Gateway on loopback), each
figure beside a baseline measured in the same run.

Command (from the repository root; `./dev bench remote` runs the same):

    .venv/bin/python bench/remote.py                 # a 1 GiB log; Spark left out
    .venv/bin/python bench/remote.py --quick         # a 64 MiB log, shorter loads
    .venv/bin/python bench/remote.py --spark         # adds the Spark batch read
    .venv/bin/python bench/remote.py --log-mib 256 --seconds 5 --workdir DIR --keep
    .venv/bin/python bench/remote.py --store s3://BUCKET/PREFIX   # an existing store

By default the bench starts its own S3 server (streamlog.testing.s3server.S3Server:
radosgw over a one-OSD in-memory Ceph cluster, in a temporary directory; Ceph's Debian
packages are installed first when missing and we are root) and stops it at the end;
its in-memory OSD is given 4 x --log-mib + 2 GiB (memstore's default, 1 GiB, fills up:
see memstore_capacity).
With --store it uses that store instead, the endpoint and credentials taken from the
AWS_* variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_REGION), under a new prefix below PREFIX whose objects it deletes at the end.

Writes bench/results/remote.json (flat: named numbers, plus "command", "cpu_count",
"machine", "date" and "store", which says which kind of store, never its address),
prints progress on stderr and a table with ratios and targets on stdout.

Data: records of a 16-byte random key and a 100-byte random value (incompressible, so
zstd never pays), timestamps rising by 10 us a record; bench/core.py's record shape.
--log-mib counts key and value bytes (1024 MiB: 9,256,395 records, about 1.22 GB of
segment files on disk with the frames' own bytes).

Figures (each beside its baseline, measured in the same run; the machine is shared and
noisy: read the ratios):

 1. upload_mb_s             the log of --log-mib MiB (2 partitions, segments of 1/16 of
                            it: about 16 sealed ones, a few more as frames do not
                            split, and the two active ones) is built with
                            remote= and durability "local", its tiering job stopped
                            (log.tiering.close()); then one log.tiering.run_once()
                            uploads every sealed segment: each segment object, its index
                            object, one manifest commit naming them all. MB/s of segment
                            bytes over the round's time.
    raw_put_mb_s            baseline: obstore through streamlog's S3Store (no retries),
                            put() of the same segment bytes (read from the files before
                            the clock starts), one after another, as many objects.
 2. append_{remote,local}_{1,64}_{rps,p50_ms,p99_ms}
                            1 and 64 concurrent producers (asyncio tasks, each awaiting
                            log.append of one record in a loop: bench/core.py's
                            concurrent appenders) over a stream of 8 partitions (the
                            partition from the key's hash), for --seconds each, a fresh
                            log each. Latency: from the call to the ack, every append.
                            "remote": durability "remote", remote_commit_ms 10 (the
                            default), fsync "never" (the default under it: a power
                            loss is caught up from the store); "local": the
                            baseline, the same log untiered, fsync "always" (bench/
                            core.py's default), an ack the local fsync.
 3. replay_store_rps        Arrow replay of the whole log, straight from the store:
                            open_log("s3://...") (its open timed apart:
                            store_view_open_s), then for each partition reader(stream, p,
                            from_timestamp_us=the first timestamp).arrow(), rows counted.
    replay_local_rps        baseline: the same readers over the local log (its files
                            just written: the page cache, as the store's memstore is RAM).
                            replay_*_mb_s count key and value bytes (as bench/core.py's
                            MB/s), raw_get_mb_s (figure 5) the objects' bytes, frames
                            and all (about 14% more): that ratio is a conservative one.
                            Before this the store is given the active segments too (a
                            round with lag_max_s near 0 seals them), so both hold every
                            record.
 4. spark_store_rps         (--spark) spark.read.format("streamlog") of the s3:// path
                            (storage.* options) -> format("noop"), local[2], bench/
                            spark.py's session; best of --repeat runs after a warm-up,
                            taking turns with
    spark_local_rps         baseline: the same read of the local log.
 5. restore_*_s             the log closed and its directory deleted, a writable
                            open_log(dir, remote=URL) restores it from the store:
                            restore_open_s (the open: segment objects downloaded and
                            written, indexes filled), restore_first_record_s (open
                            returned -> first Arrow batch of partition 0),
                            restore_to_first_s (their sum: from the call to the first
                            record), restore_to_end_s (from the call to every record
                            read, both partitions).
    reopen_local_*_s        baseline: the same three on the local directory before it
                            is deleted (open_log(dir), no store).
    raw_get_s               baseline: S3Store.get of every segment object the restore
                            downloads, one after another: the bytes alone.
 6. puts_per_s_{1,10,100}   durability "remote", a stream of 1, 10 or 100 partitions,
                            16 producers (asyncio tasks awaiting log.append, each record
                            to the next partition in turn, all partitions in use) for
                            --seconds: tiering.stats["puts"] (manifest generations,
                            each carrying its tail, and sealed segments with their
                            index objects) over the seconds, beside
    puts_bound_per_s        1000 / remote_commit_ms x (1 + 1/64): one PUT per group
                            commit (the generation, its tail its payload), at most one
                            commit per interval, whatever the partition count, and a
                            snapshot of the manifest every 64 generations.

Ratios in the table are the figure over its baseline, so for times (s, ms) above 1 is
slower. The targets are printed PASS or MISS, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    BENCH_DIR, DEFAULT_WORKDIR, GiB, MiB, Row, Stopwatch, Target, add_ratios, attempt,
    dir_bytes,
    fresh_dir, phase, print_table, print_targets, progress, rate, remove,
    write_results)

STREAM = "events"
KEY_BYTES = 16
VALUE_BYTES = 100
TS_STEP_US = 10
REPLAY_PARTITIONS = 2
SEGMENTS_PER_LOG = 16  # sealed segments the upload round takes (8 a partition)
BUILD_BATCH = 65_536  # rows per append_columns while building (batch_records_max)
APPEND_PARTITIONS = 8
PRODUCERS = (1, 64)
PUT_PARTITIONS = (1, 10, 100)
PUT_PRODUCERS = 16
COMMIT_MS = 10  # remote_commit_ms: the default, said explicitly
WARMUP_S = 0.5


# ---------------------------------------------------------------- the store

@dataclass
class Store:
    """Where the bench writes: `url()` under a prefix of its own, the S3 client's
    options, and a description for the results (never an address)."""

    root: str  # s3://BUCKET/PREFIX of this run
    storage_options: dict
    description: str

    def url(self, name: str) -> str:
        return f"{self.root}/{name}"

    def raw(self, name: str):
        """streamlog's S3Store over obstore, no retries: the client library itself."""
        from streamlog.remote.s3 import S3Store
        return S3Store.from_url(self.url(name), self.storage_options or None)

    def open_log(self, path, **options):
        import streamlog
        return streamlog.open_log(str(path), storage_options=self.storage_options or None,
                                  **options)


@contextlib.contextmanager
def store_for(args):
    """The store of this run: our own S3Server in a temporary directory, stopped and
    removed at the end, or the one --store names (this run's objects deleted after)."""
    run = f"bench-remote-{uuid.uuid4().hex[:12]}"
    if args.store:
        store = Store(f"{args.store.rstrip('/')}/{run}", {}, "existing store (--store)")
        try:
            yield store
        finally:
            with phase("delete this run's objects from the store"):
                delete_prefix(store)
        return
    from streamlog.testing.s3server import S3Server
    workdir = Path(tempfile.mkdtemp(prefix="streamlog-bench-s3-"))
    server = S3Server(workdir / "s3")
    try:
        with phase("start Ceph radosgw on loopback (S3Server)"):
            server.start()
            memstore_capacity(server, max(4 * GiB, 4 * args.log_mib * MiB + 2 * GiB))
        yield Store(server.url(run), server.storage_options,
                    "Ceph radosgw on loopback, memstore OSD (S3Server, started by the bench)")
    finally:
        with phase("stop the S3 server"):
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def memstore_capacity(server, nbytes: int) -> None:
    """Give the server's in-memory OSD `nbytes`. Ceph's memstore holds 1 GiB by default
    (memstore_device_bytes), and radosgw frees a deleted object's data only at its
    garbage collection, hours later: a run with a 1 GiB log (its copy in the store, the
    raw-PUT baseline's copy, the tail objects) would fill it, and a full OSD blocks
    every write. memstore reads the setting at each statfs, so it takes effect at once."""
    subprocess.run(["ceph", "-c", str(server.config_path), "--connect-timeout", "30",
                    "config", "set", "osd", "memstore_device_bytes", str(nbytes)],
                   check=True, capture_output=True, timeout=60)


def delete_prefix(store: Store) -> None:
    from streamlog.remote.s3 import S3Store
    raw = S3Store.from_url(store.root, store.storage_options or None)
    for meta in raw.list():
        raw.delete(meta.key)


def stop(log) -> None:
    """Close a log (a tiered one commits what it holds first)."""
    log.close()


# ---------------------------------------------------------------- data

def build_batches(records: int, partitions: int, base_us: int, batch_rows: int):
    """(partition, Arrow record batch of value, key, timestamp) covering `records`
    records, `batch_rows` at a time, the batches dealt to the partitions in turn."""
    import numpy as np
    import pyarrow as pa
    for number, start in enumerate(range(0, records, batch_rows)):
        rows = min(batch_rows, records - start)
        values = _binary(os.urandom(rows * VALUE_BYTES), VALUE_BYTES, rows)
        keys = _binary(os.urandom(rows * KEY_BYTES), KEY_BYTES, rows)
        stamps = base_us + (start + np.arange(rows, dtype=np.int64)) * TS_STEP_US
        yield number % partitions, pa.record_batch(
            {"value": values, "key": keys, "timestamp": pa.array(stamps)})


def _binary(blob: bytes, width: int, rows: int):
    import numpy as np
    import pyarrow as pa
    offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets),
                                                     pa.py_buffer(blob)])


def records_for(log_bytes: int) -> int:
    return log_bytes // (KEY_BYTES + VALUE_BYTES)


# ---------------------------------------------------------------- 1. upload

@dataclass
class Built:
    """The replay log: where it is, its store URL, its first timestamp and size."""

    path: Path
    url: str
    records: int
    base_us: int
    log: object = None  # the writable Log, tiering stopped, until restore closes it


def build_log(work: Path, store: Store, log_bytes: int) -> Built:
    """The log of figure 1, tiering stopped before any segment seals."""
    from tqdm import tqdm
    path, url = work / "replay", store.url("replay")
    remove(path)
    records = records_for(log_bytes)
    base_us = time.time_ns() // 1000 - records * TS_STEP_US
    segment_bytes = max(4096, log_bytes // SEGMENTS_PER_LOG)
    # a frame never spans segments: at least 8 a segment, so each holds about its share
    batch_rows = max(1, min(BUILD_BATCH, segment_bytes // 8 // (KEY_BYTES + VALUE_BYTES)))
    log = store.open_log(path, remote=url, fsync="never", segment_bytes_max=segment_bytes)
    log.tiering.close()  # nothing goes up until the timed round
    log.create_stream(STREAM, partitions=REPLAY_PARTITIONS)
    with tqdm(total=records, unit="rec", unit_scale=True, desc="build the log",
              mininterval=1.0) as bar:
        for partition, batch in build_batches(records, REPLAY_PARTITIONS, base_us,
                                              batch_rows):
            log.append_columns_sync(STREAM, batch, partition=partition)
            bar.update(batch.num_rows)
    return Built(path, url, records, base_us, log)


def sealed_segment_files(built: Built) -> list[Path]:
    """The sealed segment files of the log (all but each partition's newest)."""
    files = []
    for partition_dir in sorted(p for p in built.path.rglob("*") if p.is_dir()):
        logs = sorted(partition_dir.glob("*.log"))
        files += logs[:-1]
    return files


def measure_upload(built: Built, store: Store, figures: dict) -> None:
    from tqdm import tqdm
    files = sealed_segment_files(built)
    total = sum(f.stat().st_size for f in files)
    tiering = built.log.tiering
    with phase(f"tiering round: {len(files)} sealed segments, {total / MiB:,.0f} MiB"):
        watch = Stopwatch()
        uploaded = tiering.run_once()
        seconds = watch.elapsed
    if uploaded != len(files):
        raise RuntimeError(f"the round uploaded {uploaded} segments; {len(files)} are sealed")
    figures.update(upload_segments=uploaded, upload_bytes=total, upload_s=seconds,
                   upload_mb_s=rate(total, seconds) / 1e6)
    raw = store.raw("raw-put")
    datas = [f.read_bytes() for f in files]
    watch = Stopwatch()
    for number, data in enumerate(tqdm(datas, desc="raw S3Store.put", unit="obj")):
        raw.put(f"segment-{number:04d}", data)
    seconds = watch.elapsed
    figures.update(raw_put_s=seconds, raw_put_mb_s=rate(total, seconds) / 1e6)
    del datas
    for number in range(len(files)):  # memstore keeps objects in RAM
        raw.delete(f"segment-{number:04d}")
    progress(f"upload: tiering {figures['upload_mb_s']:.0f} MB/s, raw put"
             f" {figures['raw_put_mb_s']:.0f} MB/s")


def upload_rest(built: Built) -> None:
    """Seal the active segments and upload them, so the store holds every record."""
    tiering = built.log.tiering
    lag = tiering.lag_max_s
    tiering.lag_max_s = 1e-6  # the next full round seals every segment that has data
    try:
        tiering.run_once()
        tiering.run_once()  # what the rolls sealed
    finally:
        tiering.lag_max_s = lag
    for number in range(REPLAY_PARTITIONS):
        end, stored = built.log.end_offset(STREAM, number), tiering.committed_end(
            f"{STREAM}/{number}")
        if stored != end:
            raise RuntimeError(f"partition {number}: the store ends at {stored}, the log"
                               f" at {end}")


# ---------------------------------------------------------------- 3. replay by time

def replay_by_time(log, base_us: int, bar=None) -> int:
    rows = 0
    for number in range(log.partition_count(STREAM)):
        with log.reader(STREAM, number, from_timestamp_us=base_us) as reader:
            for batch in reader.arrow():
                rows += batch.num_rows
                if bar is not None:
                    bar.update(batch.num_rows)
    return rows


def measure_replay(built: Built, store: Store, figures: dict) -> None:
    from tqdm import tqdm
    with phase("give the store the active segments too (untimed)"):
        upload_rest(built)
    watch = Stopwatch()
    view = store.open_log(built.url)
    figures["store_view_open_s"] = watch.elapsed
    try:
        with tqdm(total=built.records, unit="rec", unit_scale=True,
                  desc="replay from the store", mininterval=1.0) as bar:
            watch = Stopwatch()
            rows = replay_by_time(view, built.base_us, bar)
            seconds = watch.elapsed
    finally:
        view.close()
    check_rows("replay from the store", rows, built.records)
    figures["replay_store_rps"] = rate(rows, seconds)
    figures["replay_store_mb_s"] = rate(rows * (KEY_BYTES + VALUE_BYTES), seconds) / 1e6
    with phase("replay the local log"):
        watch = Stopwatch()
        rows = replay_by_time(built.log, built.base_us)
        seconds = watch.elapsed
    check_rows("replay of the local log", rows, built.records)
    figures["replay_local_rps"] = rate(rows, seconds)
    figures["replay_local_mb_s"] = rate(rows * (KEY_BYTES + VALUE_BYTES), seconds) / 1e6
    progress(f"replay: store {figures['replay_store_rps']:,.0f} rec/s, local"
             f" {figures['replay_local_rps']:,.0f} rec/s")


def check_rows(what: str, rows: int, expected: int) -> None:
    if rows != expected:
        raise RuntimeError(f"{what}: {rows:,} rows, expected {expected:,}")


# ---------------------------------------------------------------- 5. restore

def timed_open_and_read(open_log, base_us: int) -> tuple[object, dict]:
    """(the log, {open_s, first_record_s, to_first_s, to_end_s, rows}) of open_log()
    then reading every record by time."""
    watch = Stopwatch()
    log = open_log()
    opened = watch.elapsed
    with log.reader(STREAM, 0, from_timestamp_us=base_us) as reader:
        first = next(iter(reader.arrow()))
    to_first = watch.elapsed
    rows = replay_by_time(log, base_us)
    return log, {"open_s": opened, "first_record_s": to_first - opened,
                 "to_first_s": to_first, "to_end_s": watch.elapsed, "rows": rows,
                 "first_rows": first.num_rows}


def measure_restore(built: Built, store: Store, figures: dict) -> None:
    from tqdm import tqdm
    stop(built.log)
    built.log = None
    with phase("local baseline: reopen the directory and read it all"):
        log, local = timed_open_and_read(lambda: store.open_log(built.path), built.base_us)
        stop(log)
    check_rows("local reopen", local["rows"], built.records)
    for name in ("open_s", "first_record_s", "to_first_s", "to_end_s"):
        figures[f"reopen_local_{name}"] = local[name]
    keys = segment_keys(store)
    raw = store.raw("replay")
    watch = Stopwatch()
    nbytes = sum(len(raw.get(key)) for key in tqdm(keys, desc="raw S3Store.get", unit="obj"))
    figures.update(raw_get_s=watch.elapsed, raw_get_bytes=nbytes,
                   raw_get_mb_s=rate(nbytes, watch.elapsed) / 1e6)
    remove(built.path)
    with phase("restore: open_log(deleted directory, remote=URL), read it all"):
        log, restored = timed_open_and_read(
            lambda: store.open_log(built.path, remote=built.url), built.base_us)
        info = log.info().get("restored") or {}
        stop(log)
    check_rows("restored log", restored["rows"], built.records)
    if not info:
        raise RuntimeError("the open did not restore (info() has no 'restored')")
    for name in ("open_s", "first_record_s", "to_first_s", "to_end_s"):
        figures[f"restore_{name}"] = restored[name]
    figures["restore_bytes"] = info.get("bytes")
    figures["restore_segments"] = info.get("segments")
    progress(f"restore: open {restored['open_s']:.2f} s, first record after"
             f" {restored['to_first_s']:.2f} s, all after {restored['to_end_s']:.2f} s;"
             f" raw get {figures['raw_get_s']:.2f} s")


def segment_keys(store: Store) -> list[str]:
    """The segment objects the newest manifest names."""
    from streamlog.remote import manifest as manifests
    newest = manifests.latest(store.raw("replay"))
    return [segment.key for part in newest.partitions.values() for segment in part.segments]


# ---------------------------------------------------------------- 4. Spark

def measure_spark(built: Built, store: Store, figures: dict, repeat: int) -> None:
    from spark import interleaved, start_spark
    with phase("start Spark (local[2])"):
        spark = start_spark()
    try:
        def reader(path: str, options: dict):
            source = spark.read.format("streamlog").option("path", path).option(
                "stream", STREAM)
            for name, value in options.items():
                source = source.option(f"storage.{name}", str(value))
            return source

        store_source = reader(built.url, store.storage_options)
        local_source = reader(str(built.path), {})
        for name, source in (("store", store_source), ("local", local_source)):
            count = source.load().count()
            check_rows(f"spark read ({name})", count, built.records)
        with phase(f"Spark reads, {repeat} runs each after a warm-up, taking turns"):
            results = interleaved(repeat, {
                name: (lambda _run, s=source: s.load().write.format("noop")
                       .mode("overwrite").save())
                for name, source in (("store", store_source), ("local", local_source))})
        for name in ("store", "local"):
            figures[f"spark_{name}_rps"] = rate(built.records, results[name][0])
            figures[f"spark_{name}_median_rps"] = rate(built.records, results[name][1])
        progress(f"spark: store {figures['spark_store_rps']:,.0f} rows/s, local"
                 f" {figures['spark_local_rps']:,.0f} rows/s")
    finally:
        spark.stop()


# ---------------------------------------------------------------- 2. appends

async def producers_run(log, producers: int, seconds: float, partitions: int | None,
                        bar=None) -> tuple[int, float, list[float]]:
    """`producers` tasks each awaiting log.append of one record in a loop for
    `seconds` (after WARMUP_S not counted); returns (records, seconds, latencies in s).
    `partitions`: each record to the next partition in turn; None: by the key's hash."""
    latencies: list[float] = []
    clock = time.perf_counter
    start = clock() + WARMUP_S
    stop_at = start + seconds
    value = os.urandom(VALUE_BYTES)

    async def producer(number: int) -> None:
        sent = 0
        while (now := clock()) < stop_at:
            key = b"%06d-%09d" % (number, sent)
            partition = None if partitions is None else (number + sent) % partitions
            await log.append(STREAM, value, key=key, partition=partition)
            if now >= start:
                latencies.append(clock() - now)
                if bar is not None:
                    bar.update(1)
            sent += 1

    await asyncio.gather(*(producer(n) for n in range(producers)))
    return len(latencies), clock() - start, latencies


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def measure_appends(work: Path, store: Store, figures: dict, seconds: float) -> None:
    from tqdm import tqdm
    for producers in PRODUCERS:
        for mode in ("local", "remote"):
            path = work / f"append-{mode}-{producers}"
            remove(path)
            # remote: open_log's default fsync under it ("never": the store holds the
            # ack); local: fsync "always"
            options = {"remote": store.url(path.name), "durability": "remote",
                       "remote_commit_ms": COMMIT_MS} if mode == "remote" else {
                           "fsync": "always"}
            log = store.open_log(path, **options)
            try:
                log.create_stream(STREAM, partitions=APPEND_PARTITIONS)
                with tqdm(desc=f"{producers} producers, durability {mode}", unit="rec",
                          mininterval=1.0) as bar:
                    count, spent, latencies = asyncio.run(
                        producers_run(log, producers, seconds, None, bar))
            finally:
                stop(log)
            remove(path)
            latencies.sort()
            name = f"append_{mode}_{producers}"
            figures[f"{name}_rps"] = rate(count, spent)
            figures[f"{name}_p50_ms"] = percentile(latencies, 0.50) * 1000
            figures[f"{name}_p99_ms"] = percentile(latencies, 0.99) * 1000
            progress(f"  {figures[f'{name}_rps']:,.0f} rec/s, p50"
                     f" {figures[f'{name}_p50_ms']:.1f} ms, p99"
                     f" {figures[f'{name}_p99_ms']:.1f} ms")


# ---------------------------------------------------------------- 6. PUTs per second

def measure_puts(work: Path, store: Store, figures: dict, seconds: float) -> None:
    from tqdm import tqdm
    from streamlog.remote.manifest import SNAPSHOT_EVERY
    figures["puts_bound_per_s"] = 1000 / COMMIT_MS * (1 + 1 / SNAPSHOT_EVERY)
    for partitions in PUT_PARTITIONS:
        path = work / f"puts-{partitions}"
        remove(path)
        log = store.open_log(path, remote=store.url(path.name),
                             durability="remote", remote_commit_ms=COMMIT_MS)
        try:
            log.create_stream(STREAM, partitions=partitions)
            stats = log.tiering.stats

            async def load(bar):
                await asyncio.sleep(0)
                before = dict(stats)  # (the warm-up's commits are counted in the delta:
                watch = Stopwatch()   # over its seconds too)
                count, _spent, _ = await producers_run(log, PUT_PRODUCERS, seconds,
                                                       partitions, bar)
                return count, dict(stats), before, watch.elapsed

            with tqdm(desc=f"{partitions} partitions, durability remote", unit="rec",
                      mininterval=1.0) as bar:
                count, after, before, spent = asyncio.run(load(bar))
        finally:
            stop(log)
        remove(path)
        name = f"puts_{partitions}"
        figures[f"{name}_per_s"] = rate(after["puts"] - before["puts"], spent)
        figures[f"{name}_commits_per_s"] = rate(after["commits"] - before["commits"], spent)
        figures[f"{name}_rps"] = rate(count, spent - WARMUP_S)
        progress(f"  {figures[f'{name}_per_s']:.0f} PUTs/s,"
                 f" {figures[f'{name}_commits_per_s']:.0f} commits/s,"
                 f" {figures[f'{name}_rps']:,.0f} rec/s")


# ---------------------------------------------------------------- report

VS_RAW_PUT = {"vs baseline": "raw_put_mb_s"}
ROWS = [
    Row("1. upload round, sealed segments", "upload_mb_s", "MB/s", VS_RAW_PUT),
    Row("   raw S3Store.put, same bytes", "raw_put_mb_s", "MB/s"),
    *[row for producers in PRODUCERS for row in (
        Row(f"2. remote, {producers} producers", f"append_remote_{producers}_rps", "rec/s",
            {"vs baseline": f"append_local_{producers}_rps"}),
        Row(f"   local, {producers} producers", f"append_local_{producers}_rps", "rec/s"),
        Row(f"   remote, {producers} producers, p50", f"append_remote_{producers}_p50_ms",
            "ms", {"vs baseline": f"append_local_{producers}_p50_ms"}),
        Row(f"   local, {producers} producers, p50", f"append_local_{producers}_p50_ms",
            "ms"),
        Row(f"   remote, {producers} producers, p99", f"append_remote_{producers}_p99_ms",
            "ms", {"vs baseline": f"append_local_{producers}_p99_ms"}),
        Row(f"   local, {producers} producers, p99", f"append_local_{producers}_p99_ms",
            "ms"))],
    Row("3. Arrow replay by time, store", "replay_store_rps", "rec/s",
        {"vs baseline": "replay_local_rps"}),
    Row("   Arrow replay by time, local", "replay_local_rps", "rec/s"),
    Row("   replay from the store", "replay_store_mb_s", "MB/s",
        {"vs baseline": "replay_local_mb_s", "vs raw get": "raw_get_mb_s"}),
    Row("   replay of the local log", "replay_local_mb_s", "MB/s"),
    Row("   raw S3Store.get, segments", "raw_get_mb_s", "MB/s"),
    Row("   open_log(s3://...) view", "store_view_open_s", "s"),
    Row("4. Spark read, s3://", "spark_store_rps", "rows/s",
        {"vs baseline": "spark_local_rps"}),
    Row("   Spark read, local log", "spark_local_rps", "rows/s"),
    Row("5. restore: open (download)", "restore_open_s", "s",
        {"vs baseline": "reopen_local_open_s"}),
    Row("   restore: open -> first record", "restore_first_record_s", "s",
        {"vs baseline": "reopen_local_first_record_s"}),
    Row("   restore: call -> first record", "restore_to_first_s", "s",
        {"vs baseline": "reopen_local_to_first_s"}),
    Row("   restore: call -> all records", "restore_to_end_s", "s",
        {"vs baseline": "reopen_local_to_end_s", "vs raw get": "raw_get_s"}),
    Row("   local reopen: open", "reopen_local_open_s", "s"),
    Row("   local reopen: open -> first", "reopen_local_first_record_s", "s"),
    Row("   local reopen: call -> first", "reopen_local_to_first_s", "s"),
    Row("   local reopen: call -> all", "reopen_local_to_end_s", "s"),
    Row("   raw S3Store.get, segments", "raw_get_s", "s"),
    Row("   restored bytes", "restore_bytes", "bytes"),
    *[Row(f"6. PUTs/s, {partitions} partitions", f"puts_{partitions}_per_s", "PUT/s",
          {"vs bound": "puts_bound_per_s"}) for partitions in PUT_PARTITIONS],
    Row("   bound: 1000 / commit ms x 65/64", "puts_bound_per_s", "PUT/s"),
    *[Row(f"   records/s, {partitions} partitions", f"puts_{partitions}_rps", "rec/s")
      for partitions in PUT_PARTITIONS],
    Row("log size (local, on disk)", "log_bytes", "bytes"),
]
COLUMNS = ["vs baseline", "vs raw get", "vs bound"]

TARGETS = [
    Target("upload round >= 0.8x raw S3Store.put MB/s",
           lambda f: f["upload_mb_s"] >= 0.8 * f["raw_put_mb_s"]),
    Target("durability remote: p99 < 30 ms at 1 producer (loopback Ceph)",
           lambda f: f["append_remote_1_p99_ms"] < 30),
    Target("durability remote: p99 < 30 ms at 64 producers (loopback Ceph)",
           lambda f: f["append_remote_64_p99_ms"] < 30),
    Target("durability remote: >= 0.5x local's rec/s at 64 producers",
           lambda f: f["append_remote_64_rps"] >= 0.5 * f["append_local_64_rps"]),
    Target("Arrow replay by time from the store >= 0.7x the local log's",
           lambda f: f["replay_store_rps"] >= 0.7 * f["replay_local_rps"]),
    Target("Spark read from s3:// >= 0.7x the local log's",
           lambda f: f["spark_store_rps"] >= 0.7 * f["spark_local_rps"]),
    Target("PUTs/s within 1000/remote_commit_ms x 65/64 at 1, 10 and 100 partitions",
           lambda f: all(f[f"puts_{p}_per_s"] <= f["puts_bound_per_s"]
                         for p in PUT_PARTITIONS)),
]

RATIOS = {
    "upload_vs_raw_put": ("upload_mb_s", "raw_put_mb_s"),
    "append_64_vs_local": ("append_remote_64_rps", "append_local_64_rps"),
    "append_1_vs_local": ("append_remote_1_rps", "append_local_1_rps"),
    "replay_store_vs_local": ("replay_store_rps", "replay_local_rps"),
    "spark_store_vs_local": ("spark_store_rps", "spark_local_rps"),
    "restore_vs_raw_get": ("raw_get_s", "restore_to_end_s"),
}


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a 64 MiB log and 3 s loads (default: 1 GiB and 10 s)")
    parser.add_argument("--log-mib", type=int, help="size of the replay log in MiB")
    parser.add_argument("--seconds", type=float, help="each append and PUT load's length")
    parser.add_argument("--spark", action="store_true", help="measure the Spark read too")
    parser.add_argument("--repeat", type=int, default=3, help="Spark runs each (best of)")
    parser.add_argument("--store", help="s3://BUCKET/PREFIX of an existing store (endpoint "
                        "and credentials from AWS_*); default: start our own")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "remote")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--skip", default="", help="sections to leave out, by number "
                        "(e.g. 2,6): 1 upload, 2 appends, 3 replay, 5 restore, 6 puts "
                        "(3 and 5 need 1)")
    args = parser.parse_args(argv)
    if args.log_mib is None:
        args.log_mib = 64 if args.quick else 1024
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 10.0
    args.skip = {int(part) for part in args.skip.split(",") if part.strip()}
    return args


def run(args, store: Store) -> tuple[dict, list[str]]:
    work = fresh_dir(args.workdir.resolve())
    figures: dict = {"log_mib": args.log_mib, "key_bytes": KEY_BYTES,
                     "value_bytes": VALUE_BYTES, "seconds": args.seconds,
                     "remote_commit_ms": COMMIT_MS, "append_partitions": APPEND_PARTITIONS,
                     "put_producers": PUT_PRODUCERS}
    failures: list[str] = []
    built = None
    try:
        if 1 not in args.skip:
            with phase(f"build a {args.log_mib} MiB log, tiering stopped"):
                built = build_log(work, store, args.log_mib * MiB)
            figures["records"] = built.records
            figures["segment_bytes_max"] = max(4096, args.log_mib * MiB // SEGMENTS_PER_LOG)
            figures["log_bytes"] = dir_bytes(built.path)
            attempt("upload", lambda: measure_upload(built, store, figures), failures)
            if 3 not in args.skip:
                attempt("replay", lambda: measure_replay(built, store, figures), failures)
            if 5 not in args.skip:
                attempt("restore", lambda: measure_restore(built, store, figures),
                        failures)
            if args.spark:  # (after the restore: the local log is closed by then)
                attempt("spark", lambda: measure_spark(built, store, figures, args.repeat),
                        failures)
        if 2 not in args.skip:
            attempt("appends", lambda: measure_appends(work, store, figures, args.seconds),
                    failures)
        if 6 not in args.skip:
            attempt("puts", lambda: measure_puts(work, store, figures, args.seconds),
                    failures)
    finally:
        if built is not None and built.log is not None:
            stop(built.log)
        if not args.keep:
            remove(work)
    add_ratios(figures, RATIOS)
    return figures, failures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with store_for(args) as store:
        figures, failures = run(args, store)
    figures["store"] = store.description
    path = write_results("remote", figures)
    print()
    print_table(figures, ROWS, COLUMNS)
    print("(ratios are the figure over its baseline: for s and ms, above 1 is slower)")
    print_targets(figures, TARGETS)
    # (_common.finish, but naming the file from the repository root, not the machine's)
    print(f"\nwrote {path.relative_to(BENCH_DIR.parent)}")
    if failures:
        print(f"FAILED: {', '.join(failures)} (tracebacks above, on stderr)")
        sys.exit(1)


if __name__ == "__main__":
    main()
