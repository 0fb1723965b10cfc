"""The README's operator examples run as written (in a temporary directory) and print
what they promise."""

from __future__ import annotations

import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def _examples() -> list[str]:
    text = open(README, encoding="utf-8").read()
    section = text[text.index("## Operators"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_has_the_operator_examples():
    assert len(_examples()) >= 3


@pytest.mark.parametrize("index", range(3))
def test_a_readme_operator_example_runs_twice_as_a_restart_would(tmp_path, monkeypatch,
                                                                   capsys, index):
    monkeypatch.chdir(tmp_path)
    code = _examples()[index]
    exec(compile(code, f"README operator example {index}", "exec"), {"__name__": "readme"})
    first = capsys.readouterr().out
    exec(compile(code, f"README operator example {index}", "exec"), {"__name__": "readme"})
    second = capsys.readouterr().out
    if index == 0:
        # Ten users with 100 clicks each: the last three results are 100 each.
        assert first.splitlines()[-1] == "[b'100', b'100', b'100']"
        # The second run appended 1,000 more clicks and went on from the first run's
        # state (its position notes and checkpoint), not from zero.
        assert second.splitlines()[-1] == "[b'200', b'200', b'200']"
        assert "recovery[" in second
    elif index == 2:
        lines = first.splitlines()
        # 30 s of views on three pages: windows ending at 5, 10, 15, 20 and 25 s have
        # closed (the high-water mark is 29.99 s), and every page saw all 13 users.
        assert len(lines) == 15 and all(line.endswith(" 13") for line in lines)
        assert lines[0] == "b'/docs' -5000000 5000000 13"  # closed in (end, key) order
        assert second.splitlines() == lines  # the second run's views are all late
    else:
        lines = first.splitlines()
        # Five seconds of trades, two keys: four closed windows each (the fifth is open).
        assert len(lines) == 8 and lines[0].startswith("b'AAPL' 0 500 ")
        # The second run's trades are late (their seconds are closed): nothing changes,
        # and nothing is computed twice.
        assert second.splitlines() == lines
