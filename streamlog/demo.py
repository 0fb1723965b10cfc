"""The main job: a tour of the log on an embedded default (a directory, no server).

    python -m streamlog.demo [--log data/demo] [--records 200000] [--partitions 4]

Appends a realistic click stream (event time with jitter, so some records arrive out of
order and some share a timestamp) with a progress display, replays one partition from a
mid-stream time by the high-water-mark rule, follows the live tail while more records are
appended, reopens the log, and prints what it did and how fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import time

import streamlog
from streamlog.cli.common import progress_bar

EPOCH_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
PAGES = ["/", "/search", "/product", "/cart", "/checkout", "/help"]


def make_events(count: int, seed: int, start_us: int = EPOCH_US):
    """(keys, values, timestamps): users pick pages; event time advances ~50 µs a record
    with jitter of up to 2 ms back (late events) and repeats (same microsecond)."""
    rng = random.Random(seed)
    keys, values, timestamps = [], [], []
    clock = start_us
    for i in range(count):
        clock += rng.choice((0, 0, 50, 50, 100))
        late = rng.random() < 0.05
        timestamp = clock - rng.randrange(2000) if late else clock
        user = f"user-{int(rng.paretovariate(1.2)) % 5000:05d}"
        keys.append(user.encode())
        values.append(json.dumps({"user": user, "page": rng.choice(PAGES), "seq": i,
                                  "ms": rng.randrange(5, 900)}).encode())
        timestamps.append(timestamp)
    return keys, values, timestamps


async def append_phase(log, stream: str, keys, values, timestamps, batch: int) -> float:
    started = time.perf_counter()
    with progress_bar("append", len(values)) as bar:
        for at in range(0, len(values), batch):
            await log.append_batch(stream, values[at:at + batch], keys=keys[at:at + batch],
                                   timestamps_us=timestamps[at:at + batch])
            bar.update(len(values[at:at + batch]))
    return time.perf_counter() - started


def replay_phase(log, stream: str, partitions: int, from_us: int) -> dict:
    out = {"from_timestamp_us": from_us, "partitions": {}}
    started = time.perf_counter()
    seek_ms = []
    total = 0
    for partition in range(partitions):
        seek_started = time.perf_counter()
        reader = log.reader(stream, partition, from_timestamp_us=from_us)
        records = iter(reader.records())
        first = next(records, None)
        seek_ms.append((time.perf_counter() - seek_started) * 1000)
        count = 0 if first is None else 1 + sum(1 for _ in records)
        total += count
        out["partitions"][partition] = {
            "first_offset": None if first is None else first.offset,
            "first_timestamp_us": None if first is None else first.timestamp_us,
            "records": count}
    seconds = time.perf_counter() - started
    arrow_started = time.perf_counter()
    arrow_rows = sum(batch.num_rows for p in range(partitions)
                     for batch in log.reader(stream, p).arrow())
    arrow_seconds = time.perf_counter() - arrow_started
    out.update(records=total, records_per_s=round(total / max(seconds, 1e-9)),
               seek_ms_max=round(max(seek_ms), 3), arrow_rows=arrow_rows,
               arrow_rows_per_s=round(arrow_rows / max(arrow_seconds, 1e-9)))
    return out


async def follow_phase(log, stream: str, extra: int) -> dict:
    """Follow partition 0 from its end while a producer appends `extra` records."""
    start = log.end_offset(stream, 0)
    keys, values, timestamps = make_events(extra, seed=7, start_us=EPOCH_US + 10**9)
    latencies, received = [], 0
    sent_at: list[float] = []  # when append i was called; partition 0 keeps their order

    async def follower() -> None:
        nonlocal received
        async for record in log.reader(stream, 0, from_offset=start, follow=True):
            latencies.append(time.perf_counter() - sent_at[received])
            received += 1
            if received >= extra:
                return

    task = asyncio.create_task(follower())
    await asyncio.sleep(0.05)
    for i in range(extra):
        sent_at.append(time.perf_counter())
        await log.append(stream, values[i], key=keys[i], timestamp_us=timestamps[i],
                         partition=0)
    await asyncio.wait_for(task, timeout=30)
    latencies.sort()
    return {"followed": received, "from_offset": start,
            "latency_ms_p50": round(latencies[len(latencies) // 2] * 1000, 3),
            "latency_ms_max": round(latencies[-1] * 1000, 3)}


async def run(args) -> dict:
    if not args.keep:
        shutil.rmtree(args.log, ignore_errors=True)
    keys, values, timestamps = make_events(args.records, seed=args.seed)
    log = streamlog.open_log(args.log, fsync=args.fsync)
    try:
        log.create_stream(args.stream, partitions=args.partitions)
        append_s = await append_phase(log, args.stream, keys, values, timestamps, args.batch)
        stats = log.stats()
        middle = sorted(timestamps)[len(timestamps) // 2]
        replay = replay_phase(log, args.stream, args.partitions, middle)
        follow = await follow_phase(log, args.stream, args.follow)
    finally:
        await log.aclose()
    reopen_started = time.perf_counter()
    with streamlog.open_log(args.log) as reopened:
        reopen_s = time.perf_counter() - reopen_started
        info = reopened.info()
    fsyncs = sum(s["fsyncs"] for s in stats.values())
    return {
        "log": args.log, "stream": args.stream, "partitions": args.partitions,
        "fsync": args.fsync, "appended": args.records,
        "append_records_per_s": round(args.records / append_s),
        "append_fsyncs": fsyncs,
        "replay": replay, "follow": follow, "reopen_s": round(reopen_s, 4),
        "end_offsets": {p["partition"]: p["end_offset"]
                        for p in info["streams"][args.stream]["partitions"]},
        "bytes": sum(p["bytes"] for p in info["streams"][args.stream]["partitions"]),
    }


def report(result: dict) -> None:
    replay, follow = result["replay"], result["follow"]
    print(f"log {result['log']}: stream {result['stream']!r}, {result['partitions']} "
          f"partitions, fsync={result['fsync']}, {result['bytes'] / 1e6:.1f} MB on disk")
    print(f"  appended {result['appended']:,} records at {result['append_records_per_s']:,}"
          f" rec/s with {result['append_fsyncs']} fsyncs (group commit)")
    print(f"  replayed from high-water mark >= {replay['from_timestamp_us']} µs: "
          f"{replay['records']:,} records at {replay['records_per_s']:,} rec/s "
          f"(seek <= {replay['seek_ms_max']} ms); whole log as Arrow at "
          f"{replay['arrow_rows_per_s']:,} rows/s")
    for partition, found in replay["partitions"].items():
        print(f"    partition {partition}: starts at offset {found['first_offset']} "
              f"(timestamp {found['first_timestamp_us']}), {found['records']:,} records")
    print(f"  followed the live tail: {follow['followed']} records appended after the "
          f"reader reached the end, latency p50 {follow['latency_ms_p50']} ms, "
          f"max {follow['latency_ms_max']} ms")
    print(f"  reopened in {result['reopen_s'] * 1000:.1f} ms; end offsets "
          f"{result['end_offsets']}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamlog.demo",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", default="data/demo", help="log directory (default data/demo)")
    parser.add_argument("--stream", default="clicks")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2000, help="records per append_batch")
    parser.add_argument("--follow", type=int, default=500,
                        help="records appended while following the tail")
    parser.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="append to an existing demo log")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.records < 2 or args.partitions < 1 or args.batch < 1 or args.follow < 1:
        parser.error("--records must be >= 2; --partitions, --batch, --follow >= 1")
    try:
        result = asyncio.run(run(args))
    except streamlog.StreamLogError as error:
        print(f"streamlog demo: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
