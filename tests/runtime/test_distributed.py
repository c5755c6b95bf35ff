"""Proof by execution (CPU, gloo): every legal plan of every tiny family, sharded over N in {1, 2, 4}
processes, equals the single-process forward, and every rank's traced collectives equal the
predicted ones (kind, shape, dtype, bytes, order).

Forming a process group is the expensive part on 2 cores, so each test runs all of its cases in
one group. Cases use 6 tokens in prefill chunks of 5 (5, then 1): uneven token counts (padding),
KV cache / recurrent state carried across chunks, and a last chunk too small to scatter (the
fallback to the baseline plan, which the trace must show). Tolerance: fp32, relative error (max
abs error over max abs value, per layer output, final hidden and logits) at most 1e-4; observed
about 3e-6 (the sharded run only reorders sums).
"""

from __future__ import annotations

import pytest

from tpplan.audit import audit
from tpplan.models.config import list_presets
from tpplan.plans.named import EXTRA_PLANS, NAMED_PLANS
from tpplan.runtime.verify import CaseResult, VerifyCase, verify_cases

TINY = [p for p in list_presets() if p.startswith("tiny-")]
ALL_PLANS = list(NAMED_PLANS + EXTRA_PLANS)


def legal_plans(model: str, n: int) -> list[str]:
    return [pa.plan.name for pa in audit(model, n, ALL_PLANS).plans if pa.legal]


def _explain(r: CaseResult) -> str:
    lines = [f"{r.case.label} at TP{r.n}: max rel {r.max_rel:.2e} (tol {r.tolerance:g}), trace ok {r.trace_matches}"]
    for rank, (t, p) in enumerate(zip(r.traced, r.predicted, strict=True)):
        for a, b in zip(t, p, strict=False):
            if a.key() != b.key():
                lines.append(f"  rank {rank}: traced {a} != predicted {b}")
                break
        if len(t) != len(p):
            lines.append(f"  rank {rank}: {len(t)} traced vs {len(p)} predicted calls")
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_legal_plan_equals_single_process_and_prediction(n: int) -> None:
    cases = [VerifyCase(m, p, tokens=6, chunk=5) for m in TINY for p in legal_plans(m, n)]
    assert len(cases) >= 6 * 5
    results = verify_cases(cases, nproc=n, timeout_s=120)
    assert len(results) == len(cases)
    bad = [_explain(r) for r in results if not r.passed]
    assert not bad, "\n".join(bad)
    for r in results:
        assert r.max_rel < 1e-4
        if n > 1 and r.case.plan not in ("baseline", "latent-scattered", "sp-moe", "sglang-sp-moe", "vllm-moe-chunk"):
            assert r.fallback_traced == [1], r.case.label  # the 1-token chunk ran the baseline plan
        if r.case.plan in ("sp-moe", "sglang-sp-moe", "vllm-moe-chunk"):
            assert not r.fallback_traced  # all-to-all MoE pads: ranks without tokens dispatch nothing
        if n == 1:
            assert all(not t for t in r.traced)  # one rank: nothing moves
        elif r.case.plan in ("sequence-parallel", "sp-moe"):
            assert any(c.kind == "reduce_scatter" for c in r.traced[0]), r.case.label


@pytest.mark.slow
def test_seed_illegal_variant_gives_wrong_outputs() -> None:
    """The seed's point, by execution: all-gathering per-rank gate slices after a reduce-scatter is wrong."""
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import gate_aware

    graph = build_model_graph(load_model("tiny-kimi-k3"))
    fixed = gate_aware(graph, 2)
    # Input-scattered with KDA made legal (gate-aware's fixes) but MLA's g_proj left as the seed's prototype.
    only_gate = fixed.with_(
        name="seed-g_proj",
        replicate=frozenset(x for x in fixed.replicate if "mla" not in x),
        a2a=frozenset(x for x in fixed.a2a if "mla" not in x),
    )
    cases = [
        VerifyCase("tiny-kimi-k3", "input-scattered", tokens=8, force=True),
        VerifyCase("tiny-kimi-k3", "seed-g_proj", tokens=8, force=True, plan_obj=only_gate),
        VerifyCase("tiny-kimi-k3", "input-scattered", tokens=8),  # refused without force
    ]
    forced, gate_only, refused = verify_cases(cases, nproc=2, timeout_s=120)
    assert not forced.legal and not forced.passed
    final = [e for e in forced.errors if e.value in ("hidden", "logits")]
    assert min(e.rel for e in final) > 0.1, final  # grossly wrong, not rounding
    unplanned = [c for c in forced.traced[0] if not c.planned]
    assert any(c.kind == "all_gather" and c.value.startswith("g_out(forced)") for c in unplanned)
    assert "g_proj" in gate_only.reason and "kda" not in gate_only.reason.split(" receives")[0]
    by = {(e.layer, e.value): e.rel for e in gate_only.errors}
    first_mla = graph.layer_kinds.index("mla+moe")
    for layer in range(first_mla):  # the KDA layers before it are exact
        assert by[(layer, "resid_out")] < 1e-4 and by[(layer, "mlp_out")] < 1e-4
    assert by[(first_mla, "resid_out")] > 0.05  # wrong from the first gated MLA layer on
    assert min(by[(len(graph.layer_kinds), "logits")], by[(len(graph.layer_kinds), "hidden")]) > 0.01  # 100x tol
    forced_gathers = [c.value for c in gate_only.traced[0] if c.value.endswith("(forced)")]
    assert forced_gathers == ["gate_logits(forced)"] * graph.layer_kinds.count("mla+moe")
    assert not refused.legal and not refused.errors and "g_proj" in refused.reason


