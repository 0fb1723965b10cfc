"""Awaited single appends gathered per turn of the event loop (coalesce.py), through a
real Log: what each task gets back is where its record is, in the order the tasks
appended, across frame and window bounds, from several loops at once, and errors,
cancellation and closing reach every task waiting, none left hanging."""

from __future__ import annotations

import asyncio
import threading

import pytest

import streamlog
from streamlog.config import LogConfig
from streamlog.errors import InvalidAppend, LogClosed, PartitionFailed
from streamlog.testing.faultfs import FaultFileIO

WAIT_S = 30.0


def records_of(log, stream: str = "s", partition: int = 0) -> list:
    with log.reader(stream, partition) as reader:
        return [(r.offset, r.key, r.value, r.timestamp_us) for r in reader.records()]


def frames_of(log, stream: str = "s", partition: int = 0) -> int:
    return log.stats()[f"{stream}/{partition}"]["frames"]


def test_a_thousand_tasks_each_get_the_offset_their_record_landed_at(tmp_path):
    async def main():
        async with streamlog.open_log(str(tmp_path / "log"), fsync="always") as log:
            log.create_stream("s", partitions=1)

            async def one(i: int):
                return await log.append("s", b"v%d" % i, key=b"k%d" % i,
                                        timestamp_us=1_000 + i)

            positions = await asyncio.wait_for(
                asyncio.gather(*(one(i) for i in range(3_000))), WAIT_S)
            return positions, records_of(log)

    positions, records = asyncio.run(main())
    assert sorted(p.offset for p in positions) == list(range(3_000))
    assert {p.partition for p in positions} == {0}
    for i, position in enumerate(positions):
        offset, key, value, timestamp = records[position.offset]
        assert (offset, key, value, timestamp) == (position.offset, b"k%d" % i,
                                                   b"v%d" % i, 1_000 + i)
    # gathered tasks start in order, so their records land in that order
    assert [p.offset for p in positions] == list(range(3_000))


def test_a_turn_fuller_than_a_frame_is_cut_at_the_bounds_a_batch_takes(tmp_path):
    config = LogConfig(batch_records_max=64, frame_bytes_max=16_384, record_bytes_max=4_096)

    async def main():
        log = streamlog.open_log(str(tmp_path / "log"), config=config, fsync="always")
        log.create_stream("s", partitions=1)
        values = [bytes([i % 251]) * (i % 300) for i in range(1_000)]
        positions = await asyncio.wait_for(asyncio.gather(
            *(log.append("s", v, timestamp_us=i) for i, v in enumerate(values))), WAIT_S)
        frames = frames_of(log)
        got = records_of(log)
        await log.aclose()
        return values, positions, frames, got

    values, positions, frames, got = asyncio.run(main())
    assert [p.offset for p in positions] == list(range(1_000))
    assert [value for _, _, value, _ in got] == values
    assert frames >= 1_000 // 64  # no frame over batch_records_max records


def test_with_a_full_window_the_batches_wait_in_order_and_all_land(tmp_path):
    config = LogConfig(inflight_appends_max=1, inflight_bytes_max=4_096,
                       batch_records_max=16)

    async def main():
        log = streamlog.open_log(str(tmp_path / "log"), config=config, fsync="always")
        log.create_stream("s", partitions=1)
        positions = await asyncio.wait_for(asyncio.gather(
            *(log.append("s", b"%06d" % i) for i in range(2_000))), WAIT_S)
        got = records_of(log)
        await log.aclose()
        return positions, got

    positions, got = asyncio.run(main())
    assert [p.offset for p in positions] == list(range(2_000))
    assert [value for _, _, value, _ in got] == [b"%06d" % i for i in range(2_000)]


def test_records_of_several_loops_and_plain_threads_all_land_once(tmp_path):
    log = streamlog.open_log(str(tmp_path / "log"), fsync="always")
    log.create_stream("s", partitions=1)
    results: dict[str, list] = {}

    def loop_thread(name: str) -> None:
        async def main():
            return await asyncio.gather(*(log.append("s", f"{name}-{i}".encode())
                                          for i in range(500)))
        results[name] = [p.offset for p in asyncio.run(main())]

    def sync_thread() -> None:
        results["sync"] = [log.append_sync("s", b"sync-%d" % i).offset for i in range(200)]

    threads = [threading.Thread(target=loop_thread, args=(f"loop{n}",)) for n in range(3)]
    threads.append(threading.Thread(target=sync_thread))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    got = records_of(log)
    log.close()
    assert len(got) == 3 * 500 + 200
    by_offset = {offset: value for offset, _, value, _ in got}
    for name, offsets in results.items():
        prefix = name.encode() if name != "sync" else b"sync"
        assert len(offsets) == len(set(offsets))
        for i, offset in enumerate(offsets):
            assert by_offset[offset] == prefix + b"-%d" % i
        if name != "sync":  # each loop's records land in the order it appended them
            assert offsets == sorted(offsets)


