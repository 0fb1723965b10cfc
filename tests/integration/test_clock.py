"""Time is injected (streamlog/clock.py): with a manual clock a segment rolls by age and
retention expires by age without a test that sleeps."""

import streamlog
from streamlog.testing.clock import ManualClock


def test_segments_roll_by_age_and_retention_expires_by_age_on_a_manual_clock(tmp_path):
    clock = ManualClock()
    path = str(tmp_path / "log")
    hour = 3600.0
    with streamlog.open_log(path, clock=clock, segment_age_max_s=hour,
                            retention_age_s=2 * hour) as log:
        log.create_stream("s")
        first = log.append_sync("s", b"a")  # no event time: stamped by the clock
        assert next(iter(log.reader("s", 0))).timestamp_us == clock.wall_us()
        log.append_sync("s", b"b")
        assert log.info()["streams"]["s"]["partitions"][0]["segments"] == 1
        clock.advance(hour + 1)
        log.append_sync("s", b"c")  # the segment is older than an hour: a new one
        assert log.info()["streams"]["s"]["partitions"][0]["segments"] == 2
        assert log.apply_retention() == []  # its records are an hour old, not two
        clock.advance(2 * hour)
        deleted = log.apply_retention()
        assert len(deleted) == 1
        assert log.start_offset("s", 0) == first.offset + 2
        assert [r.value for r in log.reader("s", 0)] == [b"c"]
