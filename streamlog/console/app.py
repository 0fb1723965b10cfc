"""The console's web layer: aiohttp routes, Jinja2 pages, the sign-in middleware, the
live tail as server-sent events, and the write actions.

Strategy: a `Console` serves a listening socket (`serve_socket`; worker.listen makes one) and
answers 503 "starting" until `attach(log, blocking, daemon)` hands it the log, a thread
pool to read it on (`blocking`), and the daemon's calls (daemon.py: the consumer groups,
the append counter, the writes). The daemon runs it in a worker process of its own
(worker.py) over a read-only view of its log, refreshed for each page (the tail and the
sampler: every REFRESH_S); tests
run it in one process over the log itself. Every page is rendered on the server from
data.py's values, which run on the pool, never on the event loop; the page's script only
formats times in the browser's zone, fills the date-time pickers' zone, asks before a
write and runs the live tail (EventSource). The overview (and its streams table,
rendered) is computed at most once per OVERVIEW_TTL_S however many browsers ask.

Every route but /login and /static needs a signed-in session (cookie) or HTTP Basic
(auth.py); pages redirect to /login, /api answers 401. Writes (POST) need --console-write
(else 403), a `confirm=yes` field (the page's confirmation dialog sets it), and with a
cookie the session's CSRF token. Work is admitted one request at a time within a share
of a core (`Admission`). Bounds: TAILS_MAX live tails at once; a tail event carries at
most data.TAIL_RECORDS_MAX records. Static files are served under their content's
digest with a day's max-age.
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
from .admission import Admission
from .daemon import Refused

OVERVIEW_TTL_S = 1.0
TAILS_MAX = 64
TAIL_POLL_S = 0.2
TAIL_PING_S = 15.0
STATIC_MAX_AGE_S = 86_400
REFRESH_S = 0.2  # the live tail and the sampler take in the daemon's appends this often
HERE = pathlib.Path(__file__).parent
# What the sign-in middleware leaves on a request for its handler.
CSRF = web.RequestKey("csrf", str)  # the session's CSRF token ("" under HTTP Basic)
BASIC = web.RequestKey("basic", bool)  # signed in by HTTP Basic (a script), not a cookie
FORM = web.RequestKey("form", object)  # a POST's form, read once by the middleware
_LOG = logging.getLogger("streamlog.console")


@dataclasses.dataclass(frozen=True)
class ConsoleOptions:
    token: bytes
    tls: object = None  # an ssl.SSLContext, or None
    write: bool = False
    share: float = 0.2  # of a core: the console's work budget (Admission)


class Console:
    """One daemon's console. Loop-thread only, but for what `blocking` runs."""

    def __init__(self, options: ConsoleOptions) -> None:
        self.options = options
        self.gate = auth.Gate(options.token)
        self.sampler = data.Sampler()
        self.log = None
        self.daemon = None  # daemon.LocalDaemon or LinkedDaemon
        self.blocking = None
        self.port: int | None = None
        self.closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._sampling: asyncio.Task | None = None
        self._overview: tuple[float, asyncio.Future] | None = None
        self._refreshed: tuple[float, asyncio.Future] | None = None
        self._tails = 0
        self.templates = _Templates(
            loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined)
        self.templates.filters.update(size=render.size_text, utc=render.utc_text)
        self.templates.globals["static"] = _static_urls()
        self.admission = Admission(share=options.share)

    # -- lifetime ---------------------------------------------------------------------

    @classmethod
    async def serve_socket(cls, sock: socket.socket, options: ConsoleOptions) -> "Console":
        """Serve on `sock`, a listening socket (the worker's, bound by the daemon)."""
        console = cls(options)
        console.port = sock.getsockname()[1]
        console._runner = web.AppRunner(console.app(), access_log=None, shutdown_timeout=1.0,
                                        handle_signals=False)
        await console._runner.setup()
        await web.SockSite(console._runner, sock, ssl_context=options.tls).start()
        return console

    def attach(self, log, blocking, daemon) -> None:
        """Serve `log` (open; a read-only view in the worker): `blocking(fn, *args)`
        awaits fn on a thread pool, `daemon` (daemon.py) answers what only the daemon's
        process knows and does its writes."""
        self.log, self.blocking, self.daemon = log, blocking, daemon
        self._sampling = asyncio.get_running_loop().create_task(self._sample())

    async def fresh(self, within_s: float = 0.0) -> None:
        """A read-only view takes in what the daemon appended (Log.refresh): a refresh
        begun at most `within_s` ago (0: begun now, so a page shows what was appended
        before it was asked for) serves; one refresh in flight at a time, shared."""
        if not self.log.readonly:
            return
        asked = time.monotonic()
        while True:
            if self._refreshed is not None and self._refreshed[0] >= asked - within_s:
                await asyncio.shield(self._refreshed[1])
                return
            if self._refreshed is not None and not self._refreshed[1].done():
                await asyncio.wait([self._refreshed[1]])  # (begun before: wait it out)
                continue
            self._refreshed = (time.monotonic(),
                               asyncio.ensure_future(self.blocking(self.log.refresh)))

    async def close(self) -> None:
        self.closing.set()
        if self._sampling is not None:
            self._sampling.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _sample(self) -> None:
        while not self.closing.is_set():
            try:
                await self.fresh(REFRESH_S)
                await self.blocking(self.sampler.sample, self.log, await self.daemon.groups())
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
        await self.fresh()  # (before its turn: the requests that queue share one refresh)
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
        values["daemon_rate"] = await self.daemon.appends_per_second()
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
        last_write = time.monotonic()
        try:
            await response.write(b": live\n\n")
            while not self.closing.is_set():
                await self.fresh(REFRESH_S)
                fresh = any(self.log.end_offset(query.stream, p) > at
                            for p, at in positions.items())
                if fresh:
                    async with self.admission:
                        rows, positions = await self.blocking(
                            data.tail, self.log, query.stream, positions, query)
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
        snapshot = await self.daemon.groups()
        found = await self.blocking(data.groups, snapshot, self.log)
        return self.page(request, "groups.html", groups=found, kafka=snapshot is not None)

    async def groups_api(self, request: web.Request):
        found = await self.blocking(data.groups, await self.daemon.groups(), self.log)
        return web.json_response({"groups": found}, dumps=_dumps)

    async def group_values(self, request: web.Request) -> dict:
        name = request.match_info["group"]
        found = await self.blocking(data.group, await self.daemon.groups(), self.log,
                                    self.sampler, name)
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
        to = str(form.get("to", ""))
        try:
            time_us = (render.parse_time_us(str(form.get("time", "")), form.get("tz"))
                       if to == "time" else None)
            moved = await self.daemon.reset_group(name, str(form.get("topic", "")), to,
                                                  time_us)
        except ValueError as error:
            raise web.HTTPBadRequest(text=f"{error}\n") from None
        except Refused as refused:
            raise _refused(refused) from None
        _LOG.info("console_group_reset", extra={"fields": {
            "group": name, "to": to, "partitions": len(moved), "peer": request.remote}})
        if request[BASIC]:
            return web.json_response({"group": name, "offsets": [
                {"topic": t, "partition": p, "offset": o} for t, p, o in moved]})
        raise web.HTTPSeeOther(f"/groups/{_quote(name)}?done=moved+{len(moved)}+offsets")

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
            partition = str(form.get("partition", "")).strip()
            when = str(form.get("timestamp", "")).strip()
            key = str(form.get("key", ""))
            at = await self.daemon.produce(
                stream, str(form.get("value", "")).encode(), key.encode() if key else None,
                _whole("partition", partition) if partition else None,
                _headers(str(form.get("headers", ""))),
                render.parse_time_us(when, form.get("tz")) if when else None)
        except (ValueError, Refused) as error:
            if request[BASIC]:
                raise (_refused(error) if isinstance(error, Refused) else
                       web.HTTPBadRequest(text=f"{error}\n")) from None
            return self.page(request, "produce.html", status=400, done="", error=str(error))
        where = {"stream": stream, "partition": at[0], "offset": at[1]}
        _LOG.info("console_produce", extra={"fields": {**where, "peer": request.remote}})
        if request[BASIC]:
            return web.json_response(where)
        raise web.HTTPSeeOther("/produce?" + _urlencode({
            "done": f"appended to {stream} partition {at[0]} at offset {at[1]}"}))

    async def retention(self, request: web.Request):
        deleted = await self.daemon.apply_retention()
        _LOG.info("console_retention", extra={"fields": {"segments": len(deleted),
                                                         "peer": request.remote}})
        if request[BASIC]:
            return web.json_response({"deleted_segments": deleted})
        raise web.HTTPSeeOther("/?" + _urlencode({"done": f"retention applied: "
                                                          f"{len(deleted)} segments deleted"}))


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


def _refused(refused: Refused) -> web.HTTPException:
    """The HTTP error to answer a call the daemon refused with."""
    return _STATUS.get(refused.status, web.HTTPInternalServerError)(
        text=f"{refused.text}\n")


_STATUS = {400: web.HTTPBadRequest, 409: web.HTTPConflict, 502: web.HTTPBadGateway,
           503: web.HTTPServiceUnavailable, 500: web.HTTPInternalServerError}


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
