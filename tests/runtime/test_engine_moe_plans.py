"""Engine-named MoE plans executed on gloo: the sharded forward equals the single-process one, the
traced collectives equal the prediction, and per layer they are the engine's.

`sglang-sp-moe` (SGLang's default K3 SP-MoE: the attention-residual bank on every row while the
stream between MoE layers is token-sharded): the dense layer all-reduces twice, the first MoE layer
all-reduces the dense output then reduce-scatters o_proj's, every later MoE layer all-gathers the
stream after the MoE output add. tiny-kimi-k3 has a block boundary every 2 layers (a bank snapshot
in an all-gathered layer too).
`vllm-moe-chunk` (vLLM's Qwen3-MoE MoE sequence parallelism): attention all-reduces, the MoE block
dispatches the rank's chunk and its output is all-gathered before the next residual add.
"""

from __future__ import annotations

import pytest

from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.runtime.verify import VerifyCase, verify_cases

MODEL = "tiny-kimi-k3"


def _per_layer(calls) -> dict[int, list[tuple[str, str]]]:
    out: dict[int, list[tuple[str, str]]] = {}
    for c in calls:
        if c.chunk == 0 and not c.value.endswith(":counts"):
            out.setdefault(c.layer, []).append((c.kind, c.value))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_engine_moe_plans_equal_single_process_with_the_engines_collectives(n: int) -> None:
    graph = build_model_graph(load_model(MODEL))
    assert graph.spec.attn_res_block_size == 2 and graph.layer_kinds[0].endswith("+dense")
    cases = [VerifyCase(MODEL, "sglang-sp-moe", tokens=6, chunk=5), VerifyCase(MODEL, "sglang-sp-moe", tokens=9)]
    cases.append(VerifyCase("tiny-qwen3-moe", "vllm-moe-chunk", tokens=7, chunk=5))
    *results, chunked = verify_cases(cases, nproc=n, timeout_s=120)
    assert chunked.passed and chunked.trace_matches and chunked.max_rel < 1e-4, (chunked.case.label, chunked.reason)
    y_a2a = [("all_to_all", "y:dispatch"), ("all_to_all", "y:combine")]
    for rank in range(n):
        layers = _per_layer(chunked.traced[rank])
        assert layers[0] == [("all_reduce", "delta"), ("all_reduce", "attn_out"), *y_a2a], layers[0]
        assert layers[1] == [("all_gather", "delta"), ("all_reduce", "attn_out"), *y_a2a], layers[1]
    moe_a2a = [("all_to_all", "x_latent:dispatch"), ("all_to_all", "x_latent:combine")]
    for r in results:
        assert r.passed and r.trace_matches and r.max_rel < 1e-4, (r.case.label, r.max_rel, r.reason)
        assert not r.fallback_traced  # all-to-all MoE pads: no chunk falls back
        for rank in range(n):
            layers = _per_layer(r.traced[rank])
            assert layers[0] == [("all_reduce", "resid_mid"), ("all_reduce", "resid_out")], layers[0]
            assert layers[1] == [("all_reduce", "resid_mid"), ("reduce_scatter", "attn_out"), *moe_a2a], layers[1]
            for i in range(2, len(graph.layer_kinds)):
                assert layers[i] == [("all_gather", "resid_mid"), ("reduce_scatter", "attn_out"), *moe_a2a], i
