"""Producer benchmark: single records at group-commit speed, against batched
append measured in the same run.

Command (from the repository root):

    .venv/bin/python bench/producer.py                    # 1,000,000 records
    .venv/bin/python bench/producer.py --records 200000   # a shorter run

Writes bench/results/producer.json (flat: named numbers, plus "command" and "cpu_count"),
prints progress on stderr and a table with ratios and the target on stdout.

Data: bench/core.py's dataset (16-byte random keys, 100-byte random values, rising
timestamps with jitter). Every figure uses fsync="always", one stream with one partition
(so every key maps to partition 0 and one writer thread does every commit), a fresh log.

  append_batched_rps         the baseline: append_batch of 1,000 records, each awaited
                             before the next (bench/core.py's figure, same function).
  append_producer_rps        one thread calls producer.send(value, key=, timestamp_us=)
                             once per record and drops the handle (as a service that
                             checks producer.stats or flush() does), then flush(); from
                             the first send to flush()'s return. Checked after: stats say
                             every record was acknowledged, the log's end offset is N and
                             its first and last records are the dataset's.
  append_producer_kept_rps   the same, keeping every handle in a list; after the timing
                             each handle's offset is checked (record i at offset i). The
                             difference from append_producer_rps is mostly Python's
                             cyclic garbage collector walking the million live handles.
  append_producer_threads_rps  --threads threads (default 4) each sending a contiguous
                             share of the records at once, handles dropped, then flush().
  append_producer_async_rps  one coroutine awaiting producer.send_async per record (no
                             task per record), handles dropped, then flush_async().
  append_concurrent_rps      what single records cost without a producer: 1,000 asyncio
                             tasks each awaiting log.append (bench/core.py's figure), on
                             the first --concurrent-records records (default 50,000).
  *_cpu_us                   process CPU seconds (all threads) per record: the
                             back-of-envelope cost beside each rate.

Target: append_producer_rps >= 0.2x append_batched_rps. The machine is shared and noisy:
read the ratios, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, Row, Stopwatch, Target, attempt, fresh_dir, phase, progress, publish,
    rate, ratio, remove)
from core import (  # noqa: E402  (the same dataset and baselines as bench/core.py)
    BATCH, KEY_BYTES, STREAM, VALUE_BYTES, Dataset, append_batched, append_concurrent,
    make_dataset)

import streamlog  # noqa: E402

CONCURRENT_SECONDS_MAX = 60.0


def fresh_log(path: Path):
    remove(path)
    log = streamlog.open_log(str(path), fsync="always")
    log.create_stream(STREAM, partitions=1)
    return log


def check_log(log, data: Dataset, producer, *, ordered: bool) -> None:
    """Every record acknowledged, none failed, and the log holds them: the first and
    last in place (one sender), or every value once (several)."""
    n = len(data)
    if producer.stats["acknowledged"] != n or producer.stats["failed"]:
        raise RuntimeError(f"producer stats {producer.stats} for {n:,} records")
    if log.end_offset(STREAM, 0) != n:
        raise RuntimeError(f"end offset {log.end_offset(STREAM, 0):,}, not {n:,}")
    if not ordered:
        if sorted(r.value for r in log.reader(STREAM, 0)) != sorted(data.values):
            raise RuntimeError("the log does not hold exactly the records sent")
        return
    for offset in (0, n - 1):
        (record,) = log.reader(STREAM, 0, from_offset=offset, to_offset=offset + 1)
        if (record.value, record.key) != (data.values[offset], data.keys[offset]):
            raise RuntimeError(f"record {offset} is not the dataset's")


def timed_run(path: Path, data: Dataset, send_all,
              ordered: bool) -> tuple[float, float, object]:
    """(seconds, CPU seconds, what send_all returned) of send_all(producer) + flush."""
    log = fresh_log(path)
    try:
        producer = log.producer(STREAM)
        cpu, watch = time.process_time(), Stopwatch()
        kept = send_all(producer)
        producer.flush()
        seconds, cpu = watch.elapsed, time.process_time() - cpu
        check_log(log, data, producer, ordered=ordered)
        producer.close()
    finally:
        log.close()
    return seconds, cpu, kept


def send_dropping(data: Dataset):
    def send_all(producer) -> None:
        send = producer.send
        for value, key, timestamp_us in zip(data.values, data.keys, data.timestamps_us):
            send(value, key=key, timestamp_us=timestamp_us)
    return send_all


def send_keeping(data: Dataset):
    def send_all(producer) -> list:
        send = producer.send
        return [send(value, key=key, timestamp_us=timestamp_us)
                for value, key, timestamp_us in zip(data.values, data.keys,
                                                    data.timestamps_us)]
    return send_all


def send_threads(data: Dataset, threads: int):
    def send_all(producer) -> None:
        def run(start: int, stop: int) -> None:
            send = producer.send
            for i in range(start, stop):
                send(data.values[i], key=data.keys[i], timestamp_us=data.timestamps_us[i])
        share = -(-len(data) // threads)
        workers = [threading.Thread(target=run, args=(start, min(start + share, len(data))))
                   for start in range(0, len(data), share)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return send_all


async def send_async_all(path: Path, data: Dataset) -> tuple[float, float]:
    log = fresh_log(path)
    try:
        producer = log.producer(STREAM)
        cpu, watch = time.process_time(), Stopwatch()
        send = producer.send_async
        for value, key, timestamp_us in zip(data.values, data.keys, data.timestamps_us):
            await send(value, key=key, timestamp_us=timestamp_us)
        await producer.flush_async()
        seconds, cpu = watch.elapsed, time.process_time() - cpu
        check_log(log, data, producer, ordered=True)
        await producer.aclose()
    finally:
        log.close()
    return seconds, cpu


def record(figures: dict, name: str, n: int, seconds: float, cpu: float) -> None:
    figures[f"{name}_rps"] = rate(n, seconds)
    figures[f"{name}_cpu_us"] = cpu / n * 1e6
    progress(f"{name}: {figures[f'{name}_rps']:,.0f} rec/s, "
             f"{figures[f'{name}_cpu_us']:.2f} us CPU per record")


def measure_batched(work: Path, data: Dataset, figures: dict) -> None:
    path = work / "batched"
    remove(path)
    with phase(f"baseline: append_batch x {len(data) // BATCH:,} of {BATCH:,}"):
        cpu = time.process_time()
        seconds = asyncio.run(append_batched(path, data, "always"))
        record(figures, "append_batched", len(data), seconds, time.process_time() - cpu)
    remove(path)


def measure_producer(work: Path, data: Dataset, figures: dict, name: str, send_all,
                     ordered: bool = True) -> None:
    with phase(f"{name}: {len(data):,} sends"):
        seconds, cpu, kept = timed_run(work / name, data, send_all, ordered)
    if kept is not None:
        offsets = [handle.result(0).offset for handle in kept]
        if offsets != list(range(len(data))):
            raise RuntimeError("a kept handle does not hold its record's offset")
    record(figures, name, len(data), seconds, cpu)
    remove(work / name)


def measure_async(work: Path, data: Dataset, figures: dict) -> None:
    with phase(f"append_producer_async: {len(data):,} send_async"):
        seconds, cpu = asyncio.run(send_async_all(work / "async", data))
    record(figures, "append_producer_async", len(data), seconds, cpu)
    remove(work / "async")


def measure_concurrent(work: Path, data: Dataset, figures: dict, count: int) -> None:
    path = work / "concurrent"
    remove(path)
    with phase(f"no producer: 1,000 tasks awaiting log.append, {count:,} records"):
        cpu = time.process_time()
        done, seconds = asyncio.run(append_concurrent(path, data, count,
                                                      CONCURRENT_SECONDS_MAX))
        record(figures, "append_concurrent", done, seconds, time.process_time() - cpu)
    remove(path)


VS = {"vs batched": "append_batched_rps"}
ROWS = [
    Row("append_batch of 1,000, awaited", "append_batched_rps", "rec/s", VS),
    Row("producer.send, handles dropped", "append_producer_rps", "rec/s", VS),
    Row("producer.send, handles kept", "append_producer_kept_rps", "rec/s", VS),
    Row("producer.send, threads", "append_producer_threads_rps", "rec/s", VS),
    Row("producer.send_async", "append_producer_async_rps", "rec/s", VS),
    Row("1,000 tasks of log.append", "append_concurrent_rps", "rec/s", VS),
    Row("CPU per record, batched", "append_batched_cpu_us", "us"),
    Row("CPU per record, producer", "append_producer_cpu_us", "us"),
    Row("CPU per record, handles kept", "append_producer_kept_cpu_us", "us"),
    Row("CPU per record, threads", "append_producer_threads_cpu_us", "us"),
    Row("CPU per record, send_async", "append_producer_async_cpu_us", "us"),
    Row("CPU per record, 1,000 tasks", "append_concurrent_cpu_us", "us"),
]

TARGETS = [
    Target("producer.send >= 0.2x batched append",
           lambda f: f["append_producer_vs_batched"] >= 0.2),
    Target("producer.send, handles kept >= 0.2x batched append",
           lambda f: f["append_producer_kept_vs_batched"] >= 0.2),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=4,
                        help="sender threads of append_producer_threads_rps (default 4)")
    parser.add_argument("--concurrent-records", type=int, default=50_000,
                        help="records of the no-producer figure (default 50,000; 0 skips)")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> tuple[dict, list[str]]:
    work = fresh_dir(args.workdir.resolve() / "producer")
    figures: dict = {"records": args.records, "key_bytes": KEY_BYTES,
                     "value_bytes": VALUE_BYTES, "batch_records": BATCH,
                     "threads": args.threads}
    failures: list[str] = []
    try:
        with phase(f"generate {args.records:,} records"):
            data = make_dataset(args.records, args.seed)
        steps = [
            ("batched", lambda: measure_batched(work, data, figures)),
            ("producer", lambda: measure_producer(work, data, figures, "append_producer",
                                                  send_dropping(data))),
            ("producer, handles kept", lambda: measure_producer(
                work, data, figures, "append_producer_kept", send_keeping(data))),
            ("producer, threads", lambda: measure_producer(
                work, data, figures, "append_producer_threads",
                send_threads(data, args.threads), ordered=False)),
            ("producer, async", lambda: measure_async(work, data, figures)),
        ]
        if args.concurrent_records:
            steps.append(("no producer", lambda: measure_concurrent(
                work, data, figures, min(args.concurrent_records, len(data)))))
        for name, step in steps:
            attempt(name, step, failures)
    finally:
        remove(work)
        if args.workdir.resolve() == DEFAULT_WORKDIR:
            with contextlib.suppress(OSError):
                DEFAULT_WORKDIR.rmdir()  # only when empty
    for name in ("append_producer", "append_producer_kept", "append_producer_threads",
                 "append_producer_async", "append_concurrent"):
        value = ratio(figures.get(f"{name}_rps"), figures.get("append_batched_rps"))
        if value is not None:
            figures[f"{name}_vs_batched"] = value
    return figures, failures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    figures, failures = run(args)
    publish("producer", figures, failures, ROWS, list(VS), TARGETS)


if __name__ == "__main__":
    main()