@pytest.mark.slow
def test_expert_parallel_and_lazy_safetensors(tmp_path) -> None:
    """EP (each rank E/ep experts, cut over N/ep ranks) and weights read slice by slice from safetensors."""
    import torch
    from safetensors.torch import save_file

    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.runtime.executor import numerics_for
    from tpplan.runtime.weights import random_weights

    graph = build_model_graph(load_model("tiny-qwen3-next"))
    w = random_weights(graph, numerics_for(graph), seed=5)
    names = sorted(w)
    save_file({k: w[k].contiguous() for k in names[::2]}, str(tmp_path / "a.safetensors"))
    save_file({k: w[k].contiguous() for k in names[1::2]}, str(tmp_path / "b.safetensors"))
    # ep2: two expert groups, each expert cut over two ranks; ep4: whole experts, one group per rank.
    cases = [VerifyCase(m, "ep2", tokens=9, chunk=4) for m in ("tiny-deepseek-v3", "tiny-kimi-k3")]
    cases += [VerifyCase(m, "ep4", tokens=9, chunk=4) for m in ("tiny-qwen3-next", "tiny-qwen3-moe")]
    cases.append(VerifyCase("tiny-kimi-k3", "gate-aware+ep2", tokens=9, chunk=4))  # 1-token chunk: falls back to ep2
    cases.append(VerifyCase("tiny-gpt-oss", "ep2", tokens=9, chunk=4))  # experts' down bias on slice 0 only
    cases.append(VerifyCase("tiny-qwen3-next", "gate-aware", tokens=9, chunk=4, weights=str(tmp_path)))
    cases.append(VerifyCase("tiny-qwen3-next", "sp-moe", tokens=9, chunk=4, weights=str(tmp_path)))
    results = verify_cases(cases, nproc=4, timeout_s=120)
    bad = [_explain(r) for r in results if not r.passed]
    assert not bad, "\n".join(bad)
    assert torch.is_tensor(w[names[0]])


def test_illegal_plan_refused_by_cli_with_reason() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tpplan", "verify", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", "input-scattered"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "illegal" in out.stderr and "receives" in out.stderr and "--force" in out.stderr


def test_the_vocab_parallel_lookup_never_indexes_by_a_boolean_mask() -> None:
    """`PlanRunner._embed` gives each rank's vocab rows and zeros elsewhere with a gather and a select: a
    boolean-mask index is a `nonzero`, which on a GPU waits for everything queued (06e: the host could not get
    ahead of the GPU in `bench --timing host-ahead`). Every aten op it runs is checked for a bool index."""
    from types import SimpleNamespace

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from tpplan.runtime.distributed import PlanRunner

    class BoolIndexes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            flat = [a for x in args for a in (x if isinstance(x, (list, tuple)) else [x])]
            if func.__name__.startswith(("index", "nonzero", "masked_select")) and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in flat
            ):
                self.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    table = torch.randn(10, 4)  # a rank holding vocab rows 10-19 of 30
    shard = SimpleNamespace(embed=table, vocab_lo=10)
    me = SimpleNamespace(numerics=SimpleNamespace(embed_scale=1.0))
    ids = torch.tensor([0, 10, 19, 20, 15, 29, 9])
    with BoolIndexes() as mode:
        out = PlanRunner._embed(me, ids, shard)  # type: ignore[arg-type]
    assert mode.seen == []
    want = torch.zeros(7, 4)
    for row, i in enumerate(ids.tolist()):
        if 10 <= i < 20:
            want[row] = table[i - 10]
    assert torch.equal(out, want)


def test_the_rope_frequencies_are_made_once_per_parameters_and_device(monkeypatch) -> None:
    """`rope_cos_sin` makes the inverse frequencies once per (RoPE parameters, dim, device), also across new
    `Rope` objects with the same parameters (Gemma's window layers make one per call): on a GPU each remake is a
    copy from pageable host memory, which waits for the GPU (06e). Values as a fresh computation; other
    parameters get their own."""
    import torch

    from tpplan.runtime import kernels_local as KL

    made: list[int] = []
    real = KL.Rope.inv_freq_and_factor

    def counted(self, dim):  # type: ignore[no-untyped-def]
        made.append(dim)
        return real(self, dim)

    monkeypatch.setattr(KL.Rope, "inv_freq_and_factor", counted)
    monkeypatch.setattr(KL, "_INV_ON_DEVICE", {})
    pos = torch.arange(5, 12)
    first = KL.rope_cos_sin(pos, 8, KL.Rope(theta=10_000.0))
    again = KL.rope_cos_sin(pos + 3, 8, KL.Rope(theta=10_000.0))
    assert made == [8]
    inv, _ = real(KL.Rope(theta=10_000.0), 8)
    assert torch.allclose(first[0], torch.cos(pos.float()[:, None] * inv[None, :]))
    assert torch.allclose(again[1], torch.sin((pos + 3).float()[:, None] * inv[None, :]))
    KL.rope_cos_sin(pos, 8, KL.Rope(theta=1_000_000.0))
    KL.rope_cos_sin(pos, 16, KL.Rope(theta=10_000.0))
    KL.rope_cos_sin(pos, 8, KL.Rope(theta=10_000.0, scaling={"rope_type": "linear", "factor": 2.0}))
    assert made == [8, 8, 16, 8]
