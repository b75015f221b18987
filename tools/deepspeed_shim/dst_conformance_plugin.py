"""pytest plugin of tools/deepspeed-conformance.py (not part of the ``deepspeed`` shim).

Loaded with ``-p dst_conformance_plugin``; appends one JSON object per line to the file named by
DST_CONFORMANCE_EVENTS, flushed at once, so that the runner sees progress while pytest runs and can tell
which case was running when a pytest process hung or died:

    {"event": "collected", "ids": [...]}                    after collection (also with --collect-only)
    {"event": "start", "id": ID}                            a case begins (setup)
    {"event": "end", "id": ID, "outcome": O, "duration": S, "message": M}
        O is "passed", "failed" (the test failed), "error" (setup or teardown failed) or "skipped";
        S is the seconds of setup + call + teardown; M is the skip reason or the failure's last line.
"""

from __future__ import annotations

import json
import os
import re

_PATH = os.environ.get("DST_CONFORMANCE_EVENTS")
_cases: dict = {}


def _emit(record: dict) -> None:
    if not _PATH:
        return
    with open(_PATH, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _message(report) -> str:
    """One line: the skip reason, or the exception line of a failure with the lines after it."""
    if report.skipped and isinstance(report.longrepr, tuple):  # (path, line, "Skipped: reason")
        return str(report.longrepr[2])
    text = _ANSI.sub("", getattr(report, "longreprtext", "") or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # pytest marks the exception's lines with "E"; numpy's assert_allclose puts what failed (the index,
    # how many elements, the largest difference) on the lines after "AssertionError:".
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    errors = [e for e in errors if e]
    if not errors:
        return (lines[-1] if lines else "")[:300]
    return " | ".join(errors[:5])[:300]


def pytest_collection_finish(session) -> None:
    _emit({"event": "collected", "ids": [item.nodeid for item in session.items]})


def pytest_runtest_logstart(nodeid, location) -> None:
    _cases[nodeid] = {"outcome": "passed", "duration": 0.0, "message": ""}
    _emit({"event": "start", "id": nodeid})


def pytest_runtest_logreport(report) -> None:
    case = _cases.setdefault(report.nodeid, {"outcome": "passed", "duration": 0.0, "message": ""})
    case["duration"] += float(getattr(report, "duration", 0.0) or 0.0)
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
        if case["outcome"] not in ("failed", "error"):
            case["outcome"], case["message"] = outcome, _message(report)
    elif report.skipped and case["outcome"] == "passed":
        case["outcome"], case["message"] = "skipped", _message(report)


def pytest_runtest_logfinish(nodeid, location) -> None:
    case = _cases.pop(nodeid, {"outcome": "passed", "duration": 0.0, "message": ""})
    _emit({"event": "end", "id": nodeid, "outcome": case["outcome"], "duration": round(case["duration"], 3),
           "message": case["message"]})
