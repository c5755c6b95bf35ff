"""A plain search on several cores gives the one-core search's output (issue 32): forked workers search
with a looser cutoff and keep more plans, and the parent settles each deployment in grid order with the
one-core cutoff from the worker's memo (`search.ranking._search_forked`, `search.memo`). The JSON of the
forked search is the one-core JSON, wall time aside; the settling did trim plans a worker kept, and took
every walk and prediction from the memo. (Tiny models mostly rank later deployments better, so the
one-core cutoff seldom bites; `TRIMS` is a case where it does.)"""

from __future__ import annotations

import json

import pytest

import tpplan.search.pool as pool
import tpplan.search.ranking as ranking
from tools.in_process import run_captured
from tpplan.search.memo import Memo

TRIMS = ("-m", "tiny-deepseek-v3", "-t", "h200x8-ib400", "--nodes", "2", "--top", "3")  # cutoffs bite here
CASES = [
    TRIMS,
    ("-m", "tiny-llama", "-t", "h200x8-ib400", "-w", "prompt16k-c8", "--replicas", "all", "--top", "1"),
    ("-m", "tiny-deepseek-v3", "-t", "h200x8-ib400", "-w", "prompt16k-c8", "--dp-attention", "--top", "2"),
]


KEEP_ALL = ranking._search_kept


def loose(mesh, cutoff):  # type: ignore[no-untyped-def]
    """A worker with no cutoff at all (module level: the pool pickles it by name): the loosest a worker
    could search, whatever the timing, so the parent's settling must trim."""
    return KEEP_ALL(mesh, float("inf"))


def _search(*args: str) -> dict[str, object]:
    code, out, err = run_captured("search", *args, "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    data["search"]["seconds"] = None  # wall time
    return data  # type: ignore[no-any-return]


@pytest.mark.slow  # forks workers
@pytest.mark.parametrize("args", CASES)
def test_forked_search_gives_the_one_core_output(monkeypatch, args) -> None:  # type: ignore[no-untyped-def]
    if not pool.fork_workers(2):
        pytest.skip("one core or no fork here: nothing to compare")
    settled: list[tuple[int, int, int]] = []
    plain = ranking._settled

    def watch(s, mesh, got, memo, cutoff):  # type: ignore[no-untyped-def]
        before, misses = len(got.entries) if isinstance(got, ranking.Deployed) else 0, memo.misses
        out = plain(s, mesh, got, memo, cutoff)
        after = len(out.entries) if isinstance(out, ranking.Deployed) else 0
        settled.append((before, after, memo.misses - misses))
        return out

    monkeypatch.setattr(ranking, "_settled", watch)
    monkeypatch.setattr(ranking, "_search_kept", loose)
    forked = _search(*args)
    monkeypatch.setattr(pool, "fork_workers", lambda tasks: 0)
    one_core = _search(*args)
    assert forked == one_core
    assert len(settled) == len(forked["search"]["deployments"])  # type: ignore[index]
    assert all(misses == 0 for _, _, misses in settled)  # the parent computed nothing again
    if args == TRIMS:
        assert any(after < before for before, after, _ in settled), settled  # a worker kept plans one core cuts


def test_a_memo_answers_what_it_kept_and_computes_the_rest() -> None:
    memo, calls = Memo(), []

    def make(x: int):  # type: ignore[no-untyped-def]
        return lambda: calls.append(x) or x * 10

    assert memo.get("walk", 0.0, make(1)) == 10 and memo.get("walk", 0.0, make(2)) == 10
    assert memo.get("walk", 5.0, make(3)) == 30  # another reserve: computed
    assert calls == [1, 3] and (memo.hits, memo.misses) == (1, 2)
