"""The server's tests need the server stack -- the ``serve`` extra, with ``openai`` from the ``test`` extra,
both installed by ``python3 dev.py`` -- and run on the CPU on any machine. Where the stack is missing
(the GPU box's ``pytest -m gpu`` run) this folder is not collected, and the report's header says so:
the tests never pass by being skipped."""

from __future__ import annotations

import importlib.util

from paged_edu.cli import SERVE_PACKAGES

NEEDED = (*SERVE_PACKAGES, "openai")
MISSING = [name for name in NEEDED if importlib.util.find_spec(name) is None]
collect_ignore_glob = ["test_*.py"] if MISSING else []


def pytest_report_header(config):
    if MISSING:
        return f"tests/serve not collected: the server stack is missing here ({', '.join(MISSING)})"
    return None
