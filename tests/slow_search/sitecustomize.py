"""Imported at start-up by a Python process the tests start with this folder on PYTHONPATH: with
TPPLAN_TEST_SLOW_SEARCH=SECONDS, each deployment the search's forked workers take starts with that
long a sleep, so a test's signal lands while the workers rank, however fast the search has become
(tests/test_signals.py, tests/fuzz/test_fuzz_processes.py), and the progress lines do not tick (see
below; TPPLAN_TEST_KEEP_TICK=1 keeps them). tpplan itself has no such seam."""

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

    # Off a terminal the progress lines tick on a thread of their own (commands/_console.PlainSteps),
    # which the search pauses to fork its workers (search/pool.py); without the tick, the search forks
    # as a CLI run with no progress thread does, which these tests stop too.
    if not os.environ.get("TPPLAN_TEST_KEEP_TICK"):
        from tpplan.commands import _console

        _console.TICK_S = 0
