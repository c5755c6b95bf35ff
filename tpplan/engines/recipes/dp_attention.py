"""Engine flags for the DP-attention plans (`tpplan.layout.dp_attention`; docs/design.md, "DP attention").

Sources (commit as the search index stored the file):
- SGLang `python/sglang/srt/layers/dp_attention.py` @ 00161092eb7c5cd13b74ae3a9ff1800a6e63ec80:
  `DpPaddingMode.get_dp_padding_mode` (SUM_LEN for extend batches over more than one DP rank;
  MAX_LEN with the pplx backend, `SGLANG_DEEPEP_V2_FORCE_MAX_LEN`, or an idle rank of a hybrid-SSM
  model), `_dp_gather_via_all_reduce` / `_dp_gather_via_all_gather`, `dp_scatter`,
  `dp_reduce_scatter_tensor`.
- SGLang `python/sglang/srt/layers/communicator.py` @ fd3907ee4618e96b73ee94d9a836db78efb5d046:
  `CommunicateSummableTensorPairFn._scatter_hidden_states` (reduce-scatter only under MAX_LEN,
  else `dp_scatter` after the MoE's all-reduce).
- SGLang `python/sglang/srt/models/llama4.py` @ 871da34db32b429e59d81b726a48776edaa9baf9 (and the
  other model files): `VocabParallelEmbedding(..., enable_tp=not is_dp_attention_enabled())`.
- vLLM `vllm/distributed/device_communicators/all2all.py` @ 001430048e8175c8dff1bc57e1a81a1fa75460f9:
  `AgRsAll2AllManager` (dispatch `all_gatherv` of hidden states and routing, combine
  `reduce_scatterv`, sizes from `dp_metadata.get_chunk_sizes_across_dp_rank`).
- vLLM `vllm/model_executor/layers/fused_moe/config.py` @ 00c1c6a2054b7027369c2a460cc2181a9b86293d:
  `FusedMoEParallelConfig.make` (EP over the flattened DP x TP ranks with `--enable-expert-parallel`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from tpplan.engines.deepep import DECODE_LOW_LATENCY, DEFAULT_MODE, MODE_RESOLVE
from tpplan.engines.recipes.base import Condition, EngineRecipe, _moe, dp_family
from tpplan.engines.schema import DpBeside
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh
from tpplan.models.spec import ModelSpec

SRC_SGL_DP = "sgl-project/sglang python/sglang/srt/layers/dp_attention.py@00161092"
SRC_SGL_DP_COMM = "sgl-project/sglang python/sglang/srt/layers/communicator.py@fd3907ee"
SRC_VLLM_AGRS = "vllm-project/vllm vllm/distributed/device_communicators/all2all.py@00143004"
SRC_VLLM_FMOE = "vllm-project/vllm vllm/model_executor/layers/fused_moe/config.py@00c1c6a2"


def sglang_dp_recipe(plan: Plan, spec: ModelSpec, base: list[str], mesh: Mesh) -> EngineRecipe:
    """SGLang `--enable-dp-attention --dp-size tp` (attention TP 1) with the plan's MoE flags."""
    tp = mesh.tp
    fam = dp_family(plan)
    moe = _moe(spec)
    args = [*base, f"--dp-size {tp}", "--enable-dp-attention"]
    conds = [
        Condition("dp_size == tp_size (attention TP 1: whole attention weights per rank)", True, "adjusts", SRC_SGL_DP),
        Condition(
            "extend batches over more than one DP rank run DpPaddingMode.SUM_LEN (all-reduce gather)",
            fam != "dp-attention-maxlen",
            "adjusts",
            SRC_SGL_DP,
        ),
    ]
    if fam == "dp-attention+a2a":
        args += ["--moe-a2a-backend deepep", f"--deepep-mode {DEFAULT_MODE}"]
        summary = "DP attention, DeepEP dispatch/combine of each rank's own tokens"
        conds.append(Condition("the model has routed experts", moe is not None, "refuses", SRC_SGL_DP))
        conds.append(Condition(DECODE_LOW_LATENCY, None, "adjusts", MODE_RESOLVE.cite()))
    elif fam == "dp-attention+ep":
        args += [f"--ep-size {plan.ep_size}", "--moe-a2a-backend none"]
        summary = f"DP attention, EP{plan.ep_size} experts on the all-reduce-gathered tokens"
    elif fam in ("vllm-dp-ep", "vllm-dp"):
        return EngineRecipe(
            "SGLang", plan.name, tuple(args), "no",
            "SGLang gathers the whole MLP input (router and shared experts on every token); the closest is "
            + (f"dp-attention+ep{tp}" if fam == "vllm-dp-ep" else "dp-attention"),
        )  # fmt: skip
    else:
        args.append("--moe-a2a-backend none")
        summary = "DP attention, TP MoE: SUM_LEN all-reduce gather, MoE all-reduce, dp_scatter"
    if fam == "dp-attention-maxlen":
        summary = (
            "DP attention; SGLang pads to the longest rank (all-gather + reduce-scatter) only for pplx, "
            "SGLANG_DEEPEP_V2_FORCE_MAX_LEN or an idle hybrid-SSM rank: prefill otherwise runs dp-attention's SUM_LEN"
        )
    notes = (
        f"After the MoE, SGLang reduce-scatters only under MAX_LEN padding; under SUM_LEN the MoE all-reduces "
        f"and dp_scatter copies the rank's rows ({SRC_SGL_DP_COMM}).",
    )
    realises: Literal["yes", "partly"] = "partly" if fam == "dp-attention-maxlen" else "yes"
    return EngineRecipe("SGLang", plan.name, tuple(args), realises, summary, tuple(conds), notes)


