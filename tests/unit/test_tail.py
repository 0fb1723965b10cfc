"""TailRing (tail.py): the bounded in-memory ring of acknowledged batches."""

import asyncio
import threading

from streamlog.payload import decode_columns, encode_payload
from streamlog.frame import Frame
from streamlog.tail import TailRing


def columns(base: int, count: int, value_bytes: int = 10):
    raw, flags = encode_payload(list(range(count)), [None] * count, [b"x" * value_bytes] * count)
    frame = Frame(0, base, count, 0, count - 1, 0, flags, len(raw), raw)
    return decode_columns(frame)


def test_find_returns_the_batch_holding_an_offset_until_it_is_evicted():
    ring = TailRing(batches_max=3, bytes_max=1 << 20)
    ring.publish([(0, columns(0, 5), None), (5, columns(5, 5), 9)], 10)
    assert ring.find(7)[0] == 5 and ring.find(0)[0] == 0
    assert ring.find(10) is None and ring.end_offset == 10
    ring.publish([(10, columns(10, 5), 9), (15, columns(15, 5), 9)], 20)
    assert ring.find(2) is None  # the oldest fell out: batches_max is 3
    assert ring.find(17)[0] == 15


def test_the_byte_bound_evicts_too():
    ring = TailRing(batches_max=100, bytes_max=300)
    ring.publish([(n * 2, columns(n * 2, 2, value_bytes=50), None) for n in range(5)], 10)
    held = [n * 2 for n in range(5) if ring.find(n * 2) is not None]
    assert held and held[-1] == 8 and len(held) < 5


def test_a_waiting_follower_wakes_on_publish_reset_and_close():
    ring = TailRing(batches_max=10, bytes_max=1 << 20)
    assert not ring.wait(0, timeout=0.01)  # nothing yet: times out
    woke = []
    follower = threading.Thread(target=lambda: woke.append(ring.wait(0, timeout=10)))
    follower.start()
    ring.publish([(0, columns(0, 3), None)], 3)
    follower.join(5)
    assert woke == [True]
    ring.reset(2)
    assert ring.find(0) is None and ring.end_offset == 2
    ring.close()
    assert not ring.wait(5, timeout=10)  # closed: returns at once


def test_async_waiters_are_resolved_from_another_thread():
    ring = TailRing(batches_max=10, bytes_max=1 << 20)

    async def follow():
        waiting = asyncio.ensure_future(ring.wait_async(0))
        await asyncio.sleep(0.01)
        threading.Thread(target=ring.publish, args=([(0, columns(0, 1), None)], 1)).start()
        await asyncio.wait_for(waiting, 5)

    asyncio.run(follow())
    assert ring.end_offset == 1


def test_async_wait_times_out_and_a_cancel_is_never_swallowed():
    ring = TailRing(batches_max=10, bytes_max=1 << 20)

    async def scenario():
        assert await ring.wait_async(0, timeout=0.01) is False  # nothing came
        # A cancel that lands as the wait is woken must still cancel the waiter (a
        # follower that ignored it kept a draining daemon alive).
        waiting = asyncio.ensure_future(ring.wait_async(0, timeout=60))
        await asyncio.sleep(0)
        ring.publish([(0, columns(0, 1), None)], 1)  # wakes it (call_soon_threadsafe)
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(scenario()) is True
    assert ring.wait(0, timeout=0)
