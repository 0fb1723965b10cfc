"""The console's sign-in: who may see a page, and how often a wrong password may be tried.

Strategy: sans-I/O. `Gate` holds the state (signed-in sessions, failed attempts per
client) and answers questions about it; the web layer (app.py) asks them and turns the
answers into cookies, 401s and 429s. Credentials are the Kafka listener's: user
"streamlog", the daemon's token as the password, compared in constant time. A browser
signs in through the login page and gets a session cookie (a random 256-bit id, HttpOnly,
SameSite=Strict, Secure under TLS); a script sends HTTP Basic with every request. Each
session has a CSRF token that every form posts back (a write needs it besides the
cookie: SameSite is the first guard, this the second).

Rate limit: a client (its IP address) that gives FAILURES_MAX wrong passwords within
FAILURE_WINDOW_S seconds is refused (429, Retry-After) until the oldest of them is that
old, right password or not, so a guesser gets FAILURES_MAX tries a window. Bounds:
SESSIONS_MAX sessions (the oldest goes first), CLIENTS_MAX clients remembered.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hmac
import secrets
import time

USER = "streamlog"
COOKIE = "streamlog_console"
SESSION_TTL_S = 12 * 3600
FAILURES_MAX = 5
FAILURE_WINDOW_S = 60.0
SESSIONS_MAX = 10_000
CLIENTS_MAX = 10_000


class Gate:
    """Sign-in state of one console. `clock`: monotonic seconds (tests pass their own)."""

    def __init__(self, token: bytes, *, clock=time.monotonic) -> None:
        self._token = token
        self._clock = clock
        # session id -> (expiry, csrf token); insertion order is age order
        self._sessions: collections.OrderedDict[str, tuple[float, str]] = (
            collections.OrderedDict())
        self._failures: collections.OrderedDict[str, collections.deque] = (
            collections.OrderedDict())

    # -- credentials ------------------------------------------------------------------

    def check(self, client: str, user: str, password: str) -> bool:
        """Whether user/password are right; a wrong pair counts against `client`.
        Call `retry_after(client)` first: a refused client must not be asked."""
        right = (hmac.compare_digest(user.encode(), USER.encode())
                 & hmac.compare_digest(password.encode("utf-8", "surrogateescape"),
                                       self._token))
        if not right:
            self._failed(client)
        return right

    def retry_after(self, client: str) -> int:
        """0 when `client` may try a password now, else the seconds until it may."""
        failures = self._failures.get(client)
        if failures is None:
            return 0
        now = self._clock()
        while failures and now - failures[0] >= FAILURE_WINDOW_S:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return 0
        if len(failures) < FAILURES_MAX:
            return 0
        return max(1, int(FAILURE_WINDOW_S - (now - failures[0]) + 0.999))

    def _failed(self, client: str) -> None:
        failures = self._failures.pop(client, None) or collections.deque(maxlen=FAILURES_MAX)
        failures.append(self._clock())
        self._failures[client] = failures
        while len(self._failures) > CLIENTS_MAX:
            self._failures.popitem(last=False)

    def basic(self, client: str, header: str) -> bool | None:
        """An Authorization header's verdict: None when it is not Basic (or is
        malformed), else whether its credentials are right."""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            return None
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode(
                "utf-8", "surrogateescape")
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(":")
        if not sep:
            return None
        return self.check(client, user, password)

    # -- sessions ---------------------------------------------------------------------

    def open_session(self) -> str:
        """A new session's id (the cookie's value)."""
        session = secrets.token_urlsafe(32)
        self._sessions[session] = (self._clock() + SESSION_TTL_S, secrets.token_urlsafe(24))
        while len(self._sessions) > SESSIONS_MAX:
            self._sessions.popitem(last=False)
        return session

    def session(self, session: str | None) -> str | None:
        """The CSRF token of a live session, else None (unknown or expired)."""
        if not session:
            return None
        found = self._sessions.get(session)
        if found is None:
            return None
        if found[0] <= self._clock():
            del self._sessions[session]
            return None
        return found[1]

    def close_session(self, session: str | None) -> None:
        if session:
            self._sessions.pop(session, None)

    def csrf_ok(self, session: str | None, posted: str) -> bool:
        expected = self.session(session)
        return expected is not None and hmac.compare_digest(expected.encode(),
                                                            posted.encode())
