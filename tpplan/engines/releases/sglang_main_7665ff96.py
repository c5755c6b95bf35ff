"""SGLang at an older main revision (the `layers/communicator/` package), read through the code index where
its behaviour differs from 0.5.23 (`tpplan/engines/sglang.py`); its scheduler, KV sizing and P/D hand-off
were not read (None)."""

from __future__ import annotations

from tpplan.engines.schema import EngineVersion
from tpplan.engines.sglang import PIPELINE, SGL_DP_ATTENTION, SGL_LAYERNORM_SP, older_input_scattered, older_sp_moe

SGLANG_OLDER = EngineVersion(
    engine="SGLang",
    version="main@7665ff96",
    released="an older main revision (layers/communicator/ package), read through the code index",
    launcher="python -m sglang.launch_server --model-path {model}",
    modes=(older_input_scattered(), older_sp_moe(), SGL_LAYERNORM_SP, SGL_DP_ATTENTION),
    pipeline=PIPELINE,
    notes=(
        "layernorm-SP, DP attention and the PP scheduler were read in 0.5.23 only; this revision reuses them unchecked",
        "SP-MoE: only the fused-collective gate was read at this revision (k3_sp_collective._init_state); its "
        "per-layer dataflows reuse the 0.5.23 reading unchecked",
    ),
)

RELEASES = (SGLANG_OLDER,)
