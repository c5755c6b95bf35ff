"""Imported at start-up by a Python process the tests start with this folder on PYTHONPATH: with
TPPLAN_TEST_SLOW_SEARCH=SECONDS, each deployment the search's forked workers take starts with that
long a sleep, so a test's signal lands while the workers rank, however fast the search has become
(tests/test_signals.py, tests/fuzz/test_fuzz_processes.py). The progress lines tick as in any CLI
run: the search forks its workers with that thread paused (search/pool.py). tpplan itself has no
such seam."""

from __future__ import annotations

import os

if os.environ.get("TPPLAN_TEST_SLOW_SEARCH"):
    import time

    from tpplan.search import ranking

    _real = ranking._search_one

    def _slow(*args, **kwargs):
        time.sleep(float(os.environ["TPPLAN_TEST_SLOW_SEARCH"]))
        return _real(*args, **kwargs)

    ranking._search_one = _slow
