"""A headless Chromium driven by Playwright's sync API, for the console's end-to-end tests.

Strategy: never download a browser. Playwright's own builds come from its CDN, which a
closed machine cannot reach and a reviewer cannot vouch for; Debian's `chromium` package
is used instead, launched through `executable_path`. When it is missing and we are root
with apt-get, it is installed the way the `kcat` fixture installs kcat; otherwise the
test is skipped, saying why. Chromium starts with the flags that keep it quiet on a
machine with no network (no background fetches, component updates, sync or QUIC: left
on, it retries refused connections for as long as it runs) and without its sandbox
(which needs user namespaces that containers often lack).

Contexts are made in UTC with a fixed viewport unless a test asks otherwise: a page's
local times, and a screenshot's pixels, then do not depend on the machine that runs them.

Thread-safety: Playwright's sync API belongs to the thread that started it; so does
everything made here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

CHROMIUM = "/usr/bin/chromium"
PACKAGE = "chromium"  # Debian's
ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync")
VIEWPORT = {"width": 1400, "height": 900}
TIMEZONE = "UTC"


def _skip(reason: str):
    import pytest  # only tests come here: the library itself never needs pytest
    pytest.skip(reason)


def find_chromium() -> str:
    """The chromium executable: Debian's, installed with apt-get when missing and we
    may (root, apt-get present); else the test is skipped with the reason."""
    found = shutil.which("chromium") or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        _skip("chromium is not installed and apt-get cannot run here")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                           PACKAGE], env=env, capture_output=True, text=True)
    found = shutil.which("chromium")
    if not found:
        _skip(f"apt-get install {PACKAGE} failed: {done.stderr.strip()[-300:]}")
    return found


def launch(playwright, **options):
    """A headless Chromium (Playwright's Browser) started from `find_chromium()` with
    ARGS; `options` go to `chromium.launch` as they are."""
    return playwright.chromium.launch(executable_path=find_chromium(), headless=True,
                                      args=list(ARGS), **options)


@contextlib.contextmanager
def chromium(**options):
    """Playwright started and a Chromium launched (`launch`), both stopped on exit:
    `with chromium() as browser: ...`. Skips when Playwright is not installed."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip("playwright is not installed")
    find_chromium()  # before Playwright starts: a skip leaves nothing behind
    with sync_playwright() as playwright:
        browser = launch(playwright, **options)
        try:
            yield browser
        finally:
            browser.close()


def new_context(browser, *, timezone_id: str = TIMEZONE, viewport: dict | None = None,
                **options):
    """A fresh context (its own cookies) in `timezone_id` with a fixed viewport."""
    return browser.new_context(timezone_id=timezone_id, viewport=viewport or dict(VIEWPORT),
                               **options)
