"""Debian's Chromium for the UI's browser tests and the screenshot script: where it is, how it is
launched, and the marks of a module that needs it."""

import contextlib
import os
from http.server import BaseHTTPRequestHandler

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# A browser test's module: integration (a real fleetd serve and a real browser), skipped where
# Chromium is not installed.
BROWSER_MARKS = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=(
            f"{CHROMIUM} is absent: install Debian's chromium (scripts/setup.sh) for browser tests"
        ),
    ),
]


def launch(playwright):
    """Chromium through Playwright, headless."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def artifacts_dir(test_name, tmp_path):
    """Where a test's screenshots go: $FLEETD_TEST_ARTIFACTS/ui/<test name>, else the test's tmp
    dir."""
    root = os.environ.get("FLEETD_TEST_ARTIFACTS")
    path = os.path.join(root, "ui", test_name) if root else str(tmp_path / "screenshots")
    os.makedirs(path, exist_ok=True)
    return path


@contextlib.contextmanager
def checked_page(browser, base_url, artifacts, **context_options):
    """A fresh browser context (no cookies) and page; on leaving, fails on any console error other
    than the "Failed to load resource" of the 4xx answers tests provoke (CSP, script errors)."""
    context = browser.new_context(base_url=base_url, locale="en-US", **context_options)
    tab = context.new_page()
    errors = []
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.artifacts = artifacts
    yield tab
    context.close()
    assert [e for e in errors if "Failed to load resource" not in e] == []


def shot(page, name):
    """A full-page screenshot into the test's artifacts."""
    page.screenshot(path=os.path.join(page.artifacts, f"{name}.png"), full_page=True)


class HelloPage(BaseHTTPRequestHandler):
    """What a deployed instance serves in the browser tests and screenshots: one small HTML page."""

    def do_GET(self):  # noqa: N802 - the stdlib's name
        body = b"<!doctype html><title>notebook</title><h1>hello from the instance</h1>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass
