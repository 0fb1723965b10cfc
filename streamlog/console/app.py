"""The console's web layer: aiohttp routes, Jinja2 pages, the sign-in middleware, the
live tail as server-sent events, and the write actions.

Strategy: `Console.bind(options)` binds the port (with the daemon's other ports, before
the log is opened, so a port in use fails before anything is created) and answers 503
"starting" until `attach(log, blocking, metrics, kafka)` hands it the open log. Every
page is rendered on the server from data.py's values, which run on the daemon's thread
pool (`blocking`), never on the event loop; the page's script only formats times in the
browser's zone, fills the zone offset of the date-time picker, asks before a write and
runs the live tail (EventSource). The overview is computed at most once per
OVERVIEW_TTL_S however many browsers ask (one computation in flight, its answer shared),
so twenty consoles cost the log what one does.

Every route but /login and /static needs a signed-in session (cookie) or HTTP Basic
(auth.py); pages redirect to /login, /api answers 401. Writes (POST) need --console-write
(else 403), a `confirm=yes` field (the page's confirmation dialog sets it), and with a
cookie the session's CSRF token. Bounds: TAILS_MAX live tails at once; a tail event
carries at most data.TAIL_RECORDS_MAX records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import pathlib
import socket
import time

import jinja2
import markupsafe
from aiohttp import web

from ..errors import StreamLogError
from . import auth, data, render

OVERVIEW_TTL_S = 1.0
TAILS_MAX = 64
TAIL_POLL_S = 0.2
TAIL_PING_S = 15.0
STATIC_MAX_AGE_S = 86_400
HERE = pathlib.Path(__file__).parent
# What the sign-in middleware leaves on a request for its handler.
CSRF = web.RequestKey("csrf", str)  # the session's CSRF token ("" under HTTP Basic)
BASIC = web.RequestKey("basic", bool)  # signed in by HTTP Basic (a script), not a cookie
FORM = web.RequestKey("form", object)  # a POST's form, read once by the middleware
_LOG = logging.getLogger("streamlog.console")


@dataclasses.dataclass(frozen=True)
class ConsoleOptions:
    token: bytes
    host: str = "127.0.0.1"
    port: int = 7543  # 0: any free port
    tls: object = None  # an ssl.SSLContext, or None
    write: bool = False


class Console:
    """One daemon's console. Loop-thread only, but for what `blocking` runs."""

    def __init__(self, options: ConsoleOptions) -> None:
        self.options = options
        self.gate = auth.Gate(options.token)
        self.sampler = data.Sampler()
        self.log = None
        self.kafka = None
        self.metrics = None
        self.blocking = None
        self.port: int | None = None
        self.closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._sampling: asyncio.Task | None = None
        self._overview: tuple[float, asyncio.Future] | None = None
        self._tails = 0
        self.templates = _Templates(
            loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined)
        self.templates.filters.update(size=render.size_text, utc=render.utc_text)
        self.templates.globals["static"] = _static_urls()
        self.admission = Admission()

    # -- lifetime ---------------------------------------------------------------------

    @classmethod
    async def bind(cls, options: ConsoleOptions) -> "Console":
        """Listen on options.host:options.port; OSError when the port cannot be bound."""
        console = cls(options)
        sock = socket.create_server((options.host, options.port), reuse_port=False,
                                    family=socket.AF_INET6 if ":" in options.host
                                    else socket.AF_INET)
        console.port = sock.getsockname()[1]
        console._runner = web.AppRunner(console.app(), access_log=None, shutdown_timeout=1.0,
                                        handle_signals=False)
        await console._runner.setup()
        await web.SockSite(console._runner, sock, ssl_context=options.tls).start()
        return console

    def attach(self, log, blocking, metrics=None, kafka=None) -> None:
        """Serve `log` (open): `blocking(fn, *args)` awaits fn on the daemon's pool."""
        self.log, self.blocking, self.metrics, self.kafka = log, blocking, metrics, kafka
        self._sampling = asyncio.get_running_loop().create_task(self._sample())

    async def close(self) -> None:
        self.closing.set()
        if self._sampling is not None:
            self._sampling.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _sample(self) -> None:
        while not self.closing.is_set():
            try:
                await self.blocking(self.sampler.sample, self.log, self.kafka)
            except Exception as error:  # noqa: BLE001 - logged; sampling goes on
                _LOG.warning("console_sample_failed", extra={"fields": {"reason": repr(error)}})
            await asyncio.sleep(data.SAMPLE_S)

    # -- the application --------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=1 << 20)
        get, post = web.get, web.post
        app.add_routes([
            get("/login", self.login_page), post("/login", self.login),
            post("/logout", self.logout),
            get("/", self.overview_page), get("/api/overview", self.overview_api),
            get("/browse", self.browse_page), get("/api/browse", self.browse_api),
            get("/api/tail", self.tail_events),
            get("/groups", self.groups_page), get("/groups/{group}", self.group_page),
            get("/api/groups", self.groups_api), get("/api/groups/{group}", self.group_api),
            post("/groups/{group}/reset", self.reset_group),
            get("/operators", self.operators_page),
            get("/produce", self.produce_page), post("/produce", self.produce),
            post("/retention", self.retention),
            web.static("/static", HERE / "static")])
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        path = request.path
        if path == "/login" or path.startswith("/static/"):
            return await self._secure(await handler(request))
        client = request.remote or "?"
        header = request.headers.get("Authorization", "")
        request[CSRF] = ""
        if header:
            wait = self.gate.retry_after(client)
            if wait:
                raise web.HTTPTooManyRequests(text=f"too many wrong passwords: try again "
                                                   f"in {wait} s\n",
                                              headers={"Retry-After": str(wait)})
            verdict = self.gate.basic(client, header)
            if not verdict:
                raise _unauthorized("wrong user or password" if verdict is False
                                    else "HTTP Basic only")
            request[BASIC] = True
        else:
            csrf = self.gate.session(request.cookies.get(auth.COOKIE))
            if csrf is None:
                if path.startswith("/api/") or request.method != "GET":
                    raise _unauthorized("sign in first")
                raise web.HTTPSeeOther(f"/login?next={_quote(request.path_qs)}")
            request[CSRF], request[BASIC] = csrf, False
        if self.log is None:
            raise web.HTTPServiceUnavailable(text="starting: the log is being opened\n")
        if request.method == "POST":
            await self._check_write(request)
        if path == "/api/tail":  # a long stream: each of its steps is admitted instead
            return await self._secure(await handler(request))
        async with self.admission:
            return await self._secure(await handler(request))

    async def _check_write(self, request: web.Request) -> None:
        form = await request.post()
        request[FORM] = form
        if request.path == "/logout":
            return
        if not self.options.write:
            raise web.HTTPForbidden(text="read-only console: start the daemon with "
                                         "--console-write to allow writes\n")
        if not request[BASIC] and not self.gate.csrf_ok(
                request.cookies.get(auth.COOKIE), str(form.get("csrf", ""))):
            raise web.HTTPForbidden(text="the form is stale: reload the page\n")
        if form.get("confirm") != "yes":
            raise web.HTTPBadRequest(text="a write needs confirm=yes\n")

    async def _secure(self, response: web.StreamResponse) -> web.StreamResponse:
        headers = response.headers
        headers.setdefault("Content-Security-Policy",
                           "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
        headers.setdefault("X-Content-Type-Options", "nosniff")
        headers.setdefault("Referrer-Policy", "same-origin")
        if isinstance(response, web.FileResponse):  # under a versioned URL (_static_urls)
            headers.setdefault("Cache-Control", f"public, max-age={STATIC_MAX_AGE_S}")
        else:
            headers.setdefault("Cache-Control", "no-store")
        return response

    def page(self, request: web.Request, name: str, status: int = 200, **values):
        body = self.templates.get_template(name).render(
            csrf=request.get(CSRF, ""), write=self.options.write, path=request.path,
            stream_names=self._stream_names(), **values)
        return web.Response(text=body, content_type="text/html", status=status)

    def _stream_names(self) -> list[str]:
        return sorted(self.log.streams()) if self.log is not None else []

    # -- sign-in ----------------------------------------------------------------------

    async def login_page(self, request: web.Request):
        return self._login_form(request, "")

    def _login_form(self, request, error: str, status: int = 200):
        body = self.templates.get_template("login.html").render(
            error=error, next=_safe_next(request.query.get("next", "/")))
        return web.Response(text=body, content_type="text/html", status=status)

    async def login(self, request: web.Request):
        form = await request.post()
        client = request.remote or "?"
        wait = self.gate.retry_after(client)
        if wait:
            return self._login_form(request, f"Too many wrong passwords: try again in "
                                             f"{wait} s.", status=429)
        if not self.gate.check(client, str(form.get("user", "")),
                               str(form.get("password", ""))):
            _LOG.warning("console_sign_in_refused", extra={"fields": {"peer": client}})
            return self._login_form(request, "Wrong user or password.", status=401)
        response = _see_other(_safe_next(str(form.get("next", "/"))))
        response.set_cookie(auth.COOKIE, self.gate.open_session(), httponly=True,
                            samesite="Strict", secure=self.options.tls is not None,
                            path="/", max_age=auth.SESSION_TTL_S)
        return response

    async def logout(self, request: web.Request):
        self.gate.close_session(request.cookies.get(auth.COOKIE))
        response = _see_other("/login")
        response.del_cookie(auth.COOKIE, path="/")
        return response

    # -- overview ---------------------------------------------------------------------

    async def overview_shared(self) -> tuple[dict, str]:
        """The overview's values and its streams table rendered, computed at most once
        per OVERVIEW_TTL_S (one computation in flight; every request shares it)."""
        now = time.monotonic()
        if self._overview is None or now - self._overview[0] > OVERVIEW_TTL_S:
            future = asyncio.ensure_future(self.blocking(self._overview_now))
            self._overview = (now, future)
        values, table = await asyncio.shield(self._overview[1])
        values = dict(values)
        values["daemon_rate"] = (self.metrics.appends_per_second()
                                 if self.metrics is not None else None)
        return values, table

    def _overview_now(self) -> tuple[dict, str]:
        values = data.overview(self.log, self.sampler)
        return values, self.templates.get_template("streams.html").render(**values)

    async def overview_page(self, request: web.Request):
        values, table = await self.overview_shared()
        return self.page(request, "overview.html", done=request.query.get("done", ""),
                         table=markupsafe.Markup(table), **values)

    async def overview_api(self, request: web.Request):
        values, _ = await self.overview_shared()
        return web.json_response(values, dumps=_dumps)

    # -- the message browser ----------------------------------------------------------

    def query(self, request: web.Request) -> data.Query:
        q = request.query
        stream = q.get("stream") or next(iter(self._stream_names()), "")
        try:
            partition = q.get("partition", "all")
            query = data.Query(
                stream=stream, partition=None if partition in ("", "all") else _whole(
                    "partition", partition),
                start=q.get("start", "start"), cursor=q.get("cursor", ""),
                limit=_whole("page size", q.get("limit") or str(data.PAGE_RECORDS)),
                key=q.get("key", ""), key_match=q.get("key_match", "exact"),
                value_text=q.get("value", ""))
            if query.start == "offset":
                query.offset = _whole("offset", q.get("offset", "0"))
            elif query.start == "time":
                query.time_us = render.parse_time_us(q.get("time", ""), q.get("tz"))
            elif query.start not in ("start", "end", "cursor"):
                raise data.BadQuery(f"start at start, offset, time or end "
                                    f"(not {query.start!r})")
        except ValueError as error:
            raise data.BadQuery(str(error)) from None
        if query.key_match not in ("exact", "substring"):
            raise data.BadQuery("key_match is exact or substring")
        return query

    async def browse_values(self, request: web.Request):
        try:
            query = self.query(request)
            if not query.stream:
                return query, None, "The log has no streams yet."
            page = await self.blocking(data.browse, self.log, query)
            return query, page, ""
        except (data.BadQuery, StreamLogError) as error:
            return None, None, str(error)

    async def browse_page(self, request: web.Request):
        query, page, error = await self.browse_values(request)
        links = {}
        if page is not None:
            links = self._page_links(request, query, page)
        return self.page(request, "browse.html", status=400 if error and query is None
                         else 200, query=query, page=page, error=error, links=links,
                         q=request.query)

    def _page_links(self, request, query: data.Query, page: data.Page) -> dict:
        base = {k: v for k, v in request.query.items()
                if k in ("stream", "partition", "limit", "key", "key_match", "value")}
        def at(positions):
            return "/browse?" + _urlencode({**base, "start": "cursor",
                                            "cursor": data.encode_cursor(positions)})
        previous = None if query.filtered() else data.previous_positions(page, query.limit)
        return {"next": at(page.next_positions),
                "previous": at(previous) if previous and previous != page.positions else None,
                "tail_from": data.encode_cursor(page.ends)}

    async def browse_api(self, request: web.Request):
        query, page, error = await self.browse_values(request)
        if error:
            return web.json_response({"error": error}, status=400)
        return web.json_response({
            "stream": page.stream, "partitions": page.partitions, "rows": page.rows,
            "positions": page.positions, "next": data.encode_cursor(page.next_positions),
            "ends": page.ends, "scanned": page.scanned, "stopped_early": page.stopped_early,
            "seconds": round(page.seconds, 4)}, dumps=_dumps)

    async def tail_events(self, request: web.Request):
        """Server-sent events: each new record batch as `data: {"rows": [...],
        "cursor": ...}` from the cursor given, until the browser goes away."""
        try:
            query = self.query(request)
            positions = data.decode_cursor(request.query.get("cursor", ""))
            count = self.log.partition_count(query.stream)
        except (data.BadQuery, StreamLogError) as error:
            raise web.HTTPBadRequest(text=f"{error}\n") from None
        if not positions or any(not 0 <= p < count for p in positions):
            raise web.HTTPBadRequest(text="cursor names no partition of the stream\n")
        if self._tails >= TAILS_MAX:
            raise web.HTTPServiceUnavailable(text="too many live tails open\n")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-store",
                                               "X-Accel-Buffering": "no"})
        await self._secure(response)
        await response.prepare(request)
        self._tails += 1
        filtered = query if query.filtered() else None
        last_write = time.monotonic()
        try:
            await response.write(b": live\n\n")
            while not self.closing.is_set():
                fresh = any(self.log.end_offset(query.stream, p) > at
                            for p, at in positions.items())
                if fresh:
                    async with self.admission:
                        rows, positions = await self.blocking(
                            data.tail, self.log, query.stream, positions, filtered)
                    event = {"rows": rows, "cursor": data.encode_cursor(positions)}
                    await response.write(b"data: " + _dumps(event).encode() + b"\n\n")
                    last_write = time.monotonic()
                    continue
                if time.monotonic() - last_write > TAIL_PING_S:
                    await response.write(b": ping\n\n")
                    last_write = time.monotonic()
                await asyncio.sleep(TAIL_POLL_S)
        except (ConnectionError, asyncio.CancelledError, StreamLogError):
            pass
        finally:
            self._tails -= 1
        return response

    # -- groups -----------------------------------------------------------------------

    async def groups_page(self, request: web.Request):
        found = await self.blocking(data.groups, self.kafka, self.log, self.sampler)
        return self.page(request, "groups.html", groups=found, kafka=self.kafka is not None)

    async def groups_api(self, request: web.Request):
        found = await self.blocking(data.groups, self.kafka, self.log, self.sampler)
        return web.json_response({"groups": found}, dumps=_dumps)

    async def group_values(self, request: web.Request) -> dict:
        name = request.match_info["group"]
        found = await self.blocking(data.group, self.kafka, self.log, self.sampler, name)
        if found is None:
            raise web.HTTPNotFound(text=f"no consumer group {name!r}\n")
        return found

    async def group_page(self, request: web.Request):
        found = await self.group_values(request)
        return self.page(request, "group.html", group=found, message=request.query.get(
            "done", ""))

    async def group_api(self, request: web.Request):
        return web.json_response(await self.group_values(request), dumps=_dumps)

    async def reset_group(self, request: web.Request):
        name, form = request.match_info["group"], request[FORM]
        if self.kafka is None or self.kafka.broker is None:
            raise web.HTTPConflict(text="no Kafka listener: start serve with --kafka-port\n")
        found = self.kafka.coordinator.groups.get(name)
        if found is not None and found.members:
            raise web.HTTPConflict(text=f"group {name!r} has {len(found.members)} active "
                                        "members: stop its consumers first (as Kafka's "
                                        "kafka-consumer-groups --reset-offsets asks)\n")
        to = str(form.get("to", ""))
        try:
            time_us = (render.parse_time_us(str(form.get("time", "")), form.get("tz"))
                       if to == "time" else None)
        except ValueError as error:
            raise web.HTTPBadRequest(text=f"{error}\n") from None
        if to not in ("earliest", "latest", "time"):
            raise web.HTTPBadRequest(text="to is earliest, latest or time\n")
        commits = await self.blocking(_reset_commits, self.log, self.kafka, name,
                                      str(form.get("topic", "")), to, time_us)
        if not commits:
            raise web.HTTPBadRequest(text="the group has no committed offsets to move "
                                          "(of that topic)\n")
        await self.blocking(self.kafka.broker.commit_offsets, name, commits)
        _LOG.info("console_group_reset", extra={"fields": {
            "group": name, "to": to, "partitions": len(commits), "peer": request.remote}})
        if request[BASIC]:
            return web.json_response({"group": name, "offsets": [
                {"topic": t, "partition": p, "offset": o} for t, p, o, _ in commits]})
        raise web.HTTPSeeOther(f"/groups/{_quote(name)}?done=moved+{len(commits)}+offsets")

    # -- operators --------------------------------------------------------------------

    async def operators_page(self, request: web.Request):
        return self.page(request, "operators.html",
                         **await self.blocking(data.operators, self.log))

    # -- writes -----------------------------------------------------------------------

    async def produce_page(self, request: web.Request):
        return self.page(request, "produce.html", done=request.query.get("done", ""),
                         error="")

    async def produce(self, request: web.Request):
        form = request[FORM]
        stream = str(form.get("stream", ""))
        try:
            if stream not in self.log.streams():
                raise ValueError(f"no stream {stream!r}")
            partition = str(form.get("partition", "")).strip()
            headers = _headers(str(form.get("headers", "")))
            when = str(form.get("timestamp", "")).strip()
            key = str(form.get("key", ""))
            position = await self.log.append(
                stream, str(form.get("value", "")).encode(),
                key=key.encode() if key else None,
                partition=int(partition) if partition else None, headers=headers or None,
                timestamp_us=render.parse_time_us(when, form.get("tz")) if when else None)
        except (ValueError, StreamLogError) as error:
            if request[BASIC]:
                raise web.HTTPBadRequest(text=f"{error}\n") from None
            return self.page(request, "produce.html", status=400, done="", error=str(error))
        _LOG.info("console_produce", extra={"fields": {
            "stream": stream, "partition": position.partition, "offset": position.offset,
            "peer": request.remote}})
        if request[BASIC]:
            return web.json_response({"stream": stream, "partition": position.partition,
                                      "offset": position.offset})
        raise web.HTTPSeeOther("/produce?" + _urlencode({
            "done": f"appended to {stream} partition {position.partition} at offset "
                    f"{position.offset}"}))

    async def retention(self, request: web.Request):
        deleted = await self.blocking(self.log.apply_retention)
        _LOG.info("console_retention", extra={"fields": {"segments": len(deleted),
                                                         "peer": request.remote}})
        if request[BASIC]:
            return web.json_response({"deleted_segments": deleted})
        raise web.HTTPSeeOther("/?" + _urlencode({"done": f"retention applied: "
                                                          f"{len(deleted)} segments deleted"}))


