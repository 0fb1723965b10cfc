"""What the console's pages show, read from a real log (console/data.py): the message
browser's seeks, pages, filters and their bounds, transaction states, the live tail's
steps, the overview, the operators' jobs, and the sampler's rates and lag."""

import json
import random
import time
import types

import pytest

from streamlog.console import daemon, data
from streamlog.operators.alignment import note_value
from streamlog.records import RecordKind

S = 1_000_000


@pytest.fixture
def log(open_logs, log_dir):
    return open_logs(log_dir, fsync="never")


def hwm_offset(timestamps, t):
    """DESIGN 5's rule, written out: the first offset whose running maximum is >= t."""
    top = None
    for offset, ts in enumerate(timestamps):
        top = ts if top is None else max(top, ts)
        if top >= t:
            return offset
    return len(timestamps)


def test_a_seek_by_time_starts_at_the_first_record_by_the_high_water_mark_rule(log):
    stamps = [10 * S, 30 * S, 20 * S, 25 * S, 40 * S, 35 * S, 50 * S]
    log.create_stream("s", 1)
    log.append_batch_sync("s", [b"v%d" % i for i in range(7)], timestamps_us=stamps)
    for t in (5 * S, 20 * S, 25 * S, 31 * S, 35 * S, 50 * S):
        page = data.browse(log, data.Query("s", 0, start="time", time_us=t))
        expected = hwm_offset(stamps, t)
        assert page.positions == {0: expected} == {0: log.offset_for_timestamp("s", 0, t)}
        assert [r["offset"] for r in page.rows] == list(range(expected, 7))
    # 25 s: the record stamped 25 s is offset 3, but 30 s (offset 1) passed it first
    assert data.browse(log, data.Query("s", 0, start="time", time_us=25 * S)).rows[0][
        "offset"] == 1
    past = data.browse(log, data.Query("s", 0, start="time", time_us=51 * S))
    assert past.rows == [] and past.at_end


def test_pages_go_forward_and_back_without_reading_the_whole_partition(log, monkeypatch):
    log.create_stream("s", 1)
    log.append_batch_sync("s", [b"%d" % i for i in range(1000)])
    read = []
    real_reader = log.reader

    def counting_reader(*args, **kwargs):
        read.append((kwargs.get("from_offset"), kwargs.get("to_offset")))
        return real_reader(*args, **kwargs)

    monkeypatch.setattr(log, "reader", counting_reader)
    page = data.browse(log, data.Query("s", 0, start="offset", offset=100, limit=20))
    assert [r["offset"] for r in page.rows] == list(range(100, 120))
    assert read == [(100, 120)]  # exactly the page
    assert page.next_positions == {0: 120}
    assert data.previous_positions(page, 20) == {0: 80}
    cursor = data.encode_cursor(page.next_positions)
    following = data.browse(log, data.Query("s", 0, start="cursor", cursor=cursor, limit=20))
    assert [r["offset"] for r in following.rows] == list(range(120, 140))
    end = data.browse(log, data.Query("s", 0, start="end", limit=20))
    assert [r["offset"] for r in end.rows] == list(range(980, 1000)) and end.at_end
    first = data.browse(log, data.Query("s", 0, limit=20))
    assert data.previous_positions(first, 20) == {0: 0}


def test_all_partitions_are_merged_by_time_and_the_cursor_continues_each(log):
    log.create_stream("s", 3)
    for p in range(3):
        log.append_batch_sync("s", [b"p%d-%d" % (p, i) for i in range(10)], partition=p,
                              timestamps_us=[(i * 3 + p) * S for i in range(10)])
    seen = []
    query = data.Query("s", None, limit=7)
    while True:
        page = data.browse(log, query)
        seen += [(r["partition"], r["offset"]) for r in page.rows]
        stamps = [r["timestamp_us"] for r in page.rows]
        assert stamps == sorted(stamps)
        if page.at_end:
            break
        query = data.Query("s", None, start="cursor",
                           cursor=data.encode_cursor(page.next_positions), limit=7)
    assert sorted(seen) == [(p, o) for p in range(3) for o in range(10)]
    assert len(seen) == len(set(seen)) == 30  # each record once across the pages


