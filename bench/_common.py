"""Shared helpers for the benchmarks in bench/: progress lines, timing, results, tables.

Each benchmark (bench/core.py, bench/spark.py, bench/cec.py, ...) measures a set of named
figures, writes them to bench/results/NAME.json as one flat JSON object (plus "command",
"cpu_count", "machine" and "date"), and prints a table at the end. The machine is shared
and noisy, so the tables put each figure beside ratios against baselines measured in the
same run. bench/report.py gathers every results file into one table and chart.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shlex
import shutil
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_WORKDIR = BENCH_DIR / "work"

MiB = 1 << 20
GiB = 1 << 30


# ---------------------------------------------------------------- progress

_T0 = time.perf_counter()


def progress(message: str) -> None:
    """One line on stderr, prefixed with the time since the benchmark started."""
    print(f"[{time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Announce a phase on stderr, then report how long it took."""
    progress(f"{name} ...")
    start = time.perf_counter()
    yield
    progress(f"{name} done ({time.perf_counter() - start:.2f} s)")


def attempt(name: str, fn: Callable[[], object], failures: list[str]) -> None:
    """Run one measurement; on an exception print its traceback and add name to failures,
    so that one broken measurement does not cost the figures of the others."""
    try:
        fn()
    except Exception:  # noqa: BLE001  (reported, and the run exits non-zero)
        traceback.print_exc()
        progress(f"FAILED: {name}")
        failures.append(name)


# ---------------------------------------------------------------- timing

class Stopwatch:
    """perf_counter seconds between construction (or restart) and `elapsed`."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def restart(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def timed(fn: Callable[..., object], *args: object, **kwargs: object) -> tuple[object, float]:
    """Run fn after a full garbage collection; return (its result, seconds taken)."""
    gc.collect()
    watch = Stopwatch()
    result = fn(*args, **kwargs)
    return result, watch.elapsed


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def add_ratios(figures: dict, ratios: dict[str, tuple[str, str]]) -> None:
    """figures[name] = figures[numerator] / figures[denominator] for each of `ratios`
    (name -> (numerator, denominator)) whose figures were measured."""
    for name, (numerator, denominator) in ratios.items():
        value = ratio(figures.get(numerator), figures.get(denominator))
        if value is not None:
            figures[name] = value


def median(values: list[float]) -> float:
    return statistics.median(values)


# ---------------------------------------------------------------- files

def dir_bytes(path: Path) -> int:
    """Total size of the regular files under path (what the data takes on disk, logically)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def fresh_dir(path: Path) -> Path:
    """Remove path if it exists and create it empty."""
    remove(path)
    path.mkdir(parents=True)
    return path


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


# ---------------------------------------------------------------- results

def export(rev: str, into: Path) -> str:
    """The streamlog package of commit `rev`, unpacked under `into` (`git archive`);
    returns the folder to put on PYTHONPATH to import it."""
    import subprocess
    archive = subprocess.run(["git", "-C", str(BENCH_DIR.parent), "archive", rev, "streamlog"],
                             check=True, stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return str(into)


def short_rev(rev: str) -> str:
    import subprocess
    return subprocess.run(["git", "-C", str(BENCH_DIR.parent), "rev-parse", "--short", rev],
                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()


def command_line() -> str:
    """The command line that started this process (interpreter included), with the
    repository's folder taken off the paths in it, so that results name no folder of
    the machine (`./dev bench` starts Python by its full path)."""
    typed = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    return typed.replace(str(Path(__file__).resolve().parents[1]) + os.sep, "")


def machine_description() -> str:
    """Where the figures were measured, without the host's name: CPU model, CPU count,
    kernel and Python, e.g. "Intel(R) Xeon(R) Processor; 2 CPUs; Linux 6.1 x86_64;
    Python 3.11.7"."""
    import platform
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                # x86 says "model name"; some ARM kernels say only "Model" or "Hardware".
                field, _, value = line.partition(":")
                if field.strip() in ("model name", "Model", "Hardware") and value.strip():
                    model = value.strip()
                    break
    kernel = f"{platform.system()} {platform.release()} {platform.machine()}"
    return (f"{model}; {os.cpu_count()} CPUs; {kernel}; "
            f"Python {platform.python_version()}")


def write_results(name: str, figures: dict[str, float | int | None]) -> Path:
    """Write bench/results/NAME.json: the figures plus "command", "cpu_count", "machine"
    (machine_description()) and "date" (UTC, ISO 8601, when the results were written)."""
    import datetime
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = {"command": command_line(), "cpu_count": os.cpu_count(),
           "machine": machine_description(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    out.update({key: _rounded(value) for key, value in figures.items()})
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path


def _rounded(value: float | int | None) -> float | int | None:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


# ---------------------------------------------------------------- tables

@dataclass(frozen=True)
class Row:
    """One line of the results table: a figure and, optionally, ratios against baselines."""

    label: str
    key: str  # the figure's name in the JSON
    unit: str
    ratios: dict[str, str] | None = None  # column title -> name of the figure to divide by


@dataclass(frozen=True)
class Target:
    """A goal printed beside the figures: PASS or MISS, never an assertion."""

    text: str
    check: Callable[[dict], bool | None]  # None when the figures needed are missing


def fmt_number(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    if abs(value) >= 0.01 or value == 0:
        return f"{value:.3f}"
    return f"{value:.6f}"


def print_table(figures: dict, rows: list[Row], columns: list[str]) -> None:
    """Print rows as `label  value unit  ratio-columns...` on stdout."""
    header = [("figure", 34), ("value", 14), ("unit", 7)] + [(c, 12) for c in columns]
    print("  ".join(title.ljust(width) if i != 1 else title.rjust(width)
                    for i, (title, width) in enumerate(header)))
    print("-" * (sum(width for _, width in header) + 2 * (len(header) - 1)))
    for row in rows:
        if row.key not in figures:
            continue
        value = figures[row.key]
        cells = [row.label.ljust(34), fmt_number(value).rjust(14), row.unit.ljust(7)]
        for column in columns:
            base_key = (row.ratios or {}).get(column)
            r = ratio(value, figures.get(base_key)) if base_key else None
            cells.append((f"{r:.2f}x" if r is not None else "").ljust(12))
        print("  ".join(cells).rstrip())


def print_targets(figures: dict, targets: list[Target]) -> None:
    print()
    print("targets")
    for target in targets:
        try:
            ok = target.check(figures)
        except (KeyError, TypeError):
            ok = None
        verdict = "n/a " if ok is None else ("PASS" if ok else "MISS")
        print(f"  {verdict}  {target.text}")


def finish(path: Path, failures: list[str]) -> None:
    """The end of every benchmark: where its results went, and exit 1 if a measurement
    failed (its traceback is on stderr)."""
    print(f"\nwrote {path}")
    if failures:
        print(f"FAILED: {', '.join(failures)} (tracebacks above, on stderr)")
        sys.exit(1)


def publish(name: str, figures: dict, failures: list[str], rows: list[Row],
            columns: list[str], targets: list[Target]) -> None:
    """Write bench/results/NAME.json, print the table and the targets, then finish()."""
    path = write_results(name, figures)
    print()
    print_table(figures, rows, columns)
    print_targets(figures, targets)
    finish(path, failures)
