"""What the browser tests share: Debian's Chromium driven by Playwright for Python, pages whose every
wait is bounded by the hang guard, and free ports on 127.0.0.1. Chromium is ``/usr/bin/chromium``
(never ``playwright install``, which downloads a browser of its own and fails without internet)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

CHROMIUM = "/usr/bin/chromium"
HAS_CHROMIUM = Path(CHROMIUM).exists()
SKIP_REASON = f"{CHROMIUM} is absent (the README's test command installs Debian's chromium)"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_chromium(playwright):
    """A headless Chromium from ``sync_playwright()``; the caller closes it."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=HANG_GUARD_S * 1000
    )


def new_page(browser, **kwargs):
    """A page whose waits -- navigation, actions, ``wait_for_*`` -- each end when their condition holds,
    bounded only by the hang guard (Playwright's own default is a 30 s guess at speed)."""
    page = browser.new_page(**kwargs)
    page.set_default_timeout(HANG_GUARD_S * 1000)
    page.set_default_navigation_timeout(HANG_GUARD_S * 1000)
    return page


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module (import this fixture into the module)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()
