"""The launch flags of a deployment, as each engine spells them: TP x CP x PP (x R replicas, and a
micro-batch overlap), or why no engine flag realises it. The memo's deployment rows quote them.

The engines' CP paths themselves (what is gathered, KV per rank, gates, open PRs) are
`tpplan.engines.context_parallel` (`CP_PATHS`); this module adds what a launch line needs, read in
the release wheels (SGLang 0.5.23, vLLM 0.33.0 and 0.34.0), paths as in the repositories:

- SGLang: `--tp-size` is the world size under CP and must be divisible by `attn_cp_size`
  (`python/sglang/srt/arg_groups/parallel_hook.py` `handle_context_parallelism`: "The tp_size is
  the world size"), so tpplan's TP8 x CP4 is `--tp-size 32 --attn-cp-size 4`; the flags are the
  `attn_cp_size`, `enable_prefill_cp` and `cp_strategy` fields (`arg_groups/fields/parallel.py`). The
  model files that import `sglang.srt.layers.cp` (the token split) in 0.5.23 are `deepseek_v2.py`
  (DeepSeek-V2/V3, Kimi-K2), `deepseek_v4*.py`, `glm5_next.py`, `muse_spark.py`, `qwen4_exp.py`;
  `kimi_k3.py` has only decode CP (`prepare_context_parallel_metadata_for_dcp`): Kimi-K3's prefill CP
  is an open PR (`context_parallel.SGLANG_K3_FULL_SEQUENCE`).
- vLLM: `--prefill-context-parallel-size` (`vllm/engine/arg_utils.py` `EngineArgs`), with
  `world_size = pipeline_parallel_size x tensor_parallel_size x prefill_context_parallel_size`
  (`vllm/config/parallel.py` `ParallelConfig.__post_init__`), so TP8 x CP4 is
  `--tensor-parallel-size 8 --prefill-context-parallel-size 4`; MLA models only
  (`context_parallel.VLLM_PCP`'s gate).
- Replicas: the deployment's request router spreads the requests over them (`tpplan.engines.routing`): an
  in-process one adds its flags to the one server's line (SGLang's `--dp-size R`, vLLM's `--data-parallel-size
  R`), an external one (sglang-router) stands in front of R servers, each with these flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.engines import overlaps, sglang_source
from tpplan.engines.async_tp import FUSIONS, launch_flags
from tpplan.engines.context_parallel import SGLANG_ZIGZAG, VLLM_PCP, CpPath
from tpplan.engines.schema import Source
from tpplan.mesh import Mesh

SGLANG_CP_MODEL_FILES = Source(
    sglang_source.REPO,
    "python/sglang/srt/models/",
    "the model files importing sglang.srt.layers.cp (kimi_k3.py: prepare_context_parallel_metadata_for_dcp only)",
    sglang_source.REL,
)


@dataclass(frozen=True)
class PrefillCpSupport:
    """Which tpplan model types an engine's released prefill-CP path splits, and what else happens."""

    path: CpPath
    model_types: tuple[str, ...] | None  # None: decided by the attention (`mla_only`)
    mla_only: bool
    unwired: str
    unwired_source: Source

    @property
    def engine(self) -> str:
        return self.path.engine

    def runs(self, model_type: str, all_mla: bool) -> bool:
        if self.mla_only:
            return all_mla
        return self.model_types is None or model_type in self.model_types


PREFILL_CP = {
    "SGLang": PrefillCpSupport(
        SGLANG_ZIGZAG,
        ("deepseek_v2", "deepseek_v3", "kimi_k2"),
        False,
        "its forward never splits the prefill tokens (the model file does not import sglang.srt.layers.cp)",
        SGLANG_CP_MODEL_FILES,
    ),
    "vLLM": PrefillCpSupport(
        VLLM_PCP,
        None,
        True,
        f"{VLLM_PCP.gates[0].text}: the server {VLLM_PCP.gates[0].effect} the flag",
        VLLM_PCP.gates[0].source,
    ),
}


@dataclass(frozen=True)
class DeploymentFlags:
    """The launch flags one engine takes for a deployment, or why none realise it."""

    engine: str
    args: tuple[str, ...]  # empty: no engine flag realises it
    why: str  # what is missing or different ("" when the flags realise it as priced)
    source: str  # the citation behind the CP and overlap parts

    @property
    def realised(self) -> bool:
        return bool(self.args)

    def text(self) -> str:
        """One copy's flags, or why none realise it (its replicas' request router: `EngineRecipe.line`)."""
        if not self.args:
            return f"{self.engine}: no engine flag ({self.why})"
        tail = f" ({self.why})" if self.why else ""
        return f"{self.engine}: `{' '.join(self.args)}`{tail}"


def size_flags(engine: str, mesh: Mesh) -> list[str]:
    """`engine` ("SGLang" or "vLLM")'s flags for the mesh's sizes TP x CP x PP alone (SGLang's
    `--tp-size` is the world size under CP; see the module docstring); whether the engine runs that CP on a
    model is `deployment_flags`'s question."""
    tp, pp, cp = mesh.tp, mesh.pp, mesh.cp
    if engine == "SGLang":
        args = [f"--tp-size {tp * cp}"]
        if cp > 1:
            args += [f"--attn-cp-size {cp}", "--enable-prefill-cp", "--cp-strategy zigzag"]
        if pp > 1:
            args.append(f"--pp-size {pp}")
        return args
    args = [f"--tensor-parallel-size {tp}"]
    if cp > 1:
        args.append(f"--prefill-context-parallel-size {cp}")
    if pp > 1:
        args.append(f"--pipeline-parallel-size {pp}")
    return args


def deployment_flags(
    engine: str,
    model_type: str,
    all_mla: bool,
    mesh: Mesh,
    overlap: str | None = None,
    version: str | None = None,
) -> DeploymentFlags:
    """`engine` ("SGLang" or "vLLM")'s flags for the mesh's TP x CP x PP (and a micro-batch overlap
    `tbo`/`dbo`, or async TP's fused GEMMs `asynctp`) on a model of `model_type` (`all_mla`: every
    attention layer is MLA); the mesh's replicas are the recipe's (`recipes.whole_deployment`: its request router);
    `version` the engine version's key whose overlap records apply (None: the default release's)."""
    support = PREFILL_CP[engine]
    cites: list[str] = []
    why: list[str] = []
    args = size_flags(engine, mesh)
    if mesh.cp > 1:
        cites.append(support.path.sources[0].cite())
        if not support.runs(model_type, all_mla):
            reason = f"{support.unwired}; {support.unwired_source.cite()}"
            return DeploymentFlags(support.engine, (), reason, support.unwired_source.cite())
        why.append(support.path.differences[0])  # where the engine's CP is not tpplan's priced CP
    if overlap == "asynctp":  # GEMM + collective fusion: the engine's fused ops, not a micro-batch overlap
        fused = next(f for f in FUSIONS if f.engine.startswith(engine))
        realised = launch_flags(model_type, mesh)[fused.engine]
        if isinstance(realised, str):
            return DeploymentFlags(support.engine, (), realised, fused.model_gate.cite())
        args += list(realised)
        cites.append(fused.model_gate.cite())
    elif overlap is not None:
        ov = overlaps(version).get(overlap)
        if ov is None or not ov.engine.startswith(engine):
            return _not_this_engines(support.engine, overlap, version)
        refused = ov.refusal_on(model_type, mesh)
        if refused is not None:
            return DeploymentFlags(support.engine, (), refused, ov.schedule_source.cite())
        args += list(ov.flags)
        cites.append(ov.schedule_source.cite())
        if ov.runs_on and ov.runs_on_source is not None:
            why.append(f"{ov.runs_on} ({ov.runs_on_source.cite()})")
    return DeploymentFlags(support.engine, tuple(args), "; ".join(why), "; ".join(cites))


def _not_this_engines(engine: str, overlap: str, version: str | None) -> DeploymentFlags:
    """No flag: the overlap is the other engine's, or tpplan has not read it for this version."""
    ov = overlaps()[overlap]
    if not ov.engine.startswith(engine):
        return DeploymentFlags(engine, (), f"{' '.join(ov.flags)} is {ov.engine}'s", ov.schedule_source.cite())
    return DeploymentFlags(engine, (), f"tpplan's engine data has not read {' '.join(ov.flags)} for {version}", "")


__all__ = [
    "PREFILL_CP",
    "SGLANG_CP_MODEL_FILES",
    "DeploymentFlags",
    "PrefillCpSupport",
    "deployment_flags",
    "size_flags",
]
