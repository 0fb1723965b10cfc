"""A process of test_stream_admin_processes.py: another writer of a shared local log.

Usage:
    python stream_admin_child.py serve LOG
    python stream_admin_child.py churn LOG SEED

`serve` opens LOG for writing and answers commands read from stdin, one a line, with
one line on stdout ("ok ..." or "err ExceptionName"):
    append STREAM PARTITION     -> ok OFFSET
    hold STREAM PARTITION NAME OFFSET -> ok
    count STREAM                -> ok PARTITIONS
    refresh                     -> ok
    streams                     -> ok NAME,NAME...

`churn` opens LOG for writing, prints READY and then, until it is killed, creates,
fills, deletes and widens streams of a few names. Every record of one incarnation of a
stream carries the same random tag: b"NAME|TAG|PARTITION|INDEX", INDEX counting from 0
in each partition, so a reader can tell one incarnation from another, and an
incarnation that does not start at offset 0.
"""

from __future__ import annotations

import random
import sys

import streamlog

NAMES = ("a", "b", ".c")
PARTITIONS_MAX = 4


def serve(path: str) -> None:
    with streamlog.open_log(path) as log:
        print("ready", flush=True)
        for line in sys.stdin:
            command, *args = line.split()
            try:
                if command == "append":
                    answer = log.append_sync(args[0], b"child", partition=int(args[1])).offset
                elif command == "hold":
                    log.hold(args[0], int(args[1]), args[2], int(args[3]))
                    answer = ""
                elif command == "count":
                    answer = log.partition_count(args[0])
                elif command == "refresh":
                    log.refresh()
                    answer = ""
                elif command == "streams":
                    answer = ",".join(log.streams())
                else:
                    break
                print(f"ok {answer}".strip(), flush=True)
            except Exception as error:  # noqa: BLE001 - reported to the parent
                print(f"err {type(error).__name__}", flush=True)


def churn(path: str, seed: int) -> None:
    rng = random.Random(seed)
    log = streamlog.open_log(path, segment_bytes_max=4096)
    tags = {}
    print("READY", flush=True)
    while True:
        name = rng.choice(NAMES)
        if name not in log.streams():
            log.create_stream(name, rng.randint(1, 3))
            tags[name] = rng.getrandbits(48)
        tag = tags.setdefault(name, None)
        choice = rng.random()
        if choice < 0.25:
            log.delete_stream(name)
        elif choice < 0.35 and log.partition_count(name) < PARTITIONS_MAX:
            log.add_partitions(name, log.partition_count(name) + 1)
        elif tag is not None:  # (a stream found at the open: its tag is unknown here)
            partition = rng.randrange(log.partition_count(name))
            end = log.end_offset(name, partition)
            log.append_batch_sync(name, [b"%s|%d|%d|%d" % (name.encode(), tag, partition, end + i)
                                         for i in range(rng.randint(1, 20))],
                                  partition=partition)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        churn(sys.argv[2], int(sys.argv[3]))
