import atexit
import os
import shutil
import signal
import tempfile

import pytest

from tpplan.signals import STOPPING

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# AIC's answer cache (tpplan.cost.sources.aic_cache) goes to a folder of this session's own, never the user's.
if "TPPLAN_CACHE_DIR" not in os.environ:
    os.environ["TPPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpplan-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TPPLAN_CACHE_DIR"], True)


@pytest.fixture
def handlers():
    """Put back the process's signal handlers after the test: after a signal, `tpplan.signals.exit_cleanly`
    leaves its own in place (tests/test_signals.py, tests/test_outputs_together.py)."""
    before = {s: signal.getsignal(s) for s in STOPPING}
    yield
    for s, h in before.items():
        signal.signal(s, h)
