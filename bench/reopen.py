"""Reopen benchmark: how long an open takes at 1 GiB and 10 GiB, after a kill and clean.

    .venv/bin/python bench/reopen.py                          # 1 and 10 GiB, this code
    .venv/bin/python bench/reopen.py --sizes 1 --compare HEAD~3   # and an older commit

DESIGN 4 bounds an open by the unflushed tail, not by the log's size, and the integrity
checks of an open (the recovery point confirmed against the frame before it, the index
seal hashed, transaction states checked) must not change that. For each size a child
process builds a log (fsync=never, 64 KiB batches of 1 KiB values) until it passes the
size and is SIGKILLed mid-append; then, each in a fresh process:

  after_kill_s_<N>gib     the first writable open (recovery of the killed writer's tail)
  clean_s_<N>gib          a writable open of the cleanly closed log (median of 5)
  readonly_s_<N>gib       a read-only open of it (median of 5)
  index_bytes_<N>gib      size of the partition's LMDB index (what the seal check hashes)

With --compare REV, the same is measured in the same run for the code of commit REV
(`git archive` into a temporary folder, imported through PYTHONPATH), each version on
a log it wrote itself, and the ratios new/old are printed and written. Results go to
bench/results/reopen.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (GiB, dir_bytes, export, phase, progress, remove, short_rev,  # noqa: E402
                     write_results)
import core  # noqa: E402  (its writer child builds the logs)

REPEATS = 5
ROOT = Path(__file__).resolve().parent.parent


def open_child(path: Path, mode: str, code: str | None) -> dict:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_open", str(path),
                          mode], check=True, stdout=subprocess.PIPE, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def opener(path: Path, mode: str) -> None:
    """Child: time one open (after importing streamlog), report it and the end offset."""
    import streamlog
    started = time.perf_counter()
    log = streamlog.open_log(str(path), readonly=(mode == "readonly"), create=False)
    seconds = time.perf_counter() - started
    end = log.end_offset(core.STREAM, 0)
    log.close()
    print(json.dumps({"open_s": seconds, "end_offset": end, "file": streamlog.__file__}))


def build(path: Path, size_bytes: int, code: str | None) -> int:
    """A log of at least size_bytes by core's writer child, SIGKILLed; returns acked."""
    remove(path)
    if code:
        os.environ["PYTHONPATH"] = code
    try:
        return core.build_and_kill(path, size_bytes)
    finally:
        os.environ.pop("PYTHONPATH", None)


def measure(work: Path, gib: float, code: str | None, prefix: str, figures: dict) -> None:
    name = f"{gib:g}gib"
    path = work / f"{prefix or 'current'}-{name}"
    with phase(f"{prefix or 'current'}: build a {gib:g} GiB log and kill its writer"):
        acked = build(path, int(gib * GiB), code)
    figures[f"{prefix}log_bytes_{name}"] = dir_bytes(path)
    first = open_child(path, "writable", code)
    progress(f"  opened by {first['file']}")
    if first["end_offset"] < acked:
        raise RuntimeError(f"recovered {first['end_offset']} records of {acked} acknowledged")
    figures[f"{prefix}after_kill_s_{name}"] = first["open_s"]
    for mode in ("writable", "readonly"):
        runs = [open_child(path, mode, code)["open_s"] for _ in range(REPEATS)]
        figures[f"{prefix}{'clean' if mode == 'writable' else mode}_s_{name}"] = \
            statistics.median(runs)
    figures[f"{prefix}index_bytes_{name}"] = dir_bytes(
        path / "streams" / core.STREAM / "0" / "index")
    progress(f"  {name}: after kill {figures[f'{prefix}after_kill_s_{name}']:.4f} s, clean "
             f"{figures[f'{prefix}clean_s_{name}']:.4f} s, read-only "
             f"{figures[f'{prefix}readonly_s_{name}']:.4f} s")
    remove(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10", help="GiB, comma-separated (default 1,10)")
    parser.add_argument("--compare", metavar="REV", help="also measure commit REV's code")
    parser.add_argument("--workdir", type=Path, default=Path(__file__).resolve().parent / "work")
    parser.add_argument("--_open", nargs=2, dest="open_", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.open_:
        opener(Path(args.open_[0]), args.open_[1])
        return
    sizes = [float(s) for s in args.sizes.split(",")]
    work = args.workdir.resolve() / "reopen"
    work.mkdir(parents=True, exist_ok=True)
    figures: dict = {"repeats": REPEATS}
    with tempfile.TemporaryDirectory() as old_code:
        versions = [("", None)]
        if args.compare:
            versions.append(("before_", export(args.compare, Path(old_code))))
            figures["before_commit"] = short_rev(args.compare)
        for gib in sizes:
            for prefix, code in versions:
                measure(work, gib, code, prefix, figures)
    for gib in sizes:
        name = f"{gib:g}gib"
        for what in ("after_kill_s", "clean_s", "readonly_s"):
            old = figures.get(f"before_{what}_{name}")
            if old:
                figures[f"{what}_{name}_vs_before"] = figures[f"{what}_{name}"] / old
    path = write_results("reopen", figures)
    print(json.dumps(figures, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