def test_filters_by_key_and_value_text(log):
    log.create_stream("s", 2)
    keys = [b"user-%d" % i for i in range(200)]
    values = [json.dumps({"n": i, "page": "/cart" if i % 50 == 0 else "/home"}).encode()
              for i in range(200)]
    log.append_batch_sync("s", values, keys=keys)
    exact = data.browse(log, data.Query("s", None, key="user-17"))
    assert [r["key"] for r in exact.rows] == ["user-17"]
    substring = data.browse(log, data.Query("s", None, key="user-17", key_match="substring"))
    assert sorted(r["key"] for r in substring.rows) == ["user-17"] + [
        f"user-{n}" for n in range(170, 180)]
    cart = data.browse(log, data.Query("s", None, value_text="/cart"))
    assert sorted(json.loads(r["value"])["n"] for r in cart.rows) == [0, 50, 100, 150]
    both = data.browse(log, data.Query("s", None, key="user-50", value_text="/cart"))
    assert [r["key"] for r in both.rows] == ["user-50"]
    none = data.browse(log, data.Query("s", None, key="user-999"))
    assert none.rows == [] and none.scanned == 200 and not none.stopped_early


def test_a_filter_never_matches_across_two_records_bytes(log):
    log.create_stream("s", 1)
    log.append_batch_sync("s", [b"xa", b"bx", b"ab", None, b"abab"],
                          keys=[b"ka", b"bk", None, b"ab", b"kab"])
    log.append_batch_sync("s", [b"h"], keys=[b"ab"], headers=[[("h", b"ab")]])
    by_key = data.browse(log, data.Query("s", 0, key="ab"))
    assert [r["offset"] for r in by_key.rows] == [3, 5]  # exact: not "kab", not "ka"+"bk"
    by_substring = data.browse(log, data.Query("s", 0, key="ab", key_match="substring"))
    assert [r["offset"] for r in by_substring.rows] == [3, 4, 5]
    by_value = data.browse(log, data.Query("s", 0, value_text="ab"))
    assert [r["offset"] for r in by_value.rows] == [2, 4]  # "xa"+"bx" is two records
    assert data.browse(log, data.Query("s", 0, key="kb", key_match="substring")).rows == []
    (with_headers,) = data.browse(log, data.Query("s", 0, key="ab",
                                                  start="offset", offset=4)).rows
    assert with_headers["headers"] == [("h", "ab")] and with_headers["value"] == "h"
    # a filter's page and a plain page show the same record the same way
    plain = data.browse(log, data.Query("s", 0, start="offset", offset=3, limit=1)).rows
    assert plain == data.browse(log, data.Query("s", 0, key="ab")).rows[:1]


def test_a_page_over_transaction_markers_goes_on_after_them(log):
    log.create_stream("s", 1)
    for i in range(3):
        txn = log.new_txn_id()
        log.append_batch_sync("s", [b"%d" % i] * 2, partition=0, txn_id=txn)
        log.commit_txn("s", 0, txn)  # a marker after each pair
    page = data.browse(log, data.Query("s", 0, limit=4))
    assert [r["offset"] for r in page.rows] == [0, 1, 3]  # 2 is a marker
    following = data.browse(log, data.Query(
        "s", 0, start="cursor", cursor=data.encode_cursor(page.next_positions), limit=4))
    assert [r["offset"] for r in following.rows] == [4, 6, 7]


def test_a_search_stops_at_its_bound_and_the_next_page_goes_on(log, monkeypatch):
    log.create_stream("s", 1)
    log.append_batch_sync("s", [b"x"] * 999 + [b"needle"])
    monkeypatch.setattr(data, "SCAN_RECORDS_MAX", 300)
    page = data.browse(log, data.Query("s", 0, value_text="needle"))
    assert page.rows == [] and page.stopped_early and page.scanned == 300
    assert page.next_positions == {0: 300} and not page.at_end
    for _ in range(3):
        page = data.browse(log, data.Query("s", 0, value_text="needle", start="cursor",
                                           cursor=data.encode_cursor(page.next_positions)))
    assert [r["offset"] for r in page.rows] == [999] and not page.stopped_early


