"""vLLM at an older main revision that still had the sequence-parallelism compile pass (read through the code
index, `tpplan/engines/vllm.py` `VLLM_SP_PASS`); the rest reuses 0.33.0's reading unchecked, and its
scheduler, KV sizing and P/D hand-off were not read (None)."""

from __future__ import annotations

from tpplan.engines.releases.vllm_0_33_0 import VLLM_0_33_0
from tpplan.engines.schema import EngineVersion
from tpplan.engines.vllm import VLLM_SP_PASS

VLLM_OLDER = EngineVersion(
    engine="vLLM",
    version="main@000fc94b",
    released="an older main revision with the sequence-parallelism pass, read through the code index",
    launcher="vllm serve {model}",
    modes=(VLLM_0_33_0.modes[0], VLLM_SP_PASS, VLLM_0_33_0.modes[2]),
    pipeline=VLLM_0_33_0.pipeline,
    notes=("MoE SP, DP+EP and the PP scheduler were read in 0.33.0 only; this revision reuses them unchecked",),
)

RELEASES = (VLLM_OLDER,)
