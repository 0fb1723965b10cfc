"""bench/console.py runs end to end at a tiny size and writes the figures it promises.

One run of its main() on a log of 3 partitions: a few loads of every page kind, then the
five load phases (three baselines, browsing, flood) of 2 s each with 2 producers and
2 browsers pausing about 0.2 s between pages. What is checked is that every measurement
ran (no failure, no non-200 response), that the results file has the named figures and no
folder of this machine, and that every target got a verdict. Speed is not asserted:
bench/console.py measures it, on a quiet machine. The browsers' cache rules and the
reading of a page's files are checked on their own, without a daemon.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


@pytest.fixture
def console_bench(monkeypatch, tmp_path):
    """bench/console.py as a module (bench/ on sys.path, as when it runs as a script),
    its results written under tmp_path."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_console", BENCH / "console.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_console", module)
    spec.loader.exec_module(module)
    import _common
    monkeypatch.setattr(_common, "RESULTS_DIR", tmp_path / "results")
    return module


def test_a_page_s_files_are_its_stylesheets_and_scripts(console_bench):
    html = (b'<html><head><LINK REL="Stylesheet" HREF="/static/console.css?v=ab12">'
            b'<link rel="icon" href="/favicon.ico"><script>let x = "<link>";</script>'
            b"<script src='/static/console.js?v=cd34' defer></script></head><body>"
            b'<link rel="stylesheet" href="/static/console.css?v=ab12">'
            b'<script src="extra.js"></script></body></html>')
    assert console_bench.page_assets(html, "http://h:1/browse?stream=a") == [
        "http://h:1/static/console.css?v=ab12", "http://h:1/static/console.js?v=cd34",
        "http://h:1/extra.js"]
    plain = b'<link rel="stylesheet" href="/static/console.css"><script src="/static/console.js">'
    assert console_bench.page_assets(plain, "http://h:1/") == [
        "http://h:1/static/console.css", "http://h:1/static/console.js"]


def test_the_browsers_cache_keeps_only_what_a_max_age_allows(console_bench):
    fresh_for, cache = console_bench.fresh_for, console_bench.BrowserCache()
    assert fresh_for("public, max-age=86400") == 86400
    assert fresh_for('private, max-age="30"') == 30
    assert fresh_for("") is None and fresh_for("max-age=0") is None
    assert fresh_for("no-cache, max-age=60") is None
    cache.store("/v", 200, {"Cache-Control": "public, max-age=60", "ETag": '"e"'}, 100.0)
    assert cache.fresh("/v", 159.0) and not cache.fresh("/v", 161.0)
    cache.store("/p", 200, {"ETag": '"e"', "Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"},
                100.0)  # no Cache-Control: asked again, conditionally
    assert not cache.fresh("/p", 100.0)
    assert cache.conditions("/p") == {"If-None-Match": '"e"',
                                      "If-Modified-Since": "Mon, 01 Jan 2024 00:00:00 GMT"}
    cache.store("/p", 304, {}, 101.0)  # a 304 keeps the validators
    assert cache.conditions("/p")["If-None-Match"] == '"e"'
    cache.store("/n", 200, {"Cache-Control": "no-store", "ETag": '"e"'}, 100.0)
    assert not cache.fresh("/n", 100.0) and cache.conditions("/n") == {}


@pytest.mark.slow
def test_a_tiny_run_writes_every_figure(console_bench, tmp_path, capsys):
    console_bench.main(["--partitions", "3", "--records", "40", "--loads", "2",
                        "--phase-s", "2", "--warmup-s", "0.3", "--producers", "2",
                        "--browsers", "2",
                        "--think-s", "0.2", "--workdir", str(tmp_path / "work")])
    printed = capsys.readouterr().out
    text = (tmp_path / "results" / "console.json").read_text()
    figures = json.loads(text)

    for kind in console_bench.PAGE_KINDS:
        for which in ("p50", "p95", "max"):
            assert figures[f"page_{kind}_{which}_ms"] > 0, (kind, which)
    assert figures["page_p95_worst_kind"] in console_bench.PAGE_KINDS
    assert figures["page_p95_worst_ms"] == max(
        figures[f"page_{kind}_p95_ms"] for kind in console_bench.PAGE_KINDS)
    assert figures["page_loads_per_kind"] == 2
    # (the pages are the worker's work: the daemon may use no measurable CPU)
    assert figures["daemon_cores_pages"] >= 0 and figures["other_cores_pages"] >= 0

    for phase in console_bench.PHASES:
        assert figures[f"append_{phase}_rps"] > 0, phase
        assert figures[f"daemon_cores_{phase}"] >= 0
        assert figures[f"producers_cores_{phase}"] > 0
        assert figures[f"other_cores_{phase}"] >= 0
    assert figures["append_baseline_rps"] == pytest.approx(
        sum(figures[f"append_{name}_rps"] for name in console_bench.BASELINES) / 3, rel=1e-4)
    assert figures["append_baseline_drift"] > 0 and figures["append_baseline_spread"] >= 1
    for name in console_bench.LOADED:
        assert figures[f"append_{name}_vs_baseline"] == pytest.approx(
            figures[f"append_{name}_rps"] / figures["append_baseline_rps"], rel=1e-4), name
        assert figures[f"{name}_pages"] > 0 and figures[f"{name}_pages_per_s"] > 0, name
        # every browser's cache starts empty, so its first page's files are asked for
        assert figures[f"{name}_static_per_s"] > 0, name
        assert (figures[f"{name}_static_full"] + figures[f"{name}_static_revalidated"]
                == pytest.approx(figures[f"{name}_static_per_s"] * figures["phase_s"],
                                 rel=1e-3)), name
        assert figures[f"{name}_errors"] == 0, name
        assert figures[f"{name}_page_p95_ms"] > 0, name
        assert figures[f"loadgen_cores_{name}"] > 0, name
    assert 0.1 <= figures["browsing_think_s"] <= 0.3  # 0.2 s, -/+ 50%
    assert figures["flood_think_s"] == 0
    assert figures["phase_order"] == "baseline1, browsing, baseline2, flood, baseline3"

    assert {"command", "cpu_count", "machine", "date"} <= set(figures)
    assert str(ROOT) not in text and str(tmp_path) not in text
    verdicts = [line.split()[0] for line in printed.split("targets\n", 1)[1].splitlines()
                if line.startswith("  ")]
    assert len(verdicts) == len(console_bench.TARGETS)
    assert set(verdicts) <= {"PASS", "MISS"}  # each measured: none n/a
    assert "load generator used" in printed
