"""The console's sign-in state (console/auth.py): credentials, sessions, CSRF tokens and
the wrong-password rate limit, on a clock the test moves."""

import base64

import pytest

from streamlog.console import auth


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gate():
    clock = Clock()
    gate = auth.Gate(b"s3cret", clock=clock)
    gate.clock = clock
    return gate


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_the_user_is_streamlog_and_the_password_the_token(gate):
    assert gate.check("a", "streamlog", "s3cret")
    assert not gate.check("a", "streamlog", "S3cret")
    assert not gate.check("a", "admin", "s3cret")
    assert not gate.check("a", "streamlog", "")


def test_http_basic_is_read_and_anything_else_is_not_credentials(gate):
    assert gate.basic("a", basic("streamlog", "s3cret")) is True
    assert gate.basic("a", basic("streamlog", "nope")) is False
    assert gate.basic("a", basic("streamlog", "pa:ss:word")) is False  # colons in it
    assert gate.basic("a", "Bearer s3cret") is None
    assert gate.basic("a", "Basic !!!not-base64") is None
    assert gate.basic("a", "Basic " + base64.b64encode(b"no-colon").decode()) is None
    assert gate.basic("a", "Basic") is None


def test_five_wrong_passwords_in_a_minute_refuse_the_client_for_the_rest_of_it(gate):
    for _ in range(auth.FAILURES_MAX - 1):
        assert gate.retry_after("10.0.0.1") == 0
        assert not gate.check("10.0.0.1", "streamlog", "guess")
    assert gate.retry_after("10.0.0.1") == 0  # four wrong: still allowed
    gate.clock.now += 10
    assert not gate.check("10.0.0.1", "streamlog", "guess")
    wait = gate.retry_after("10.0.0.1")
    assert wait == auth.FAILURE_WINDOW_S - 10  # until the oldest failure is a window old
    assert gate.retry_after("10.0.0.2") == 0  # another client is not refused
    gate.clock.now += wait - 0.5
    assert gate.retry_after("10.0.0.1") > 0
    gate.clock.now += 1  # the oldest failure has left the window
    assert gate.retry_after("10.0.0.1") == 0
    assert gate.check("10.0.0.1", "streamlog", "s3cret")


def test_sessions_carry_a_csrf_token_and_expire(gate):
    session = gate.open_session()
    other = gate.open_session()
    assert session != other and len(session) >= 40
    csrf = gate.session(session)
    assert csrf and csrf != gate.session(other)
    assert gate.csrf_ok(session, csrf)
    assert not gate.csrf_ok(session, gate.session(other))
    assert not gate.csrf_ok(session, "")
    assert not gate.csrf_ok("forged", csrf)
    assert gate.session("forged") is None and gate.session(None) is None
    gate.clock.now += auth.SESSION_TTL_S
    assert gate.session(session) is None


def test_a_closed_session_is_gone(gate):
    session = gate.open_session()
    gate.close_session(session)
    assert gate.session(session) is None
    gate.close_session(None)  # signing out without a session is not an error


def test_sessions_are_bounded_the_oldest_going_first(gate, monkeypatch):
    monkeypatch.setattr(auth, "SESSIONS_MAX", 3)
    sessions = [gate.open_session() for _ in range(4)]
    assert gate.session(sessions[0]) is None
    assert all(gate.session(s) for s in sessions[1:])
