"""The web console end to end: a real daemon (`streamlog serve --kafka-port 0
--console-port 0`) in a child process, driven by a real headless Chromium through
Playwright (streamlog/testing/browser.py), with data written through our API and through
unmodified Kafka clients (confluent-kafka).

What it shows: sign-in refused and accepted, and its rate limit; streams made through
either door listed; a seek by event time landing where the high-water-mark rule says
(DESIGN 5), in UTC and in a zone whose offset changes with the season; a key found among
100,000 records; the live tail showing a new record within a second, and its pause; a
group's lag as confluent-kafka computes it; writes refused without --console-write and
confirmed in the page with it. The run also takes the README's screenshots
(streamlog/console/screenshots/).

One daemon serves most tests (each uses its own streams); the rate limit and the writes
have their own, since all clients here share 127.0.0.1 and the first is read-only.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.client
import json
import pathlib
import time
import urllib.parse
import zoneinfo

import pytest

import streamlog
import streamlog.console
from streamlog.console import data
from streamlog.testing import browser as browsers
from streamlog.testing.serve import ServeProcess

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOKEN = "console-browser-token"
pytestmark = pytest.mark.slow
SCREENSHOTS = pathlib.Path(streamlog.console.__file__).parent / "screenshots"
SECOND_US = 1_000_000


# -- fixtures ----------------------------------------------------------------------------

def serve(tmp_path_factory, name: str, *extra: str, kafka: bool = True) -> ServeProcess:
    """A daemon in a directory of its own, its log given as the relative path
    data/clickstream (what the overview, and so its screenshot, shows)."""
    where = tmp_path_factory.mktemp(name)
    with contextlib.chdir(where):  # the child starts there and stays
        return ServeProcess("data/clickstream", "--scrub-mib-per-s", "0", *extra,
                            token=TOKEN, kafka_port="0" if kafka else None,
                            console_port="0")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """The read-only console most tests share, with the Kafka listener."""
    server = serve(tmp_path_factory, "console")
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def writable(tmp_path_factory):
    server = serve(tmp_path_factory, "console-write", "--console-write")
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def log(daemon):
    with streamlog.open_log(daemon.url, token=TOKEN) as opened:
        yield opened


@pytest.fixture(scope="module")
def browser():
    with browsers.chromium() as launched:
        yield launched


def sign_in(browser, server: ServeProcess, **options):
    """A browser context signed in through the login form."""
    context = browsers.new_context(browser, **options)
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.goto(server.console_url + "/login")
    page.fill("form#login input[name=password]", TOKEN)
    page.click("form#login button[type=submit]")
    page.wait_for_url(server.console_url + "/")
    page.close()
    return context


@pytest.fixture(scope="module")
def console(browser, daemon):
    context = sign_in(browser, daemon)
    yield context
    context.close()


@pytest.fixture
def page(console):
    opened = console.new_page()
    yield opened
    opened.close()


def kafka_conf(server: ServeProcess) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{server.kafka_port}",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": "streamlog", "sasl.password": TOKEN}


def create_topics(server: ServeProcess, **partitions: int) -> None:
    admin = AdminClient(kafka_conf(server))
    futures = admin.create_topics([NewTopic(name, count, 1)
                                   for name, count in partitions.items()])
    for future in futures.values():
        future.result(20)


def produce(server: ServeProcess, topic: str, messages) -> None:
    """(key, value) pairs, acks=all."""
    errors = []
    producer = Producer({**kafka_conf(server), "acks": "all", "linger.ms": 5})
    for key, value in messages:
        producer.produce(topic, key=key, value=value,
                         on_delivery=lambda e, m: errors.append(e) if e else None)
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors


PAGES = ["/", "/pricing", "/docs/quickstart", "/checkout", "/blog/event-time", "/signup"]
ACTIONS = ["view", "click", "scroll", "click", "view"]


def clicks(start: int, count: int) -> list[tuple[bytes, bytes]]:
    """Click events keyed by user, as a web front end would send them."""
    out = []
    for i in range(start, start + count):
        user = f"u-{1000 + (i * 37) % 211}"
        out.append((user.encode(), json.dumps({
            "user": user, "page": PAGES[i % len(PAGES)],
            "action": ACTIONS[i % len(ACTIONS)], "ms_on_page": 400 + (i * 7919) % 30_000,
            "session": f"s-{(i * 2654435761) % 65536:04x}",
            "ua": "Firefox/132" if i % 3 else "Chrome/131"}).encode()))
    return out


@pytest.fixture(scope="module")
def clicks_group(daemon):
    """A "clicks" topic (4 partitions, made through the Kafka port) and a group
    "clicks-dashboard" that read part of it, committed and left; then more clicks came in
    and the group's offsets moved, a sample period apart, so that the console's sampler
    has seen its lag change. Returns the group's name."""
    group = "clicks-dashboard"
    create_topics(daemon, clicks=4)
    produce(daemon, "clicks", clicks(0, 400))
    consumer = Consumer({**kafka_conf(daemon), "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 6000})
    consumer.subscribe(["clicks"])
    seen, deadline = 0, time.monotonic() + 30
    while seen < 250 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            seen += 1
    assert seen == 250
    consumer.commit(asynchronous=False)
    consumer.close()
    admin = AdminClient(kafka_conf(daemon))
    for step in range(3):
        time.sleep(data.SAMPLE_S * 1.05)
        if step < 2:
            produce(daemon, "clicks", clicks(400 + 150 * step, 150))
        else:  # the dashboard caught up on most partitions
            offsets = [TopicPartition("clicks", p, end - (12 * p))
                       for p, end in enumerate(watermarks(daemon, "clicks", 4))]
            for future in admin.alter_consumer_group_offsets([
                    confluent_kafka.ConsumerGroupTopicPartitions(group, offsets)]).values():
                future.result(20)
    time.sleep(data.SAMPLE_S * 1.05)
    return group


def watermarks(server: ServeProcess, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({**kafka_conf(server), "group.id": "console-test-watermarks"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)]
    finally:
        consumer.close()


def basic(password: str = TOKEN) -> str:
    return "Basic " + base64.b64encode(f"streamlog:{password}".encode()).decode()


def http_request(server: ServeProcess, method: str, path: str, form: dict | None = None,
                 headers: dict | None = None) -> tuple[int, dict, str]:
    """One request, redirects not followed: (status, headers, body)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.console_port, timeout=10)
    try:
        body = urllib.parse.urlencode(form) if form is not None else None
        sent = dict(headers or {})
        if body is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def ends(log, stream: str) -> dict[int, int]:
    return {p: log.end_offset(stream, p) for p in range(log.partition_count(stream))}


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=False)


# -- sign-in -----------------------------------------------------------------------------

def test_sign_in_refused_then_accepted(browser, daemon):
    context = browsers.new_context(browser)
    try:
        page = context.new_page()
        page.goto(daemon.console_url + "/")
        assert urllib.parse.urlsplit(page.url).path == "/login"  # not signed in yet

        page.fill("form#login input[name=password]", "not-the-token")
        with page.expect_response(lambda r: r.url.endswith("/login")
                                  and r.request.method == "POST") as answer:
            page.click("form#login button[type=submit]")
        assert answer.value.status == 401
        assert page.text_content("#error") == "Wrong user or password."
        assert context.cookies() == []
        page.goto(daemon.console_url + "/")
        assert urllib.parse.urlsplit(page.url).path == "/login"
        assert page.locator("table#streams").count() == 0

        page.fill("form#login input[name=password]", TOKEN)
        page.click("form#login button[type=submit]")
        page.wait_for_url(daemon.console_url + "/")
        assert page.text_content("h1") == "Overview"
        assert page.locator("table#streams").count() == 1
        (cookie,) = context.cookies()
        assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == (
            "streamlog_console", True, "Strict")
    finally:
        context.close()


def test_rate_limit_refuses_even_the_right_password_after_five_wrong(tmp_path_factory):
    # a daemon of its own: the failures count against 127.0.0.1, every test's address
    server = serve(tmp_path_factory, "console-rate", kafka=False)
    try:
        right = {"user": "streamlog", "password": TOKEN, "next": "/"}
        wrong = dict(right, password="guess")
        status, headers, _ = http_request(server, "POST", "/login", right)
        assert status == 303 and "streamlog_console=" in headers.get("Set-Cookie", "")
        for _ in range(5):
            status, _, body = http_request(server, "POST", "/login", wrong)
            assert status == 401 and "Wrong user or password." in body
        status, headers, body = http_request(server, "POST", "/login", right)
        assert status == 429 and "Too many wrong passwords" in body
        assert "Set-Cookie" not in headers
        status, headers, _ = http_request(server, "GET", "/api/overview",
                                          headers={"Authorization": basic()})
        assert status == 429 and 1 <= int(headers["Retry-After"]) <= 60
    finally:
        assert server.stop() == 0


# -- the overview ------------------------------------------------------------------------

def test_overview_lists_streams_made_through_the_api_and_the_kafka_port(
        page, daemon, log, clicks_group):
    log.create_stream("invoices", 2)
    create_topics(daemon, **{"page-views": 3})
    rows = page.locator("table#streams tr[data-stream]")
    deadline = time.monotonic() + 5  # the overview is computed at most once a second
    while True:
        page.goto(daemon.console_url + "/")
        names = rows.evaluate_all("rows => rows.map(r => r.dataset.stream)")
        if {"invoices", "page-views"} <= set(names) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert {"invoices", "page-views", "clicks"} <= set(names), names
    for name, partitions in (("invoices", 2), ("page-views", 3), ("clicks", 4)):
        row = page.locator(f'table#streams tr[data-stream="{name}"]')
        assert row.locator("td").nth(1).text_content() == str(partitions)
        assert row.locator("table.partitions tbody tr").count() == partitions
    clicks_records = page.locator('tr[data-stream="clicks"] > td').nth(2).text_content()
    assert clicks_records == f"{sum(ends(log, 'clicks').values()):,}"
    page.click('tr[data-stream="clicks"] summary')
    shot(page, "overview.png")


# -- the message browser -----------------------------------------------------------------

def first_at_hwm(timestamps: list[int], t: int) -> int:
    """DESIGN 5: the first record whose high-water mark (running maximum) is >= t; the
    end when none is."""
    hwm = None
    for offset, ts in enumerate(timestamps):
        hwm = ts if hwm is None else max(hwm, ts)
        if hwm >= t:
            return offset
    return len(timestamps)


def earliest_in_time(timestamps: list[int], t: int) -> int:
    """The record with the smallest timestamp >= t: where a seek that sorted by event
    time would start."""
    return min((ts, offset) for offset, ts in enumerate(timestamps) if ts >= t)[1]


def seek_by_time(page, server: ServeProcess, stream: str, local: str) -> None:
    page.goto(server.console_url + "/browse?" + urllib.parse.urlencode({"stream": stream}))
    page.select_option("form#seek select[name=stream]", stream)
    page.fill("form#seek input[name=partition]", "0")
    page.select_option("form#seek select[name=start]", "time")
    page.fill("form#seek input[name=time]", local)
    with page.expect_navigation():
        page.click("form#seek button[type=submit]")


def shown_offsets(page) -> list[int]:
    return [int(o) for o in page.locator("table#records tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.offset)")]


def test_seek_by_time_starts_at_the_high_water_mark_rule(page, daemon, log):
    base = datetime.datetime(2026, 3, 2, 8, 0, tzinfo=datetime.timezone.utc)
    base_us = int(base.timestamp()) * SECOND_US
    late = [10, 30, 20, 25, 40, 35, 50]  # seconds after base: out of order
    timestamps = [base_us + s * SECOND_US for s in late]
    log.create_stream("sensor-readings", 1)
    readings = [json.dumps({"sensor": "boiler-7", "celsius": round(61.5 + i * 0.4, 1),
                            "sent_at_s": s}).encode() for i, s in enumerate(late)]
    log.append_batch_sync("sensor-readings", readings, keys=[b"boiler-7"] * len(late),
                          timestamps_us=timestamps, partition=0)
    t = base_us + 25 * SECOND_US

    expected = first_at_hwm(timestamps, t)
    assert expected == log.offset_for_timestamp("sensor-readings", 0, t) == 1
    # the record stamped exactly T comes later: a seek by sorted time would start there
    assert earliest_in_time(timestamps, t) == 3 != expected

    seek_by_time(page, daemon, "sensor-readings", "2026-03-02T08:00:25.000")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)
    assert query["start"] == ["time"] and query["tz"] == ["0"]  # UTC, filled by the page
    assert page.locator("#error").count() == 0
    offsets = shown_offsets(page)
    assert offsets[0] == expected
    # everything from there is replayed, the late record (offset 2, stamped 20 s) too
    assert offsets == list(range(expected, len(late)))
    first = page.locator("table#records tbody tr").first
    assert first.locator("span.muted").first.text_content() == "2026-03-02T08:00:30.000000Z"
    shot(page, "browse-time-seek.png")


def test_key_filter_finds_one_record_among_100000(page, daemon, log):
    stream, batch, partitions = "accounts", 10_000, 4
    log.create_stream(stream, partitions)
    for b in range(10):  # batch b goes to partition b % 4, in order
        log.append_batch_sync(stream, [json.dumps({"account": f"acct-{i:06d}", "plan": (
            "team" if i % 5 else "enterprise"), "seats": 1 + i % 40}).encode()
            for i in range(b * batch, (b + 1) * batch)],
            keys=[f"acct-{i:06d}".encode() for i in range(b * batch, (b + 1) * batch)],
            partition=b % partitions)
    assert sum(ends(log, stream).values()) == 100_000
    wanted = 61_803
    b, i = divmod(wanted, batch)
    partition, offset = b % partitions, (b // partitions) * batch + i

    page.goto(daemon.console_url + "/browse?" + urllib.parse.urlencode({"stream": stream}))
    page.fill("form#seek input[name=partition]", "all")
    page.fill("form#seek input[name=key]", f"acct-{wanted:06d}")
    page.select_option("form#seek select[name=key_match]", "exact")
    with page.expect_navigation():
        page.click("form#seek button[type=submit]")

    rows = page.locator("table#records tbody tr")
    assert rows.count() == 1, page.text_content("#page-facts")
    assert (rows.first.get_attribute("data-partition"),
            rows.first.get_attribute("data-offset")) == (str(partition), str(offset))
    assert rows.first.locator("td.key").text_content() == f"acct-{wanted:06d}"
    assert json.loads(rows.first.locator("td.value pre").text_content()) == {
        "account": f"acct-{wanted:06d}", "plan": "team", "seats": 1 + wanted % 40}
    facts = " ".join(page.text_content("#page-facts").split())
    assert "1 records matching, 100,000 looked at" in facts, facts


# -- the live tail -----------------------------------------------------------------------

def record_row(position) -> str:
    return (f'#records tbody tr[data-partition="{position.partition}"]'
            f'[data-offset="{position.offset}"]')


def test_live_tail_shows_a_new_record_within_a_second_and_pauses(page, daemon, log):
    stream = "checkout-events"
    log.create_stream(stream, 2)
    log.append_batch_sync(stream, [b'{"step": "cart"}', b'{"step": "address"}'],
                          keys=[b"u-1", b"u-2"])
    page.goto(daemon.console_url + "/browse?" + urllib.parse.urlencode(
        {"stream": stream, "start": "end"}))
    assert page.locator("#records tbody tr").count() == 2
    page.click("button#tail-toggle")
    assert page.text_content("button#tail-toggle") == "Pause"

    appended = log.append_sync(stream, b'{"step": "paid", "cents": 4999}', key=b"u-7")
    row = record_row(appended)
    page.wait_for_selector(row, timeout=1000)  # within a second of the append's answer
    assert json.loads(page.text_content(row + " td.value pre")) == {
        "step": "paid", "cents": 4999}

    page.click("button#tail-toggle")
    assert page.text_content("button#tail-toggle") == "Live tail"
    assert page.text_content("#tail-status") == "paused"
    paused = log.append_sync(stream, b'{"step": "refund"}', key=b"u-7")
    held = record_row(paused)
    time.sleep(1.5)  # several of the tail's polls
    assert page.locator(held).count() == 0
    assert page.locator("#records tbody tr").count() == 3
    page.click("button#tail-toggle")  # resumed: from where it paused
    page.wait_for_selector(held, timeout=2000)
    assert page.locator("#records tbody tr").count() == 4


# -- consumer groups ---------------------------------------------------------------------

def test_group_lag_matches_confluent_kafka(page, daemon, clicks_group):
    consumer = Consumer({**kafka_conf(daemon), "group.id": clicks_group,
                         "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition("clicks", p) for p in range(4)],
                                       timeout=10)
        expected = {}
        for tp in committed:
            assert tp.error is None and tp.offset >= 0, tp
            high = consumer.get_watermark_offsets(TopicPartition("clicks", tp.partition),
                                                  timeout=10)[1]
            expected[tp.partition] = high - tp.offset
    finally:
        consumer.close()
    assert len(set(expected.values())) > 1 and sum(expected.values()) > 0  # not all alike

    page.goto(daemon.console_url + "/groups/" + clicks_group)
    rows = page.locator("table#offsets tr[data-topic][data-partition]")
    shown = {int(r.get_attribute("data-partition")): int(r.locator("td.lag").text_content())
             for r in rows.all() if r.get_attribute("data-topic") == "clicks"}
    assert shown == expected
    assert int(page.text_content("#lag-total").replace(",", "")) == sum(expected.values())
    # the sampler saw the lag change: a line of several points, not all at one height
    points = page.get_attribute("svg#lag-chart polyline", "points").split()
    assert len(points) >= 3 and len({p.split(",")[1] for p in points}) > 1, points
    shot(page, "group-lag.png")


# -- writes ------------------------------------------------------------------------------

def test_write_refused_on_a_read_only_console(page, daemon, log):
    log.create_stream("orders-ro", 1)
    log.append_sync("orders-ro", b"first")
    before = ends(log, "orders-ro")
    status, _, body = http_request(daemon, "POST", "/produce", {
        "stream": "orders-ro", "value": "sneaky", "confirm": "yes"},
        headers={"Authorization": basic()})
    assert status == 403 and "read-only" in body
    assert ends(log, "orders-ro") == before
    page.goto(daemon.console_url + "/")
    assert page.text_content("header .mode") == "read-only"
    assert page.locator('header nav a[href="/produce"]').count() == 0
    assert page.locator("header nav a").count() == 4  # the nav itself is there


def test_produce_through_the_page_asks_first(browser, writable):
    stream = "orders"
    with streamlog.open_log(writable.url, token=TOKEN) as log:
        log.create_stream(stream, 1)
        context = sign_in(browser, writable)
        try:
            page = context.new_page()
            page.goto(writable.console_url + "/")
            assert page.text_content("header .mode") == "read-write"
            page.click('header nav a[href="/produce"]')
            page.wait_for_url(writable.console_url + "/produce")
            dialogs = []

            def answer(accept: bool):
                def handler(dialog):
                    dialogs.append(dialog.message)
                    if accept:
                        dialog.accept()
                    else:
                        dialog.dismiss()
                return handler

            def fill():
                page.select_option("form#produce select[name=stream]", stream)
                page.fill("form#produce input[name=key]", "cust-42")
                page.fill("form#produce textarea[name=value]",
                          '{"order": 9001, "total_cents": 12999}')
                page.fill("form#produce textarea[name=headers]", "source: console")

            # dismissed: nothing is sent
            fill()
            before = ends(log, stream)
            page.once("dialog", answer(False))
            page.click("form#produce button[type=submit]")
            time.sleep(1.0)
            assert dialogs == ["Append this record to the log?"]
            assert urllib.parse.urlsplit(page.url).query == ""  # still the form
            assert ends(log, stream) == before

            # accepted: appended, and the page says where
            page.once("dialog", answer(True))
            with page.expect_navigation():
                page.click("form#produce button[type=submit]")
            assert len(dialogs) == 2
            assert ends(log, stream) == {0: before[0] + 1}
            assert page.text_content("#done") == (
                f"appended to {stream} partition 0 at offset {before[0]}")
            with log.reader(stream, 0, from_offset=before[0]) as reader:
                (record,) = list(reader.records())
            assert (record.key, record.value, list(record.headers)) == (
                b"cust-42", b'{"order": 9001, "total_cents": 12999}',
                [("source", b"console")])
        finally:
            context.close()


# -- edges: a stream made a moment ago, a zone with summer time ------------------------

def test_overview_shows_the_append_rate_of_a_stream_made_a_moment_ago(page, daemon, log):
    """Appends/s is the records appended over the last RATE_WINDOW_S: a stream made
    within that window counts from its creation, not as 0 until the window has passed."""
    stream = "signups"
    log.create_stream(stream, 1)
    for _ in range(2):  # 200 records over two sample periods, well inside the window
        log.append_batch_sync(stream, [b'{"plan": "free"}'] * 100, partition=0)
        time.sleep(data.SAMPLE_S * 1.1)
    assert 2 * data.SAMPLE_S * 1.1 < data.RATE_WINDOW_S - data.SAMPLE_S
    page.goto(daemon.console_url + "/")
    rate = page.locator(f'table#streams tr[data-stream="{stream}"] > td').nth(5)
    assert float(rate.text_content().replace(",", "")) > 0, (
        "200 records appended in the last few seconds, and Appends/s says "
        f"{rate.text_content()}")


def test_seek_by_time_reads_the_picker_in_the_zone_of_the_date_picked(browser, daemon, log):
    """The picker's value is local time of the date picked: in a zone with summer time,
    a date in the other season than today has another offset than today's."""
    zone = zoneinfo.ZoneInfo("Europe/Berlin")
    now = datetime.datetime.now(zone)
    month = 1 if now.dst() else 7  # the season we are not in
    local = datetime.datetime(now.year, month, 15, 12, 0, 0, tzinfo=zone)
    assert local.utcoffset() != now.utcoffset()
    start_us = int(local.timestamp()) * SECOND_US
    log.create_stream("berlin-meter", 1)
    log.append_batch_sync("berlin-meter", [b"kWh %d" % i for i in range(10)],
                          timestamps_us=[start_us + i * SECOND_US for i in range(10)],
                          partition=0)
    context = sign_in(browser, daemon, timezone_id="Europe/Berlin")
    try:
        page = context.new_page()
        seek_by_time(page, daemon, "berlin-meter", local.strftime("%Y-%m-%dT12:00:05.000"))
        assert page.locator("#error").count() == 0
        assert log.offset_for_timestamp("berlin-meter", 0, start_us + 5 * SECOND_US) == 5
        sent = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)["tz"]
        utc = (local + datetime.timedelta(seconds=5)).astimezone(datetime.timezone.utc)
        assert shown_offsets(page)[:1] == [5], (
            f"12:00:05 local on {local.date()} is {utc}; the page sent tz={sent}")
    finally:
        context.close()


def test_a_groups_offsets_move_to_the_earliest_latest_and_a_time(writable):
    """With --console-write, a group without members has its committed offsets moved,
    and confluent-kafka's committed() sees each move; a group with a member is not
    moved."""
    topic, group = "payments", "payments-audit"
    with streamlog.open_log(writable.url, token=TOKEN) as log:
        log.create_stream(topic, 2)
        for p in range(2):
            log.append_batch_sync(topic, [b"%d" % i for i in range(10)], partition=p,
                                  timestamps_us=[(i + 1) * SECOND_US for i in range(10)])
    consumer = Consumer({**kafka_conf(writable), "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, 5) for p in range(2)],
                        asynchronous=False)

        def committed():
            return [tp.offset for tp in consumer.committed(
                [TopicPartition(topic, p) for p in range(2)], timeout=10)]

        assert committed() == [5, 5]
        for form, expected in (({"to": "earliest"}, [0, 0]), ({"to": "latest"}, [10, 10]),
                               ({"to": "time", "time": "1970-01-01T00:00:03"}, [2, 2])):
            status, _, body = http_request(writable, "POST", f"/groups/{group}/reset",
                                           {**form, "confirm": "yes"},
                                           headers={"Authorization": basic()})
            assert status == 200, body
            assert committed() == expected
        consumer.subscribe([topic])  # a member now: moving is refused
        deadline = time.monotonic() + 20
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        status, _, body = http_request(writable, "POST", f"/groups/{group}/reset",
                                       {"to": "earliest", "confirm": "yes"},
                                       headers={"Authorization": basic()})
        assert status == 409 and "active members" in body
        assert committed() == [2, 2]
    finally:
        consumer.close()
