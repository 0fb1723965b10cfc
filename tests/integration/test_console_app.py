"""The console's web layer in process (console/app.py): sign-in on every route, the
rate limit, cookies and CSRF, read-only versus --console-write, the JSON API, the live
tail's events, TLS, and the shared overview. The browser's view is
test_console_browser.py's."""

import asyncio
import base64
import contextlib
import json
import re
import ssl
import time
import types

import aiohttp
import pytest

import streamlog
from streamlog.console import app as console_app
from streamlog.console import auth, data
from streamlog.console.admission import Admission
from streamlog.console.daemon import LocalDaemon
from streamlog.console.worker import listen

TOKEN = b"console-token"


def basic(password: str = TOKEN.decode(), user: str = "streamlog") -> dict:
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {encoded}"}


@pytest.fixture
def log(open_logs, log_dir):
    log = open_logs(log_dir, fsync="never")
    log.create_stream("clicks", 2)
    log.append_batch_sync("clicks", [json.dumps({"n": i}).encode() for i in range(20)],
                          keys=[b"user-%d" % (i % 4) for i in range(20)],
                          timestamps_us=[(i + 1) * 1_000_000 for i in range(20)])
    return log


async def start(log, *, write=False, tls=None, attach=True) -> console_app.Console:
    console = await console_app.Console.serve_socket(listen("127.0.0.1", 0),
                                                     console_app.ConsoleOptions(
                                                         token=TOKEN, write=write, tls=tls))
    if attach:
        blocking = lambda fn, *args: asyncio.to_thread(fn, *args)  # noqa: E731
        console.attach(log, blocking, LocalDaemon(log, blocking))
    return console


@contextlib.asynccontextmanager
async def serving(log, **options):
    """A console started on `log` (start's options), its base URL, closed on exit."""
    console = await start(log, **options)
    try:
        yield console, f"http://127.0.0.1:{console.port}"
    finally:
        await console.close()


def client(**options) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), **options)


ROUTES = [("GET", "/"), ("GET", "/browse"), ("GET", "/groups"), ("GET", "/groups/g"),
          ("GET", "/operators"), ("GET", "/produce"), ("GET", "/no-such-page"),
          ("GET", "/api/overview"), ("GET", "/api/browse?stream=clicks"),
          ("GET", "/api/tail?stream=clicks&cursor=0:0"), ("GET", "/api/groups"),
          ("POST", "/produce"), ("POST", "/retention"), ("POST", "/groups/g/reset")]


async def test_nothing_is_answered_without_sign_in(log):
    async with serving(log, write=True) as (console, base):
        async with client() as http:
            for method, path in ROUTES:
                async with http.request(method, base + path, allow_redirects=False,
                                        data={"confirm": "yes"}) as answer:
                    body = await answer.text()
                    if method == "GET" and not path.startswith("/api/"):
                        assert answer.status == 303, path
                        assert answer.headers["Location"].startswith("/login?next=/")
                    else:
                        assert answer.status == 401, path
                        assert answer.headers["WWW-Authenticate"].startswith("Basic")
                    assert "clicks" not in body and "user-" not in body
            for method, path in ROUTES:
                async with http.request(method, base + path, headers=basic("wrong"),
                                        allow_redirects=False) as answer:
                    assert answer.status in (401, 429), path
            # the login page and the style sheet need no sign-in, and show no data
            async with http.get(base + "/login") as answer:
                assert answer.status == 200 and "clicks" not in await answer.text()
            async with http.get(base + "/static/console.css") as answer:
                assert answer.status == 200
        assert log.end_offset("clicks", 0) + log.end_offset("clicks", 1) == 20