class Admission:
    """The console's share of the daemon: its requests are worked on one at a time, and
    their time is drawn from a budget that refills at SHARE seconds a second (up to
    BURST_S), so a flood of console requests waits its turn instead of taking the CPU
    (and the interpreter's lock) from the daemon's appends. A request's time is its
    wall time while admitted: what it waited for the lock counts too, so the share is
    conservative. `async with admission:` around each piece of console work."""

    SHARE = 0.2
    BURST_S = 0.5

    def __init__(self, clock=time.monotonic, sleep=asyncio.sleep) -> None:
        self._clock, self._sleep = clock, sleep
        self._turn = asyncio.Lock()
        self._tokens = self.BURST_S
        self._at = clock()
        self._started = 0.0
        self.waited_s = 0.0  # time requests spent waiting for the budget, in all

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.BURST_S, self._tokens + (now - self._at) * self.SHARE)
        self._at = now

    async def __aenter__(self) -> None:
        await self._turn.acquire()
        self._refill()
        if self._tokens < 0:
            wait = -self._tokens / self.SHARE
            self.waited_s += wait
            await self._sleep(wait)
            self._refill()
        self._started = self._clock()

    async def __aexit__(self, *exc) -> None:
        self._refill()
        self._tokens -= self._clock() - self._started
        self._turn.release()