def test_records_show_their_transactions_state_and_markers_are_not_rows(log):
    log.create_stream("s", 1)
    log.append_sync("s", b"plain")
    aborted, open_ = log.new_txn_id(), log.new_txn_id()
    log.append_sync("s", b"a", partition=0, txn_id=aborted)
    log.abort_txn("s", 0, aborted)
    log.append_sync("s", b"o", partition=0, txn_id=open_)
    committed = log.new_txn_id()
    log.append_sync("s", b"c", partition=0, txn_id=committed)
    log.commit_txn("s", 0, committed)
    page = data.browse(log, data.Query("s", 0))
    shown = {r["value"]: r["txn"] for r in page.rows}
    assert shown == {"plain": "", "a": "aborted", "o": "open", "c": "committed"}
    assert len(page.rows) == 4  # the abort and commit markers are not shown


def test_bad_queries_say_why(log):
    log.create_stream("s", 2)
    with pytest.raises(data.BadQuery, match="no stream 'nope'"):
        data.browse(log, data.Query("nope"))
    with pytest.raises(data.BadQuery, match="partitions 0 to 1"):
        data.browse(log, data.Query("s", 2))
    with pytest.raises(data.BadQuery, match="1 to 500 records"):
        data.browse(log, data.Query("s", 0, limit=501))
    with pytest.raises(data.BadQuery, match="is not a position"):
        data.browse(log, data.Query("s", 0, start="cursor", cursor="0-5"))
    with pytest.raises(data.BadQuery, match="partition 1 is not shown"):
        data.browse(log, data.Query("s", 0, start="cursor", cursor="1:0"))


def test_the_tail_steps_from_the_positions_it_is_given(log):
    log.create_stream("s", 2)
    log.append_batch_sync("s", [b"a", b"b"], partition=0)
    rows, after = data.tail(log, "s", {0: 2, 1: 0})
    assert rows == [] and after == {0: 2, 1: 0}
    log.append_sync("s", b"c", partition=1, key=b"k")
    log.append_sync("s", b"d", partition=0)
    rows, after = data.tail(log, "s", after)
    assert sorted((r["partition"], r["offset"], r["value"]) for r in rows) == [
        (0, 2, "d"), (1, 0, "c")]
    assert after == {0: 3, 1: 1}
    log.append_sync("s", b"e", partition=1, key=b"other")
    rows, after = data.tail(log, "s", after, data.Query("s", key="k"))
    assert rows == [] and after == {0: 3, 1: 2}  # looked at, not shown


def test_the_tail_bounds_a_step_and_loses_nothing_past_the_bound(log, monkeypatch):
    monkeypatch.setattr(data, "TAIL_RECORDS_MAX", 4)
    log.create_stream("s", 2)
    for p in range(2):
        log.append_batch_sync("s", [b"%d-%d" % (p, i) for i in range(5)], partition=p)
    seen, positions = [], {0: 0, 1: 0}
    rows, positions = data.tail(log, "s", positions)
    assert len(rows) == 4 and positions == {0: 2, 1: 2}  # two each: the share
    seen += rows
    while any(positions[p] < 5 for p in positions):
        rows, positions = data.tail(log, "s", positions)
        assert 0 < len(rows) <= 4
        seen += rows
    assert sorted(r["value"] for r in seen) == sorted(
        f"{p}-{i}" for p in range(2) for i in range(5))


def test_the_overview_counts_records_transactions_holds_and_verification(log):
    log.create_stream("events", 2)
    log.append_batch_sync("events", [b"x"] * 10, partition=0,
                          timestamps_us=[5 * S] * 5 + [3 * S] * 5)
    log.append_sync("events", b"t", partition=1, txn_id=log.new_txn_id())
    log.hold("events", 0, "audit", 4)
    sampler = data.Sampler()
    shown = data.overview(log, sampler)
    (events,) = [s for s in shown["streams"] if s["name"] == "events"]
    assert events["records"] == 11 and events["open_txns"] == 1
    p0, p1 = events["partitions"]
    assert (p0["start_offset"], p0["end_offset"], p0["records"]) == (0, 10, 10)
    assert p0["max_timestamp_us"] == 5 * S and p0["min_timestamp_us"] <= 5 * S
    assert p0["holds_shown"][0][0] == "audit" and p0["holds_shown"][0][1]["offset"] == 4
    assert p0["verified_result"] is None  # nothing has verified it yet
    assert p1["open_txns"] == 1