async def test_wrong_passwords_are_rate_limited_per_client(log):
    async with serving(log) as (console, base):
        async with client() as http:
            for _ in range(auth.FAILURES_MAX):
                async with http.get(base + "/api/overview", headers=basic("guess")) as answer:
                    assert answer.status == 401
            async with http.get(base + "/api/overview", headers=basic()) as answer:
                assert answer.status == 429  # the right password too, for the window
                assert 0 < int(answer.headers["Retry-After"]) <= auth.FAILURE_WINDOW_S
            async with http.post(base + "/login", data={"user": "streamlog",
                                                        "password": TOKEN.decode()},
                                 allow_redirects=False) as answer:
                assert answer.status == 429
                assert "Too many wrong passwords" in await answer.text()
                assert auth.COOKIE not in answer.cookies


async def test_the_login_page_gives_a_strict_http_only_cookie(log):
    async with serving(log) as (console, base):
        async with client() as http:
            async with http.post(base + "/login", data={"user": "streamlog",
                                                        "password": "nope"},
                                 allow_redirects=False) as answer:
                assert answer.status == 401
                assert "Wrong user or password" in await answer.text()
                assert auth.COOKIE not in answer.cookies
            async with http.post(base + "/login", data={
                    "user": "streamlog", "password": TOKEN.decode(),
                    "next": "/browse?stream=clicks"}, allow_redirects=False) as answer:
                assert answer.status == 303
                assert answer.headers["Location"] == "/browse?stream=clicks"
                cookie = answer.headers["Set-Cookie"]
                assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
                assert "Path=/" in cookie and "Secure" not in cookie  # no TLS here
            async with http.get(base + "/browse?stream=clicks") as answer:
                assert answer.status == 200 and "user-1" in await answer.text()
            async with http.get(base + "/") as answer:
                page = await answer.text()
            csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
            async with http.post(base + "/logout", data={"csrf": csrf},
                                 allow_redirects=False) as answer:
                assert answer.status == 303
            async with http.get(base + "/", allow_redirects=False) as answer:
                assert answer.status == 303  # signed out
            # never a redirect to another site
            async with http.post(base + "/login", data={
                    "user": "streamlog", "password": TOKEN.decode(),
                    "next": "//evil.example/"}, allow_redirects=False) as answer:
                assert answer.headers["Location"] == "/"


async def test_a_read_only_console_refuses_every_write(log):
    async with serving(log, write=False) as (console, base):
        async with client() as http:
            for path, form in (("/produce", {"stream": "clicks", "value": "x"}),
                               ("/retention", {}), ("/groups/g/reset", {"to": "earliest"})):
                async with http.post(base + path, headers=basic(),
                                     data={**form, "confirm": "yes"}) as answer:
                    assert answer.status == 403, path
                    assert "--console-write" in await answer.text()
            async with http.get(base + "/", headers=basic()) as answer:
                assert 'href="/produce"' not in await answer.text()
        assert log.end_offset("clicks", 0) + log.end_offset("clicks", 1) == 20


async def test_writes_need_confirmation_and_with_a_cookie_the_forms_token(log):
    async with serving(log, write=True) as (console, base):
        async with client() as http:
            async with http.post(base + "/produce", headers=basic(),
                                 data={"stream": "clicks", "value": "x"}) as answer:
                assert answer.status == 400 and "confirm=yes" in await answer.text()
            async with http.post(base + "/login", data={"user": "streamlog",
                                                        "password": TOKEN.decode()}):
                pass
            async with http.post(base + "/produce", data={
                    "stream": "clicks", "value": "x", "confirm": "yes",
                    "csrf": "forged"}) as answer:
                assert answer.status == 403 and "stale" in await answer.text()
            assert log.end_offset("clicks", 0) + log.end_offset("clicks", 1) == 20
            async with http.get(base + "/produce") as answer:
                csrf = re.search(r'name="csrf" value="([^"]+)"', await answer.text()).group(1)
            async with http.post(base + "/produce", data={
                    "stream": "clicks", "value": '{"page": "/pay"}', "key": "user-9",
                    "partition": "1", "headers": "source: console\ntrace: 7",
                    "timestamp": "2026-01-01T00:00:00", "tz": "-60", "confirm": "yes",
                    "csrf": csrf}, allow_redirects=False) as answer:
                assert answer.status == 303
                assert "offset" in answer.headers["Location"]
        (record,) = list(log.reader("clicks", 1, from_offset=log.end_offset("clicks", 1) - 1))
        assert (record.key, record.value) == (b"user-9", b'{"page": "/pay"}')
        assert record.headers == (("source", b"console"), ("trace", b"7"))
        assert record.timestamp_us == 1_767_225_600_000_000 - 3600 * 1_000_000