def _static_urls() -> dict[str, str]:
    """Each static file's URL with its content's digest: a browser may keep it for
    STATIC_MAX_AGE_S, since a new version comes under a new URL."""
    import hashlib
    return {path.name: f"/static/{path.name}?v="
                       f"{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
            for path in sorted((HERE / "static").iterdir()) if path.is_file()}


class _Templates(jinja2.Environment):
    """Jinja2 with `a.b` on a dict looked up as a key first: jinja's own order (the
    attribute, then the key) raises and catches an AttributeError for every field of
    the values data.py returns."""

    def getattr(self, obj, attribute):
        if type(obj) is dict:
            try:
                return obj[attribute]
            except KeyError:
                pass
        return super().getattr(obj, attribute)


def _reset_commits(log, kafka, group: str, topic: str, to: str, time_us: int | None):
    """(topic, partition, offset, None) for each committed place of the group (of
    `topic` when given) moved to the earliest, the latest or the time's offset."""
    commits = []
    for (name, partition) in sorted(kafka.broker.offsets.of(group)):
        if topic and name != topic:
            continue
        if to == "earliest":
            offset = log.start_offset(name, partition)
        elif to == "latest":
            offset = log.end_offset(name, partition)
        else:
            offset = log.offset_for_timestamp(name, partition, time_us)
        commits.append((name, partition, offset, None))
    return commits


def _whole(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise data.BadQuery(f"{name} must be a whole number (got {text!r})") from None
    if value < 0:
        raise data.BadQuery(f"{name} must not be negative (got {value})")
    return value


def _headers(text: str) -> list[tuple[str, bytes]]:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"a header is NAME: VALUE (got {line!r})")
        out.append((name.strip(), value.strip().encode()))
    return out


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _unauthorized(text: str) -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(text=f"{text}\n", headers={
        "WWW-Authenticate": 'Basic realm="streamlog console", charset="UTF-8"'})


def _safe_next(target: str) -> str:
    """Only a path of this site: never another origin (an open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


def _quote(text: str) -> str:
    from urllib.parse import quote
    return quote(text, safe="/?=&")


def _urlencode(values: dict) -> str:
    from urllib.parse import urlencode
    return urlencode(values)


def _dumps(value) -> str:
    return json.dumps(value, default=str)
