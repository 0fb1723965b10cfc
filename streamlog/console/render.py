"""How the console shows bytes and times: pure functions, no I/O.

A value is shown as pretty JSON when it parses as a JSON object or array, as text when it
is UTF-8 without control characters (but tab and newline), and as hex otherwise; a value
of None is a tombstone. Long values are cut at VALUE_CHARS_MAX characters (the record
page shows them whole up to RECORD_BYTES_MAX). Times are microseconds since the epoch,
shown in UTC and in the browser's zone (the page's script fills the latter from the
`data-us` attribute), and read as the command line reads them (cli/common.py), but for
a date-time picker's value, read in the zone the browser says it is in.
"""

from __future__ import annotations

import dataclasses
import datetime
import json

from ..cli.common import format_timestamp, parse_timestamp

VALUE_CHARS_MAX = 2_000
RECORD_BYTES_MAX = 1 << 20
_CONTROL = {chr(c) for c in range(32)} - {"\t", "\n", "\r"}


@dataclasses.dataclass(frozen=True)
class Shown:
    """A value as the page shows it: `form` is "json", "text", "hex", "null" or
    "empty"; `text` what to print; `cut` whether it was shortened."""

    form: str
    text: str
    cut: bool = False


def show(value: bytes | None, limit: int = VALUE_CHARS_MAX) -> Shown:
    if value is None:
        return Shown("null", "(null: a tombstone)")
    if not value:
        return Shown("empty", "(empty)")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not (_CONTROL & set(text)):
        stripped = text.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if isinstance(parsed, (dict, list)):
                return _cut("json", json.dumps(parsed, indent=2, ensure_ascii=False), limit)
        return _cut("text", text, limit)
    shown = value[: limit // 2]
    return Shown("hex", shown.hex(" "), cut=len(shown) < len(value))


def _cut(form: str, text: str, limit: int) -> Shown:
    if len(text) <= limit:
        return Shown(form, text)
    return Shown(form, text[:limit], cut=True)


def key_text(key: bytes | None) -> str:
    """A key in one line: text when it decodes, else hex; "" for no key."""
    if key is None:
        return ""
    shown = show(key, 200)
    return shown.text if shown.form in ("text", "json") else f"0x{key.hex()}"


def utc_text(timestamp_us: int | None) -> str:
    """The command line's form (ISO 8601 in UTC, microseconds, Z); "" for None."""
    return format_timestamp(timestamp_us) or ""


def parse_time_us(text: str, tz_offset_min: str | int | None = None) -> int:
    """Microseconds since the epoch, read as the command line reads --from-time (an
    integer of microseconds, or ISO 8601: UTC when it names no zone), except that a
    date-time picker's value ("2026-11-27T10:15", no zone) is in the zone
    `tz_offset_min` says: JavaScript's getTimezoneOffset(), the minutes to add to the
    browser's local time to get UTC. ValueError with a sentence for anything else."""
    text = text.strip()
    if not text:
        raise ValueError("no time given")
    if tz_offset_min not in (None, "") and not text.lstrip("+-").isdigit():
        try:
            offset = int(tz_offset_min)
        except ValueError:
            raise ValueError(f"{tz_offset_min!r} is not a zone offset in minutes") from None
        if not -18 * 60 < offset < 18 * 60:
            raise ValueError(f"{offset} minutes is not a zone offset")
        try:
            naive = datetime.datetime.fromisoformat(text).tzinfo is None
        except ValueError:
            naive = False  # parse_timestamp says what is wrong with it
        if naive:
            sign, minutes = ("-", offset) if offset > 0 else ("+", -offset)
            text += f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"
    return parse_timestamp(text)


def size_text(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def sparkline(points: list[tuple[float, float]], width: int = 320,
              height: int = 60) -> str:
    """An SVG polyline's points attribute for (t, value) samples, scaled to the box."""
    if not points:
        return ""
    t0, t1 = points[0][0], points[-1][0]
    top = max(value for _, value in points) or 1
    span = (t1 - t0) or 1
    return " ".join(f"{(t - t0) / span * width:.1f},{height - value / top * height:.1f}"
                    for t, value in points)