def test_the_overview_shows_each_partitions_last_verification(open_logs, log_dir):
    log = open_logs(log_dir, fsync="never", segment_bytes_max=4096)
    log.create_stream("s", 1)
    for i in range(20):
        log.append_batch_sync("s", [random.Random(i * 10 + j).randbytes(100)
                                    for j in range(10)])
    assert log.info()["streams"]["s"]["partitions"][0]["segments"] > 1
    scrubber = log.start_scrubber(bytes_per_s=1 << 30)
    deadline = time.monotonic() + 30
    while scrubber.passes_completed == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scrubber.passes_completed >= 1
    (part,) = [s for s in data.overview(log, data.Sampler())["streams"]
               if s["name"] == "s"][0]["partitions"]
    assert part["segments"] > 1
    assert part["verified_result"] == "ok" and part["verified_at"].endswith("Z")


def test_the_sampler_gives_append_rates_and_lag_history(log):
    clock = types.SimpleNamespace(now=100.0)
    sampler = data.Sampler(clock=lambda: clock.now, wall=lambda: clock.now + 1e9)
    log.create_stream("s", 2)
    snapshot = {"g": {"state": "Empty", "members": [], "offsets": [["s", 0, 0, None]]}}
    sampler.sample(log, snapshot)
    log.append_batch_sync("s", [b"x"] * 40, partition=0)
    log.create_stream("new", 1)  # made after the first sample: from offset 0
    log.append_batch_sync("new", [b"y"] * 20)
    clock.now += 4
    sampler.sample(log, snapshot)
    assert sampler.rates() == {("s", 0): 10.0, ("s", 1): 0.0, ("new", 0): 5.0}
    assert [lag for _, lag in sampler.lag_history("g")] == [0, 40]
    clock.now += data.RATE_WINDOW_S + 1
    sampler.sample(log, snapshot)
    assert sampler.rates() == {}  # no earlier sample within the window
    assert sampler.lag_history("nobody") == []


def test_operator_jobs_are_found_by_their_holds_with_their_last_position_note(log):
    log.create_stream("in", 1)
    log.create_stream("out", 1)
    log.append_batch_sync("in", [b"i"] * 20)
    log.append_batch_sync("out", [b"r1", b"r2", note_value("in/0", 12, 0)],
                          kinds=[RecordKind.DATA, RecordKind.DATA, RecordKind.CHECKPOINT])
    name = "operator.out.0.deadbeef"
    log.hold("in", 0, name, 12)
    log.hold("out", 0, name, 0)
    shown = data.operators(log)
    (job,) = shown["jobs"]
    assert job["output"] == "out/0"
    assert job["note"] == {"output_offset": 2, "input": "in/0", "input_next": 12,
                           "origin": 0}
    assert sorted((h["stream"], h["offset"]) for h in job["holds"]) == [("in", 12),
                                                                        ("out", 0)]
    assert {(r["stream"], r["partition"]) for r in shown["recovery"]} == {("in", 0),
                                                                          ("out", 0)}
    assert all(r["tail"] == "clean" for r in shown["recovery"])


def test_a_consumer_assignment_is_decoded_and_anything_else_is_not():
    import struct
    topic = b"clicks"
    assignment = (struct.pack(">hi", 0, 1) + struct.pack(">h", len(topic)) + topic
                  + struct.pack(">iii", 2, 0, 3) + struct.pack(">i", -1))
    assert daemon.decode_assignment(assignment) == [("clicks", [0, 3])]
    assert daemon.decode_assignment(b"\x00\x00\x00") is None
    assert daemon.decode_assignment(assignment[:-9]) is None

