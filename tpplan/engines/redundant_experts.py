"""Redundant experts under expert parallelism, as SGLang and vLLM lay them out (issue 32).

Both engines hold `physical = logical + redundant` routed experts per MoE layer over the EP group, an equal
share on each rank, and move hot experts' copies so the routed tokens spread evenly over the physical ones
(EPLB):
- SGLang 0.5.23: `--ep-num-redundant-experts R` (`Exec.ep_num_redundant_experts`, default 0);
  `ExpertLocationMetadata._init_common` sets num_physical_experts = num_logical_experts + R, asserts
  num_physical_experts % ep_size == 0 and gives each rank num_physical_experts // ep_size;
  `--enable-eplb` rebalances them (static dispatch under an all-to-all backend,
  `handle_eplb_and_dispatch`).
- vLLM 0.34.0: `--enable-eplb --eplb-config '{"num_redundant_experts": R}'`; `determine_expert_counts` sets
  global_num_experts = num_experts + R, `determine_expert_map` deals them over the EP ranks, the EPLB policy
  asserts num_physical_experts % num_gpus == 0 (`policy/default.py rebalance_experts`), and ParallelConfig
  refuses R > 0 without `--enable-eplb` (with EPLB and no R it picks the least R that divides,
  `compute_eplb_num_redundant_experts`).

tpplan prices that layout (`Plan.redundant_experts`): an EP size that divides the physical count is valid,
each rank's expert weights are physical / EP experts' (the copies take memory), and its grouped GEMMs run the
rank's physical experts with its routed rows spread over them uniformly (EPLB's aim; real routing skew is
not priced). The all-to-all dispatch (its routing-weight columns) and an engine's measured MoE table count the
physical experts too (`DISPATCH`). The plan modifier is `<plan>+redundant<R>`; `--ep-num-redundant-experts R` on
audit, search and report.
"""

from __future__ import annotations

import re

from tpplan.engines.schema import Source
from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan

SGLANG_LAYOUT = Source(
    "sgl-project/sglang",
    "python/sglang/srt/eplb/expert_location.py",
    "ExpertLocationMetadata._init_common: num_physical_experts = num_logical_experts + ep_num_redundant_experts; "
    "assert num_physical_experts % ep_size == 0; num_local_physical_experts = num_physical_experts // ep_size",
    "0.5.23 (PyPI wheel)",
)
SGLANG_FLAG = Source(
    "sgl-project/sglang",
    "python/sglang/srt/arg_groups/fields/exec_.py",
    "ep_num_redundant_experts ('Allocate this number of redundant experts in expert parallel', default 0), "
    "enable_eplb; arg_groups/parallel_hook.py handle_eplb_and_dispatch (EPLB: static dispatch with an a2a backend)",
    "0.5.23 (PyPI wheel)",
)
VLLM_LAYOUT = Source(
    "vllm-project/vllm",
    "vllm/model_executor/layers/fused_moe/layer.py",
    "determine_expert_counts: global_num_experts = num_experts + num_redundant_experts; "
    "expert_map_manager.py determine_expert_map deals them over the EP ranks; "
    "distributed/eplb/policy/default.py rebalance_experts asserts num_physical_experts % num_gpus == 0",
    "0.34.0 (PyPI wheel)",
)
VLLM_FLAG = Source(
    "vllm-project/vllm",
    "vllm/config/parallel.py",
    "EPLBConfig.num_redundant_experts (set by --eplb-config); ParallelConfig refuses num_redundant_experts > 0 "
    "without --enable-eplb; compute_eplb_num_redundant_experts picks the least count that divides the EP size",
    "0.34.0 (PyPI wheel)",
)
# The all-to-all dispatch and the MoE kernel run over the physical experts: the router's logical ids are
# mapped to physical ones, so each rank's dispatched rows and local expert count are physical / EP.
SGLANG_DISPATCH = Source(
    "sgl-project/sglang",
    "python/sglang/srt/models/deepseek_v2.py",
    "DeepseekV2MoE.__init__: the experts layer gets num_experts = num_experts_for_moe + ep_num_redundant_experts "
    "(and self.num_experts = n_routed_experts + ep_num_redundant_experts under DeepEP-class a2a backends); "
    "layers/moe/fused_moe_triton/layer.py builds the DeepEP dispatcher with that num_experts and "
    "num_local_experts = physical // ep_size; token_dispatcher/deepep.py _dispatch_core: "
    "buffer.get_dispatch_layout(topk_ids, self.num_experts)",
    "0.5.23 (PyPI wheel)",
)
VLLM_DISPATCH = Source(
    "vllm-project/vllm",
    "vllm/model_executor/layers/fused_moe/modular_kernel.py",
    "FusedMoEKernelModularImpl._prepare passes global_num_experts (determine_expert_counts: num_experts + "
    "num_redundant_experts) to prepare_finalize.prepare/prepare_async; prepare_finalize/deepep_ht.py _do_dispatch: "
    "buffer.get_dispatch_layout(topk_idx=rank_topk_ids, num_experts=num_experts)",
    "0.34.0 (PyPI wheel)",
)
DISPATCH = (SGLANG_DISPATCH, VLLM_DISPATCH)
SOURCES = (SGLANG_LAYOUT, SGLANG_FLAG, VLLM_LAYOUT, VLLM_FLAG, SGLANG_DISPATCH, VLLM_DISPATCH)

REDUNDANT_PATTERN = re.compile(r"(?P<base>.+)\+redundant(?P<count>\d+)")


def with_redundant_experts(plan: Plan, count: int) -> Plan:
    """`plan` with `count` redundant routed experts over its EP group (`count` 0: `plan` itself). Refused, one
    line, where the plan splits no experts by EP or all-to-all, or already has redundant experts."""
    where = f"plan={plan.name}+redundant{count}"
    if count < 0:
        raise TpplanError(where, f"{count} redundant experts", "use a count of at least 0")
    if count == 0:
        return plan
    if plan.redundant_experts:
        raise TpplanError(where, f"plan {plan.name} already has {plan.redundant_experts} redundant experts",
                          "give the count once")  # fmt: skip
    if plan.moe not in ("a2a", "ep"):
        raise TpplanError(
            where,
            f"redundant experts are copies over an expert-parallel group, and plan {plan.name} splits the "
            f"experts by TP (MoE mode {plan.moe})",
            "use an all-to-all or EP plan, e.g. dp-attention+a2a, sp-moe, vllm-dp-ep or <plan>+ep<k>",
        )
    return plan.with_(
        name=f"{plan.name}+redundant{count}",
        title=f"{plan.title}, {count} redundant experts",
        summary=f"{plan.summary} {count} redundant expert copies: the EP group holds experts + {count} physical "
        "experts, an equal share per rank, the routed rows spread evenly over them (EPLB).",
        redundant_experts=count,
        engine_notes=(*plan.engine_notes, f"redundant experts: {SGLANG_LAYOUT.cite()}; {VLLM_LAYOUT.cite()}"),
    )


def launch_flags(engine: str, count: int) -> tuple[str, ...]:
    """`engine` ("SGLang" or "vLLM")'s flags for `count` redundant experts balanced by EPLB (none for 0)."""
    if count == 0:
        return ()
    if engine == "SGLang":
        return (f"--ep-num-redundant-experts {count}", "--enable-eplb")
    return ("--enable-eplb", f"--eplb-config '{{\"num_redundant_experts\": {count}}}'")


__all__ = ["DISPATCH", "REDUNDANT_PATTERN", "SOURCES", "launch_flags", "with_redundant_experts"]
