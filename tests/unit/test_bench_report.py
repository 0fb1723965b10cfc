"""bench/report.py: the Markdown rows and the chart, from synthetic results files.

Two made-up results files go into a temporary folder: core.json (written by the current
_common.write_results, so with "machine" and "date", and with some figures left out) and
spark.json (an older file: neither "machine" nor "date"). No benchmark runs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

CORE = {
    "command": ".venv/bin/python bench/core.py --synthetic",
    "cpu_count": 2,
    "machine": "Test CPU; 2 CPUs; Linux 6.1 x86_64; Python 3.11.7",
    "date": "2026-01-02T03:04:05+00:00",
    "append_batched_rps": 600000.0,
    "baseline_append_rps": 1000000.0,
    "append_vs_baseline": 0.6,
    "sqlite_append_rps": 800000.0,
    "append_vs_sqlite": 0.75,
    # no lmdb_* figures and no replay_records_rps: "not measured"
    "timestamp_seek_ms": 4.0,
    "timestamp_seek_ms_small": 2.0,
}
SPARK = {
    "command": ".venv/bin/python bench/spark.py",
    "cpu_count": 4,
    "streamlog_read_rps": 800000.0,
    "parquet_read_rps": 1000000.0,
}


@pytest.fixture(scope="module")
def report():
    """bench/report.py as a module (bench/ on sys.path, as when it runs as a script)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        spec = importlib.util.spec_from_file_location("bench_report", BENCH / "report.py")
        module = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, "bench_report", module)  # dataclasses look it up
        spec.loader.exec_module(module)
        yield module


@pytest.fixture(scope="module")
def rendered(report, tmp_path_factory):
    """(REPORT.md's text, throughput.png's path), rendered once: a chart takes seconds."""
    folder = tmp_path_factory.mktemp("results")
    (folder / "core.json").write_text(json.dumps(CORE))
    (folder / "spark.json").write_text(json.dumps(SPARK))
    markdown_path, chart_path = report.render(folder, "bench/report.py --test")
    return markdown_path.read_text(), chart_path


def row(markdown: str, figure: str, baseline_start: str) -> list[str]:
    """The cells of the one row whose figure and baseline cells start so."""
    found = []
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) == 8 and cells[0] == figure and cells[2].startswith(baseline_start):
            found.append(cells)
    assert len(found) == 1, (figure, baseline_start, found)
    return found[0]


def test_a_measured_pair_shows_ours_baseline_ratio_and_pass(rendered):
    markdown, _ = rendered
    assert row(markdown, "core: durable append, batches of 1,000", "plain file") == [
        "core: durable append, batches of 1,000", "600,000 rec/s",
        "plain file, fsync per MiB: 1,000,000 rec/s", "0.60x",
        "PASS: batched append >= 50% of the plain file baseline",
        CORE["machine"], f"`{CORE['command']}`", CORE["date"]]


def test_a_missed_target_says_miss(rendered):
    markdown, _ = rendered
    cells = row(markdown, "core: durable append, batches of 1,000", "SQLite")
    assert cells[3] == "0.75x"
    assert cells[4] == "MISS: batched append ahead of SQLite"


def test_times_are_compared_the_other_way_round(rendered):
    markdown, _ = rendered
    cells = row(markdown, "core: timestamp seek, median", "the same seek")
    assert cells[1] == "4.000 ms"
    assert cells[3] == "0.50x"  # twice as slow as the baseline: half as good
    assert cells[4] == ("PASS: timestamp seek < 5 ms<br>PASS: timestamp seek flat: "
                        "at N within 2x (or +1 ms) of at N/10")


def test_missing_figures_are_not_measured_and_their_targets_na(rendered):
    markdown, _ = rendered
    lmdb = row(markdown, "core: durable append, batches of 1,000", "LMDB")
    assert lmdb[2] == "LMDB, sync=True: not measured"
    assert lmdb[3] == "-"
    assert lmdb[4] == "n/a: batched append ahead of LMDB"
    replay = row(markdown, "core: replay, Arrow", "plain file")
    assert replay[1] == "not measured"
    assert replay[4] == "n/a: Arrow replay >= 3,000,000 rec/s"


