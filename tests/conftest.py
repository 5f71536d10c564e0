"""Settings every test process needs before any test module imports torch; the optional parts' marks.

`make install` (scripts/system-deps.sh) installs the parts beyond pip when it can. A test that needs
one carries its mark (`@pytest.mark.needs_wordnet`, `@pytest.mark.needs_chromium`, or a module's
`pytestmark`), the one place that decides whether the part is here; without it the test skips with
a reason that names the part and its install command, and the end of the run lists those skips.
VLCTL_WORDNET_DIR=/nonexistent simulates a machine without WordNet.
"""

import importlib.util
import os
from collections import Counter

import pytest

# vlctl sets OMP_WAIT_POLICY=PASSIVE on import (OpenMP threads that spin while they wait make torch
# 10-100x slower on shared cores); imported here, before any test module can import torch first.
import vlctl  # noqa: F401
from vlctl.captions.wordnet import find_wordnet_root

CHROMIUM = os.environ.get("VLCTL_CHROMIUM", "/usr/bin/chromium")


def _chromium_missing():
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM}"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed"
    return None


def _milvus_missing():
    missing = [m for m in ("pymilvus", "milvus_lite") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} not installed" if missing else None


# mark -> (what is missing or None, the skip reason: the part, what goes untested, the install command).
OPTIONAL = {
    "needs_wordnet": (
        None if find_wordnet_root() is not None else "no WordNet 3.0 in $VLCTL_WORDNET_DIR, nltk_data or /usr/share/wordnet",
        "needs WordNet 3.0 (3VL caption-tree negatives): sudo apt-get install wordnet-base wordnet-sense-index",
    ),
    "needs_chromium": (
        _chromium_missing(),
        "needs Chromium (the web page in a browser): sudo apt-get install chromium",
    ),
    "needs_milvus": (
        _milvus_missing(),
        "needs pymilvus and milvus-lite (the Milvus backend, through Milvus Lite): pip install -e '.[milvus]'",
    ),
}


def pytest_configure(config):
    for mark, (_, reason) in OPTIONAL.items():
        config.addinivalue_line("markers", f"{mark}: {reason}")


def pytest_collection_modifyitems(config, items):
    for mark, (missing, reason) in OPTIONAL.items():
        if missing is None:
            continue
        skip = pytest.mark.skip(reason=f"{reason} ({missing})")
        for item in items:
            if item.get_closest_marker(mark) is not None:
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """One line per reason: what this run did not test."""
    reasons = Counter()
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    deselected = len(terminalreporter.stats.get("deselected", []))
    if not reasons and not deselected:
        return
    terminalreporter.section("not tested on this machine", sep="-")
    for reason, n in reasons.most_common():
        terminalreporter.write_line(f"{n:4d} skipped: {reason}")
    if deselected:
        terminalreporter.write_line(f"{deselected:4d} deselected by -m/-k (`make test` leaves out the slow tests; `make test-all` runs them)")
