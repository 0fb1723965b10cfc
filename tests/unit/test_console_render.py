"""How the console shows values and reads times (console/render.py)."""

import datetime

import pytest

from streamlog.console import render


def test_json_objects_and_arrays_are_pretty_printed():
    shown = render.show(b'{"user":"u1","n":[1,2]}')
    assert shown.form == "json"
    assert shown.text == '{\n  "user": "u1",\n  "n": [\n    1,\n    2\n  ]\n}'


def test_text_that_is_not_a_json_document_stays_text():
    assert render.show(b"/home").form == "text"
    assert render.show(b"42").form == "text"  # a JSON number reads better as it is
    assert render.show(b"{not json").text == "{not json"
    assert render.show("héllo\n\tworld".encode()) == render.Shown("text", "héllo\n\tworld")


def test_binary_is_hex_and_null_and_empty_are_named():
    assert render.show(b"\x00\x01\xff") == render.Shown("hex", "00 01 ff")
    assert render.show(b"ab\x07c").form == "hex"  # a control character
    assert render.show(b"\xff\xfe").form == "hex"  # not UTF-8
    assert render.show(None).form == "null"
    assert render.show(b"").form == "empty"


def test_long_values_are_cut_and_say_so():
    shown = render.show(b"x" * 5000, limit=100)
    assert shown.cut and shown.text == "x" * 100
    shown = render.show(bytes(range(256)) * 4, limit=100)
    assert shown.form == "hex" and shown.cut and len(shown.text.split()) == 50


def test_keys_are_one_line_text_or_hex():
    assert render.key_text(b"user-1") == "user-1"
    assert render.key_text(b"\x00\x01") == "0x0001"
    assert render.key_text(None) == ""


def test_times_in_utc_to_the_microsecond():
    assert render.utc_text(0) == "1970-01-01T00:00:00.000000Z"
    assert render.utc_text(1_767_225_600_123_456) == "2026-01-01T00:00:00.123456Z"
    assert render.utc_text(None) == ""


@pytest.mark.parametrize("text, tz, expected", [
    ("2026-01-01T00:00", None, 1_767_225_600_000_000),
    ("2026-01-01T00:00:00.5", "", 1_767_225_600_500_000),
    # the browser is at UTC+1: getTimezoneOffset() is -60, local midnight is 23:00 UTC
    ("2026-01-01T00:00", "-60", 1_767_225_600_000_000 - 3600 * 1_000_000),
    ("2026-01-01T00:00", -60, 1_767_225_600_000_000 - 3600 * 1_000_000),
    ("2026-01-01T00:00:00Z", "-60", 1_767_225_600_000_000),  # its own zone wins
    ("2026-01-01T01:00:00+01:00", None, 1_767_225_600_000_000),
    ("1767225600000000", None, 1_767_225_600_000_000),
    ("-5", None, -5),
])
def test_a_date_time_pickers_value_is_read_in_the_browsers_zone(text, tz, expected):
    assert render.parse_time_us(text, tz) == expected


def test_the_parsed_time_agrees_with_the_shown_one():
    us = render.parse_time_us("2026-11-27T10:15:30.250001")
    assert render.utc_text(us) == "2026-11-27T10:15:30.250001Z"
    assert datetime.datetime.fromisoformat(render.utc_text(us)[:-1]).microsecond == 250001


@pytest.mark.parametrize("text, tz, message", [
    ("", None, "no time given"),
    ("yesterday", None, "is neither integer microseconds nor ISO-8601"),
    ("2026-13-01T00:00", "0", "is neither integer microseconds nor ISO-8601"),
    ("2026-01-01T00:00", "east", "is not a zone offset in minutes"),
    ("2026-01-01T00:00", "5000", "is not a zone offset"),
])
def test_bad_times_say_what_is_wrong(text, tz, message):
    with pytest.raises(ValueError, match=message):
        render.parse_time_us(text, tz)


def test_sizes_and_the_sparkline():
    assert render.size_text(512) == "512 B"
    assert render.size_text(3 * 1024 * 1024) == "3.0 MiB"
    assert render.size_text(None) == ""
    assert render.sparkline([]) == ""
    assert render.sparkline([(0, 0), (1, 10), (2, 5)], width=100, height=10) == (
        "0.0,10.0 50.0,0.0 100.0,5.0")