async def test_scripts_produce_and_apply_retention_with_basic(log):
    async with serving(log, write=True) as (console, base):
        async with client() as http:
            async with http.post(base + "/produce", headers=basic(), data={
                    "stream": "clicks", "value": "v", "partition": "0",
                    "confirm": "yes"}) as answer:
                assert answer.status == 200
                done = await answer.json()
            assert done["partition"] == 0 and done["offset"] == log.end_offset("clicks", 0) - 1
            for form, message in ((dict(stream="nope"), "no stream 'nope'"),
                                  (dict(stream="clicks", headers="no colon"),
                                   "a header is NAME: VALUE"),
                                  (dict(stream="clicks", timestamp="soon"),
                                   "nor ISO-8601")):
                async with http.post(base + "/produce", headers=basic(),
                                     data={**form, "confirm": "yes"}) as answer:
                    assert answer.status == 400 and message in await answer.text()
            async with http.post(base + "/retention", headers=basic(),
                                 data={"confirm": "yes"}) as answer:
                assert answer.status == 200
                assert (await answer.json())["deleted_segments"] == []
            async with http.post(base + "/groups/g/reset", headers=basic(),
                                 data={"confirm": "yes", "to": "earliest"}) as answer:
                assert answer.status == 409 and "--kafka-port" in await answer.text()


async def test_the_json_api_browses_and_says_what_is_wrong(log):
    async with serving(log) as (console, base):
        async with client(headers=basic()) as http:
            async with http.get(base + "/api/browse", params={
                    "stream": "clicks", "partition": "all", "start": "time",
                    "time": "1970-01-01T00:00:15"}) as answer:
                page = await answer.json()
            assert answer.status == 200
            assert sorted(r["timestamp_us"] for r in page["rows"]) == [
                t * 1_000_000 for t in range(15, 21)]
            async with http.get(base + "/api/browse", params={
                    "stream": "clicks", "key": "user-2", "limit": "2",
                    "partition": "0"}) as answer:
                page = await answer.json()
            assert [r["key"] for r in page["rows"]] == ["user-2"] * len(page["rows"])
            for params, message in (({"stream": "nope"}, "no stream"),
                                    ({"stream": "clicks", "partition": "x"},
                                     "partition must be a whole number"),
                                    ({"stream": "clicks", "start": "time", "time": "?"},
                                     "nor ISO-8601"),
                                    ({"stream": "clicks", "start": "middle"},
                                     "start at start, offset, time or end"),
                                    ({"stream": "clicks", "limit": "0"}, "1 to 500")):
                async with http.get(base + "/api/browse", params=params) as answer:
                    assert answer.status == 400
                    assert message in (await answer.json())["error"]
            async with http.get(base + "/browse", params={"stream": "clicks",
                                                          "offset": "-1",
                                                          "start": "offset"}) as answer:
                assert answer.status == 400
                assert "must not be negative" in await answer.text()


async def test_the_live_tail_sends_records_appended_after_it_opened(log):
    console = await start(log)
    base = f"http://127.0.0.1:{console.port}"
    ends = {p: log.end_offset("clicks", p) for p in range(2)}
    try:
        async with client(headers=basic()) as http:
            async with http.get(base + "/api/tail", params={
                    "stream": "clicks", "cursor": data.encode_cursor(ends)}) as events:
                assert events.headers["Content-Type"].startswith("text/event-stream")
                assert await events.content.readline() == b": live\n"
                await asyncio.sleep(0.3)
                appended = time.monotonic()
                position = await log.append("clicks", b"fresh", key=b"k")
                line = b""
                while not line.startswith(b"data: "):  # (the blank line ending ": live")
                    line = await asyncio.wait_for(events.content.readline(), 1.0)
                seen = time.monotonic() - appended
                event = json.loads(line.removeprefix(b"data: "))
            assert [(r["partition"], r["offset"], r["value"]) for r in event["rows"]] == [
                (position.partition, position.offset, "fresh")]
            assert seen < 1.0
            assert data.decode_cursor(event["cursor"])[position.partition] == (
                position.offset + 1)
            async with http.get(base + "/api/tail", params={
                    "stream": "clicks", "cursor": "7:0"}) as answer:
                assert answer.status == 400
    finally:
        await console.close()