def test_plain_and_other_appends_from_concurrent_tasks_all_land(tmp_path):
    async def main():
        async with streamlog.open_log(str(tmp_path / "log"), fsync="always") as log:
            log.create_stream("s", partitions=2)
            plain = [log.append("s", b"p%d" % i, key=b"k%d" % i) for i in range(300)]
            headed = [log.append("s", b"h%d" % i, key=b"k%d" % i, headers={"h": b"1"})
                      for i in range(100)]
            batches = [log.append_batch("s", [b"b%d" % i], keys=[b"k%d" % i])
                       for i in range(100)]
            done = await asyncio.wait_for(asyncio.gather(*plain, *headed, *batches), WAIT_S)
            return done, [records_of(log, partition=n) for n in range(2)]

    done, by_partition = asyncio.run(main())
    landed = {(n, offset): value for n, records in enumerate(by_partition)
              for offset, _, value, _ in records}
    assert len(landed) == 500
    for i, position in enumerate(done[:300]):
        assert landed[(position.partition, position.offset)] == b"p%d" % i
    for i, position in enumerate(done[300:400]):
        assert landed[(position.partition, position.offset)] == b"h%d" % i
    for i, result in enumerate(done[400:]):
        ((partition, (first, last)),) = result.ranges.items()
        assert first == last and landed[(partition, first)] == b"b%d" % i


def test_a_bad_record_is_refused_at_its_call_and_its_neighbours_land(tmp_path):
    async def main():
        async with streamlog.open_log(str(tmp_path / "log"), fsync="always") as log:
            log.create_stream("s", partitions=1)
            too_big = b"x" * (log.config.record_bytes_max + 1)
            outcomes = await asyncio.gather(
                log.append("s", b"a"), log.append("s", too_big), log.append("s", "text"),
                log.append("s", b"b"), return_exceptions=True)
            return outcomes, records_of(log)

    outcomes, got = asyncio.run(main())
    assert isinstance(outcomes[1], InvalidAppend) and "record_bytes_max" in str(outcomes[1])
    assert isinstance(outcomes[2], InvalidAppend)
    assert [outcomes[0].offset, outcomes[3].offset] == [0, 1]
    assert [value for _, _, value, _ in got] == [b"a", b"b"]


def test_a_failed_write_fails_every_task_of_its_batch_and_the_later_ones(tmp_path):
    fileio = FaultFileIO(1)  # over the real files

    async def main():
        log = streamlog.open_log(str(tmp_path / "log"), fileio=fileio, fsync="always")
        log.create_stream("s", partitions=1)
        first = await log.append("s", b"before")
        fileio.inject_eio("fsync", 1)
        outcomes = await asyncio.wait_for(asyncio.gather(
            *(log.append("s", b"%d" % i) for i in range(200)), return_exceptions=True),
            WAIT_S)
        later = await asyncio.gather(log.append("s", b"after"), return_exceptions=True)
        log.close()
        return first, outcomes, later

    first, outcomes, later = asyncio.run(main())
    assert first.offset == 0
    assert all(isinstance(o, PartitionFailed) for o in outcomes), outcomes[:3]
    assert isinstance(later[0], PartitionFailed)


def test_a_cancelled_task_leaves_the_others_of_its_batch_alone(tmp_path):
    async def main():
        async with streamlog.open_log(str(tmp_path / "log"), fsync="always") as log:
            log.create_stream("s", partitions=1)
            tasks = [asyncio.create_task(log.append("s", b"%d" % i)) for i in range(100)]
            await asyncio.sleep(0)  # every task has joined the batch
            tasks[50].cancel()
            outcomes = await asyncio.wait_for(
                asyncio.gather(*tasks, return_exceptions=True), WAIT_S)
            return outcomes, records_of(log)

    outcomes, got = asyncio.run(main())
    assert isinstance(outcomes[50], asyncio.CancelledError)
    others = [o for i, o in enumerate(outcomes) if i != 50]
    assert [p.offset for p in others] == [i for i in range(100) if i != 50]
    # the cancelled task's record was already the batch's: it lands, as a record whose
    # caller stopped waiting does on any durable log
    assert [value for _, _, value, _ in got] == [b"%d" % i for i in range(100)]


def test_aclose_first_hands_over_what_this_loop_gathered(tmp_path):
    async def main():
        log = streamlog.open_log(str(tmp_path / "log"), fsync="always")
        log.create_stream("s", partitions=1)
        tasks = [asyncio.create_task(log.append("s", b"%d" % i)) for i in range(300)]
        await asyncio.sleep(0)  # joined; the flush is queued behind this task's turn
        await log.aclose()
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True),
                                      WAIT_S)

    outcomes = asyncio.run(main())
    assert [p.offset for p in outcomes] == list(range(300))
    with streamlog.open_log(str(tmp_path / "log")) as log:
        assert log.end_offset("s", 0) == 300


def test_closing_from_another_thread_leaves_no_task_waiting(tmp_path):
    log = streamlog.open_log(str(tmp_path / "log"), fsync="always")
    log.create_stream("s", partitions=1)

    async def main():
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(log.append("s", b"%d" % i)) for i in range(300)]
        await asyncio.sleep(0)
        await loop.run_in_executor(None, log.close)  # close() on another thread
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True),
                                      WAIT_S)

    outcomes = asyncio.run(main())
    landed = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, LogClosed) for o in refused), refused[:3]
    assert len(landed) + len(refused) == 300
    with streamlog.open_log(str(tmp_path / "log")) as reopened:
        assert reopened.end_offset("s", 0) == len(landed)
        assert sorted(p.offset for p in landed) == list(range(len(landed)))


def test_appends_after_close_are_refused_at_once(tmp_path):
    async def main():
        log = streamlog.open_log(str(tmp_path / "log"), fsync="always")
        log.create_stream("s", partitions=1)
        await log.aclose()
        with pytest.raises(LogClosed):
            await log.append("s", b"late")

    asyncio.run(main())