def test_a_missing_results_file_is_not_measured(rendered):
    markdown, _ = rendered
    cells = row(markdown, "daemon: daemon append, fsync before ack", "Redis")
    assert cells[1] == "not measured"
    assert cells[4] == "n/a: daemon append >= 10x redis (appendfsync always)"
    assert cells[5:] == ["no bench/results/daemon.json"] * 3
    assert "192,000" not in markdown  # nothing made up (no such figure anywhere)


def test_an_older_file_gets_cpu_count_and_its_mtime_labelled(rendered):
    markdown, _ = rendered
    cells = row(markdown, 'spark: spark.read.format("streamlog")', "spark.read.parquet")
    assert cells[1:5] == ["800,000 rows/s", "spark.read.parquet, same rows: 1,000,000 rows/s",
                          "0.80x", "MISS: read >= 1.0x Parquet's rows/s"]
    assert cells[5] == "4 CPUs; machine not recorded"
    assert cells[7].endswith("UTC (file mtime)")


def test_a_results_file_without_pairs_is_named(report, tmp_path):
    (tmp_path / "mystery.json").write_text(json.dumps({"command": "x", "cpu_count": 1}))
    (tmp_path / "spark.json").write_text(json.dumps(SPARK))
    assert report.unpaired(report.load_results(tmp_path)) == ["mystery"]
    markdown = report.markdown_report([], ["mystery"], "bench/report.py")
    assert "`mystery.json`" in markdown


def test_a_row_not_measured_passes_no_target(report):
    """cec's (d) target holds vacuously when no extent was measured: not a PASS here."""
    pair = next(pair for pair in report.PAIRS if pair.ours == "extent1m_scanned")
    results = report.Results({"crash_trials": 8}, "m", "c", "d")
    line = report.evaluate(pair, results)
    assert line.ours is None
    assert [state for state, _ in line.verdicts] == ["n/a"]


def test_the_chart_is_a_png(rendered):
    _, chart_path = rendered
    data = chart_path.read_bytes()
    assert len(data) > 1000
    assert data.startswith(PNG_SIGNATURE)


def test_every_benchmark_target_has_a_row(report):
    """A target added to (or reworded in) a benchmark's TARGETS must be given a row."""
    referenced: dict[str, set[str]] = {}
    for pair in report.PAIRS:
        for target in pair.targets:
            if isinstance(target, str):
                referenced.setdefault(pair.bench, set()).add(target)
    assert set(referenced) == {"core", "daemon", "spark", "kafka", "cec", "checkpoint_overhead",
                               "footprint", "console"}
    for bench, texts in referenced.items():
        module = report.bench_module(bench)
        assert texts == {target.text for target in module.TARGETS}, bench


def test_write_results_records_the_machine_and_the_date(report, tmp_path, monkeypatch):
    import _common  # bench/ is on sys.path while `report` is loaded
    monkeypatch.setattr(_common, "RESULTS_DIR", tmp_path)
    path = _common.write_results("core", {"append_batched_rps": 1.5})
    written = json.loads(path.read_text())
    assert {"command", "cpu_count", "machine", "date"} <= set(written)
    assert written["append_batched_rps"] == 1.5
    assert "CPUs" in written["machine"]
    loaded = report.load_results(tmp_path)["core"]
    assert loaded.machine == written["machine"]
    assert loaded.date == written["date"]  # from the file, not its mtime


def test_the_readme_table_replaces_only_what_is_between_its_markers(report, rendered,
                                                                    tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "spark.json").write_text(json.dumps(SPARK))
    results = report.load_results(folder)
    lines = [report.evaluate(pair, results.get(pair.bench)) for pair in report.PAIRS]
    table = report.readme_table(lines, results)
    readme = tmp_path / "README.md"
    readme.write_text(f"# intro\n\n{report.README_BEGIN}\nold table\n{report.README_END}\n"
                      "## after\n")
    assert report.update_readme(readme, table)
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# intro\n")
    assert text.endswith(f"{report.README_END}\n## after\n")
    assert "| spark: spark.read.format(\"streamlog\") | 800,000 rows/s |" in text
    assert "MISS: read >= 1.0x Parquet's rows/s" in text
    assert "`spark`: `" in text  # each run's command, under the table
    plain = tmp_path / "OTHER.md"
    plain.write_text("no markers here\n")
    assert not report.update_readme(plain, table)
    assert plain.read_text() == "no markers here\n"