async def test_a_console_bound_before_the_log_is_open_says_it_is_starting(log):
    console = await start(log, attach=False)
    try:
        async with client(headers=basic()) as http:
            async with http.get(f"http://127.0.0.1:{console.port}/api/overview") as answer:
                assert answer.status == 503 and "starting" in await answer.text()
    finally:
        await console.close()


async def test_twenty_overviews_at_once_read_the_log_once(log, monkeypatch):
    console = await start(log)
    calls = []
    real = data.overview

    def counted(*args):
        calls.append(1)
        time.sleep(0.05)
        return real(*args)

    monkeypatch.setattr(data, "overview", counted)
    try:
        async with client(headers=basic()) as http:
            async def one():
                async with http.get(f"http://127.0.0.1:{console.port}/") as answer:
                    assert answer.status == 200
                    return await answer.text()
            pages = await asyncio.gather(*(one() for _ in range(20)))
        assert len(calls) == 1
        assert all('data-stream="clicks"' in page for page in pages)
    finally:
        await console.close()


async def test_the_console_serves_tls_and_its_cookie_is_secure(log, certificate):
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    console = await start(log, tls=context)
    trust = ssl.create_default_context(cafile=cert)
    try:
        async with client() as http:
            async with http.post(f"https://127.0.0.1:{console.port}/login", ssl=trust, data={
                    "user": "streamlog", "password": TOKEN.decode()},
                    allow_redirects=False) as answer:
                assert answer.status == 303
                assert "Secure" in answer.headers["Set-Cookie"]
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{console.port}/login") as answer:
                    await answer.text()
    finally:
        await console.close()


def test_a_log_with_no_stream_has_an_overview(tmp_path):
    with streamlog.open_log(tmp_path / "empty") as log:
        shown = data.overview(log, data.Sampler())
    assert shown["streams"] == [] and shown["log_path"].endswith("empty")


async def test_console_work_is_admitted_one_at_a_time_within_its_share():
    clock = types.SimpleNamespace(now=0.0)
    slept = []

    async def sleep(seconds):
        slept.append(round(seconds, 6))
        clock.now += seconds

    admission = Admission(clock=lambda: clock.now, sleep=sleep)
    share, burst = Admission.SHARE, Admission.BURST_S
    async with admission:
        clock.now += burst + 0.1  # a request that took longer than the burst
    async with admission:  # waits until the budget is back at zero
        pass
    assert slept == [round(0.1 / share, 6)]
    order = []

    async def request(name):
        async with admission:
            order.append(f"{name} in")
            await asyncio.sleep(0.01)  # (real time: the other may try to enter meanwhile)
            order.append(f"{name} out")

    await asyncio.gather(request("a"), request("b"))
    assert order == ["a in", "a out", "b in", "b out"]


async def test_static_files_are_versioned_and_cached_pages_are_not(log):
    async with serving(log) as (console, base):
        async with client() as http:
            async with http.get(base + "/login") as answer:
                page = await answer.text()
                assert answer.headers["Cache-Control"] == "no-store"
            (css,) = re.findall(r'href="(/static/console\.css\?v=[0-9a-f]{12})"', page)
            async with http.get(base + css) as answer:
                assert answer.status == 200
                assert answer.headers["Cache-Control"] == "public, max-age=86400"
                assert "--accent" in await answer.text()