def _beside(mesh: Mesh, beside: DpBeside | None) -> tuple[list[str], tuple[Condition, ...], str]:
    """The flags, conditions and difference DP attention takes beside the mesh's PP and prefill CP (vLLM's
    `--pipeline-parallel-size`, `--prefill-context-parallel-size`; whether it runs: `whole_deployment`)."""
    flags = [f"--prefill-context-parallel-size {mesh.cp}"] if mesh.cp > 1 else []
    flags += [f"--pipeline-parallel-size {mesh.pp}"] if mesh.pp > 1 else []
    if not flags or beside is None:
        return flags, (), ""
    conds = tuple(Condition(f.text, True, "refuses", f.source.cite()) for f in beside.facts)
    differs = ""
    if mesh.cp > 1 and beside.ep_spans_cp:
        differs = (f"vLLM's MoE group spans DP x PCP ({mesh.tp * mesh.cp} ranks), tpplan's the {mesh.tp} "
                   "attention-DP ranks of one CP rank")  # fmt: skip
    return flags, conds, differs


def vllm_dp_recipe(plan: Plan, spec: ModelSpec, mesh: Mesh, chunk: int, beside: DpBeside | None = None) -> EngineRecipe:
    """vLLM `--data-parallel-size tp --tensor-parallel-size 1 --enable-expert-parallel`, with the mesh's PP and
    prefill CP (`beside`: what the engine version does with them, None: not read)."""
    tp = mesh.tp
    fam = dp_family(plan)
    moe = _moe(spec)
    sizes, beside_conds, differs = _beside(mesh, beside)
    base = ["--tensor-parallel-size 1", f"--data-parallel-size {tp}", *sizes, "--enable-chunked-prefill",
            f"--max-num-batched-tokens {chunk}"]  # fmt: skip
    conds = (
        Condition("the model has routed experts", moe is not None, "refuses", SRC_VLLM_FMOE),
        Condition("EP spans all DP x TP ranks (there is no separate EP size)", True, "adjusts", SRC_VLLM_FMOE),
        *beside_conds,
    )
    r = _vllm_dp_family(plan, fam, base, conds)
    if not differs or r.realises == "no":
        return r
    return replace(r, realises="partly", summary=f"{r.summary}; {differs}")


def _vllm_dp_family(plan: Plan, fam: str | None, base: list[str], conds: tuple[Condition, ...]) -> EngineRecipe:
    """The vLLM DP-attention recipe of the plan's family."""
    if fam == "vllm-dp-ep":
        args = (*base, "--enable-expert-parallel", "--all2all-backend allgather_reducescatter")
        notes = (
            "vLLM gathers the top-k ids and weights with the hidden (all_gatherv); tpplan gathers the router's "
            f"score matrix, E wide ({SRC_VLLM_AGRS}).",
        )
        return EngineRecipe("vLLM", plan.name, args, "yes", "DP attention, EP experts by all-gather/reduce-scatter",
                            conds, notes)  # fmt: skip
    if fam == "vllm-dp":
        return EngineRecipe("vLLM", plan.name, tuple(base), "yes",
                            "DP attention; routed experts TP over the DP ranks (FusedMoEParallelConfig.make flattens "
                            "TP across DP), gathered by all-gather, reduce-scattered back",
                            (conds[0], *conds[2:]))  # fmt: skip
    if fam == "dp-attention+a2a":
        args = (*base, "--enable-expert-parallel", "--all2all-backend deepep_high_throughput")
        return EngineRecipe("vLLM", plan.name, args, "partly",
                            "DP attention with DeepEP; vLLM runs dense layers replicated on each rank's tokens, "
                            "not gathered under TP", conds)  # fmt: skip
    return EngineRecipe(
        "vLLM", plan.name, tuple(base), "no",
        "with --tensor-parallel-size 1 every non-MoE layer runs replicated on the rank's own tokens and only the "
        "fused MoE gathers (FusedMoEParallelConfig.make); no flag gathers the whole MLP input: closest is vllm-dp-ep",
    )  # fmt: skip


__all__ = ["sglang_dp_recipe", "vllm_dp_recipe"]
