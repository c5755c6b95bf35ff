"""A workload tpplan cannot price in seconds is refused at once (issue 35): chunks of 7 tokens of
16K prompts made `audit` run 105 s and take 2.7 GB. The scheduler and the search's TTFT weights
cost batches + requests, not their product (60,000 clients used to take seconds per batch)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_captured

from tpplan.bench.config import BenchConfig, resolved_workload
from tpplan.cost.workload import (
    MAX_PRICED_BATCHES,
    Workload,
    distinct_batches,
    load_workload,
    schedule,
    simulate_ttft,
)
from tpplan.errors import TpplanError
from tpplan.search.objectives import ttft_batches

CHUNK_7 = 'name = "c7"\ninput_len = 16384\nconcurrency = 8\nchunk_size = 7\nnum_requests = 8\n'


def test_a_workload_with_too_many_batches_to_price_is_refused_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "c7.toml"
    f.write_text(CHUNK_7)
    with pytest.raises(TpplanError) as got:
        load_workload(str(f))
    assert got.value.where == str(f)
    assert "16385 different batches" in got.value.reason and f"at most {MAX_PRICED_BATCHES}" in got.value.reason
    assert "chunk_size (e.g. 256" in got.value.fix
    code, out, err = run_captured("audit", "-m", "tiny-llama", "--topology", "h200x8-ib400", "--workload", str(f))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and str(f) in err


def test_a_bench_chunk_override_is_checked_too() -> None:
    cfg = BenchConfig(model="tiny-llama", plans=("baseline",), workload="prompt16k-c8", chunk=7)
    with pytest.raises(TpplanError, match="--tokens/--chunk/--requests: its prefill schedule"):
        resolved_workload(cfg)


WORKLOADS = [
    Workload(input_lens=[3000, 100, 9000, 16384], concurrency=5, chunk_size=4096, num_requests=23),
    Workload(input_len=16384, concurrency=8, chunk_size=8192, num_requests=8),
    Workload(input_len=1000, concurrency=3, chunk_size=700, num_requests=40),
    Workload(input_len=300, concurrency=400, chunk_size=256, num_requests=1000),
]


def _distinct(w: Workload) -> int:
    return len({tuple((s.n_tokens, s.start_pos) for s in b.segments) for b in schedule(w)})


@pytest.mark.parametrize("w", WORKLOADS)
def test_distinct_batches_is_a_bound_and_exact_above_the_limit(w: Workload) -> None:
    n = distinct_batches(w)
    assert n >= _distinct(w)
    assert n <= MAX_PRICED_BATCHES or n == _distinct(w)


@pytest.mark.parametrize("w", WORKLOADS)
def test_ttft_weights_match_counting_every_request_for_every_batch(w: Workload) -> None:
    """The mean TTFT weights, by the direct count (each batch: the requests waiting through it)."""
    res = simulate_ttft(w, lambda _b: 1.0)
    want: dict[tuple[tuple[int, int], ...], float] = {}
    for b in res.batches:
        inside = sum(1 for a, t in zip(res.arrival_s, res.ttft_s, strict=True) if a <= b.start_s and b.end_s <= a + t)
        segs = tuple((s.n_tokens, s.start_pos) for s in b.segments)
        want[segs] = want.get(segs, 0.0) + inside / w.total_requests
    got = dict(ttft_batches(w))
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(want[k]) for k in want)
    mean = sum(wt for wt in got.values())  # unit batch times: the weights sum to the mean TTFT
    assert mean == pytest.approx(res.mean_s)


def test_many_clients_schedule_in_fcfs_order() -> None:
    """6,000 clients of 100-token prompts, 8,192-token chunks: every batch full but the last of a
    wave, requests in submission order."""
    w = Workload(input_len=100, concurrency=6_000, chunk_size=8192, num_requests=20_000)
    batches = schedule(w)
    ids = [s.request_id for b in batches for s in b.segments]
    assert [i for k, i in enumerate(ids) if k == 0 or ids[k - 1] != i] == list(range(20_000))
    assert sum(b.n_tokens for b in batches) == 100 * 20_000
    assert sum(1 for b in batches if b.n_tokens < 8192) <= 3
