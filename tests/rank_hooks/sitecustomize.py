"""Imported at start-up by every Python process the tests start with this folder on PYTHONPATH
(`fault_injection.fault_env`): each rank of a spawned group, the CLI that spawns them. Where a test
asks for a fault (TPPLAN_TEST_FAULT), it registers the fault-injection hook in that process.

This is the tests' own way into the ranks: tpplan imports no module its environment names (issue 35).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("TPPLAN_TEST_FAULT"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fault_injection
    import fault_injection  # noqa: F401  (importing it registers its hook)
