"""The process that test_crash_kill.py kills: appends until SIGKILL, reporting each step.

Usage: python crash_writer.py LOG ROUND SEED

Opens LOG with fsync="always" and appends with a few concurrent tasks (so group commit
merges them), singles and batches of random sizes, keys and timestamps. Every append
is numbered by `seq`; its content is a pure function of (SEED, ROUND, seq)
(`make_call`), so the parent can regenerate any record it reads back, and every value
starts with (ROUND, seq, row) so a record names its origin. On stdout, one flushed line
per event:

    READY <end offset>          the log is open (recovery done)
    B <seq>                     append seq is about to be submitted
    A <seq> <first> <count>     append seq was acknowledged at offsets first..first+count-1

A kill can come at any moment, including during the open.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import struct
import sys

import streamlog

STREAM = "events"
ORIGIN = struct.Struct(">III")  # round, seq, row
SEGMENT_BYTES_MAX = 256 * 1024
TASKS = 3
EPOCH_US = 1_700_000_000_000_000


def make_call(seed: int, round_number: int, seq: int):
    """(single, values, keys, timestamps_us) of append `seq` of a round: deterministic."""
    rng = random.Random((seed << 48) ^ (round_number << 32) ^ seq)
    single = rng.random() < 0.5
    count = 1 if single else rng.randint(2, 8)
    values, keys, timestamps = [], [], []
    for row in range(count):
        size = rng.randint(0, 400) if rng.random() < 0.95 else rng.randint(400, 6000)
        values.append(ORIGIN.pack(round_number, seq, row) + rng.randbytes(size))
        keys.append(None if rng.random() < 0.3 else rng.randbytes(rng.randint(1, 12)))
        timestamps.append(EPOCH_US + round_number * 10**9 + seq * 1000
                          + rng.randint(-5000, 5000))
    return single, values, keys, timestamps


async def append_forever(log: streamlog.Log, seed: int, round_number: int,
                         numbers: itertools.count) -> None:
    while True:
        seq = next(numbers)
        single, values, keys, timestamps = make_call(seed, round_number, seq)
        print(f"B {seq}", flush=True)
        if single:
            position = await log.append(STREAM, values[0], key=keys[0],
                                        timestamp_us=timestamps[0])
            first = position.offset
        else:
            result = await log.append_batch(STREAM, values, keys=keys,
                                            timestamps_us=timestamps)
            first = result.ranges[0][0]
        print(f"A {seq} {first} {len(values)}", flush=True)


async def run(log: streamlog.Log, seed: int, round_number: int) -> None:
    numbers = itertools.count()
    await asyncio.gather(*(append_forever(log, seed, round_number, numbers)
                           for _ in range(TASKS)))


def main() -> None:
    path, round_number, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    log = streamlog.open_log(path, fsync="always", segment_bytes_max=SEGMENT_BYTES_MAX)
    log.create_stream(STREAM)
    print(f"READY {log.end_offset(STREAM, 0)}", flush=True)
    asyncio.run(run(log, seed, round_number))


if __name__ == "__main__":
    main()
