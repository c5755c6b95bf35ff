"""Prefill context parallelism and the deployment flags, as the engines spell them, read from their
sources: which flags launch a TP x CP x PP deployment (and a micro-batch overlap), which model
classes the engine's prefill CP runs for, and what it does otherwise. The memo's deployment rows
quote these; where no engine flag realises a deployment, the row says so.

Read in the release wheels (SGLang 0.5.23, vLLM 0.33.0), paths as in the repositories:

- SGLang: `--attn-cp-size` and `--enable-prefill-cp`, with `--cp-strategy zigzag|interleave`
  (`python/sglang/srt/arg_groups/fields/parallel.py`, the `attn_cp_size`, `enable_prefill_cp`,
  `cp_strategy` fields); `--tp-size` is then the world size and must be divisible by
  `attn_cp_size` (`arg_groups/parallel_hook.py` `handle_context_parallelism`: "The tp_size is the
  world size"), so tpplan's TP8 x CP4 is `--tp-size 32 --attn-cp-size 4`; the MoE layers are
  sharded over the whole `--tp-size` group (`model_executor/model_runner_components/moe_ep_setup.py`:
  `moe_tp_size = tp_size // moe_ep_size // moe_dp_size`), not over a TP group per CP rank as tpplan's
  CP deployment prices them; `--cp-strategy` must be set when `--enable-prefill-cp` is (same hook).
  The model files that import `sglang.srt.layers.cp` (the token split) in 0.5.23: `deepseek_v2.py`
  (DeepSeek-V2/V3, Kimi-K2), `deepseek_v4*.py`, `glm5_next.py`, `muse_spark.py`, `qwen4_exp.py`;
  `kimi_k3.py` has only decode CP (`prepare_context_parallel_metadata_for_dcp`), so the prefill-CP
  flags do not shard Kimi-K3's prefill tokens.
- vLLM: `--prefill-context-parallel-size` (`vllm/engine/arg_utils.py` `EngineArgs`, the parallel
  group), with `world_size = pipeline_parallel_size x tensor_parallel_size x
  prefill_context_parallel_size` (`vllm/config/parallel.py` `ParallelConfig.__post_init__`), so TP8 x
  CP4 is `--tensor-parallel-size 8 --prefill-context-parallel-size 4`. Every attention layer's
  backend must support PCP or the worker stops on an assertion (`vllm/v1/worker/cp_utils.py`
  `check_attention_cp_compatibility`); MLA implementations do (`MLAAttentionImpl.supports_pcp = True`,
  `vllm/v1/attention/backend.py`), every other implementation keeps `AttentionImpl.supports_pcp =
  False` (softmax GQA, and the linear-attention layers: `MambaBase` is an `AttentionLayerBase`,
  `model_executor/layers/mamba/abstract.py`). Without decode CP the KV cache is replicated over the
  PCP ranks (`ParallelConfig.pcp_shard_decode_requests`'s docstring: "PCP-only execution replicates
  the KV cache").
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.engines import sglang, vllm
from tpplan.engines.overlap import OVERLAPS
from tpplan.engines.schema import Source


def _sgl(path: str, function: str) -> Source:
    return Source(sglang.REPO, f"python/sglang/srt/{path}", function, sglang.REL)


def _vllm(path: str, function: str) -> Source:
    return Source(vllm.REPO, f"vllm/{path}", function, vllm.REL)


@dataclass(frozen=True)
class PrefillCp:
    """One engine's prefill context parallelism: its flags, the model classes it runs for, and what
    differs from tpplan's CP deployment (`tpplan.layout.context_parallel`)."""

    engine: str  # "SGLang 0.5.23"
    flags_source: Source
    model_types: tuple[str, ...] | None  # tpplan model types whose prefill it splits (None: decided per layer)
    mla_only: bool  # every attention layer must be MLA (vLLM's backend check)
    unwired: str  # what happens for another model, in the engine's terms
    unwired_source: Source
    differences: tuple[str, ...]  # where the engine's CP is not tpplan's priced CP

    def runs(self, model_type: str, all_mla: bool) -> bool:
        if self.mla_only:
            return all_mla
        return self.model_types is None or model_type in self.model_types


