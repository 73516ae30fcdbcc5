"""What the browser tests share: Debian's Chromium driven by Playwright for Python, and free ports
on 127.0.0.1. Chromium is ``/usr/bin/chromium`` (never ``playwright install``, which downloads a
browser of its own and fails without internet)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
HAS_CHROMIUM = Path(CHROMIUM).exists()
SKIP_REASON = f"{CHROMIUM} is absent (the README's test command installs Debian's chromium)"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_chromium(playwright):
    """A headless Chromium from ``sync_playwright()``; the caller closes it."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module (import this fixture into the module)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()
