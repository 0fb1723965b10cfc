"""The Producer through a daemon (open_log("streamlog://...").producer(...)): the same
object and guarantees as on a local log, each batch one APPEND, several in flight."""

from __future__ import annotations

import threading

import pytest

from streamlog.errors import InvalidAppend, ReadOnlyLog, StreamLogError
from streamlog.testing.serve import ServeProcess
from streamlog.wire.client import open_remote

TOKEN = "producer-remote-token"
S = "events"
pytestmark = pytest.mark.slow


@pytest.fixture
def served(tmp_path):
    daemon = ServeProcess(tmp_path / "log", "--fsync", "always", token=TOKEN)
    yield daemon
    daemon.kill()


def test_threads_sending_through_a_daemon_land_in_their_order_in_shared_appends(served):
    threads, each = 4, 2_000
    with open_remote(served.url, TOKEN) as log:
        log.create_stream(S, partitions=2)
        with log.producer(S, linger_ms=2) as producer:
            handles: dict[int, list] = {}

            def run(thread: int) -> None:
                handles[thread] = [producer.send(b"%d:%d" % (thread, seq),
                                                 key=b"t%d" % thread) for seq in range(each)]

            workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            producer.flush()
            positions = {t: [h.result(10) for h in hs] for t, hs in handles.items()}
            batches = producer.stats["batches"]
        assert producer.stats["acknowledged"] == threads * each
        # Far fewer APPENDs than records: sends share batches.
        assert batches < threads * each / 10
        stored = {}
        for number in range(2):
            for record in log.reader(S, number):
                stored[(number, record.offset)] = record.value
    for thread, places in positions.items():
        # One key per thread: one partition, offsets rising in the order it sent.
        assert len({p.partition for p in places}) == 1
        offsets = [p.offset for p in places]
        assert offsets == sorted(offsets) and len(set(offsets)) == each
        assert [stored[(p.partition, p.offset)] for p in places] == [
            b"%d:%d" % (thread, seq) for seq in range(each)]
    assert len(stored) == threads * each


def test_a_remote_producer_refuses_a_bad_record_alone_and_a_read_only_log(served):
    with open_remote(served.url, TOKEN) as log:
        log.create_stream(S)
        with log.producer(S) as producer:
            good = producer.send(b"ok")
            bad = producer.send("not bytes")
            assert good.result(10).offset == 0
            with pytest.raises(InvalidAppend):
                bad.result(10)
    with open_remote(served.url, TOKEN, readonly=True) as view:
        with pytest.raises(ReadOnlyLog):
            view.producer(S)


def test_records_in_flight_when_the_daemon_dies_fail_instead_of_hanging(served):
    with open_remote(served.url, TOKEN) as log:
        log.create_stream(S)
        producer = log.producer(S, linger_ms=0)
        assert producer.send(b"first").result(10).offset == 0
        served.kill()
        late = [producer.send(b"late %d" % i) for i in range(100)]
        for handle in late:
            with pytest.raises(StreamLogError):
                handle.result(10)
        producer.close()