SGLANG_PREFILL_CP = PrefillCp(
    engine=f"SGLang {sglang.REL.split()[0]}",
    flags_source=_sgl("arg_groups/fields/parallel.py", "attn_cp_size, enable_prefill_cp, cp_strategy"),
    model_types=("deepseek_v2", "deepseek_v3", "kimi_k2"),
    mla_only=False,
    unwired="its forward never splits the prefill tokens (the model file does not import sglang.srt.layers.cp)",
    unwired_source=_sgl("models/kimi_k3.py", "prepare_context_parallel_metadata_for_dcp (decode CP only)"),
    differences=(
        "--tp-size is the world size (TP x CP) and the MoE layers are sharded over all of it "
        f"({_sgl('model_executor/model_runner_components/moe_ep_setup.py', 'moe_tp_size').cite()}), "
        "where tpplan's CP deployment holds a TP-wide copy of the MoE weights per CP group",
    ),
)

VLLM_PREFILL_CP = PrefillCp(
    engine=f"vLLM {vllm.REL.split()[0]}",
    flags_source=_vllm("engine/arg_utils.py", "EngineArgs.prefill_context_parallel_size"),
    model_types=None,
    mla_only=True,
    unwired="the worker stops on an assertion: a non-MLA attention backend does not support PCP",
    unwired_source=_vllm("v1/worker/cp_utils.py", "check_attention_cp_compatibility"),
    differences=(
        "without decode CP the KV cache is replicated over the PCP ranks "
        f"({_vllm('config/parallel.py', 'ParallelConfig.pcp_shard_decode_requests').cite()}), "
        "where tpplan keeps 1/CP of it per rank",
    ),
)

PREFILL_CP = {"SGLang": SGLANG_PREFILL_CP, "vLLM": VLLM_PREFILL_CP}


@dataclass(frozen=True)
class DeploymentFlags:
    """The launch flags one engine takes for a deployment, or why none realise it."""

    engine: str
    args: tuple[str, ...]  # empty: no engine flag realises it
    why: str  # what is missing or different ("" when the flags realise it as priced)
    source: str  # the citation behind the CP and overlap parts
    replicas: int = 1  # separate servers, each launched with `args` (a router in front splits the requests)

    @property
    def realised(self) -> bool:
        return bool(self.args)

    def text(self) -> str:
        if not self.args:
            return f"{self.engine}: no engine flag ({self.why})"
        tail = f" ({self.why})" if self.why else ""
        each = f"{self.replicas} servers, each " if self.replicas > 1 else ""
        return f"{self.engine}: {each}`{' '.join(self.args)}`{tail}"


def deployment_flags(
    engine: str,
    model_type: str,
    all_mla: bool,
    tp: int,
    pp: int,
    cp: int,
    overlap: str | None = None,
    replicas: int = 1,
) -> DeploymentFlags:
    """`engine` ("SGLang" or "vLLM")'s flags for TP `tp` x CP `cp` x PP `pp` (and a micro-batch
    overlap `tbo`/`dbo`) on a model of `model_type` (`all_mla`: every attention layer is MLA); `replicas`
    separate servers of it (the router that splits the requests between them is not read here)."""
    cp_rec = PREFILL_CP[engine]
    cites: list[str] = []
    why: list[str] = []
    if engine == "SGLang":
        args = [f"--tp-size {tp * cp}"]
        if cp > 1:
            args += [f"--attn-cp-size {cp}", "--enable-prefill-cp", "--cp-strategy zigzag"]
        if pp > 1:
            args.append(f"--pp-size {pp}")
    else:
        args = [f"--tensor-parallel-size {tp}"]
        if cp > 1:
            args.append(f"--prefill-context-parallel-size {cp}")
        if pp > 1:
            args.append(f"--pipeline-parallel-size {pp}")
    if cp > 1:
        cites.append(cp_rec.flags_source.cite())
        if not cp_rec.runs(model_type, all_mla):
            return DeploymentFlags(cp_rec.engine, (), f"{cp_rec.unwired}; {cp_rec.unwired_source.cite()}",
                                   cp_rec.unwired_source.cite())  # fmt: skip
        why += list(cp_rec.differences)
    if overlap is not None:
        ov = OVERLAPS[overlap]
        if not ov.engine.startswith(engine):
            return DeploymentFlags(cp_rec.engine, (), f"{' '.join(ov.flags)} is {ov.engine}'s",
                                   ov.schedule_source.cite())  # fmt: skip
        refused = ov.refusal(model_type)
        if refused is not None:
            return DeploymentFlags(cp_rec.engine, (), refused, ov.schedule_source.cite())
        args += list(ov.flags)
        cites.append(ov.schedule_source.cite())
    return DeploymentFlags(cp_rec.engine, tuple(args), "; ".join(why), "; ".join(cites), replicas)


__all__ = ["PREFILL_CP", "SGLANG_PREFILL_CP", "VLLM_PREFILL_CP", "DeploymentFlags", "PrefillCp", "deployment_flags"]
