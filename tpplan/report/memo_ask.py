"""What a memo is asked: `tpplan report`'s options, typed, built once by the CLI (`commands/report.py`) and
read by `analysis.analyse` (issue 30: one typed input instead of 28 keyword options).

The deployment part is the search's own `MeshAsk` (`--tp/--pp/--cp/--replicas/--cp-layers/--cp-kv`), because
the memo searches what `tpplan search` does with the same options; the server settings the engines' gates
read but the memo does not search sit in `ServerSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpplan.layout.plan import OverlapName
from tpplan.report.prompt_length import PROMPT_LENGTHS
from tpplan.search.grid import MeshAsk

if TYPE_CHECKING:
    from tpplan.bench_results import BenchResults
    from tpplan.simulate.serving import Arrival


@dataclass(frozen=True)
class ServerSettings:
    """Settings the server runs with that the engines' gates read (not searched): SGLang's prefill
    context-parallel size (`--prefill-cp`) and vLLM's data-parallel size (`--dp`)."""

    prefill_cp: int = 1
    data_parallel: int = 1


@dataclass(frozen=True)
class MemoAsk:
    """One memo's question. `deployment`: the search's grid (`tpplan search`'s options; its `tp`, when given,
    is the memo's main TP, else a saved plan's or the whole topology). `plans`: the plans to compare (empty:
    every named plan and those the engines run on the model class); `current`: today's deployment, the
    reference of every verdict. `memory_cap_gib` as `tpplan search --memory-cap`; `engines`: the `--engine`
    versions (empty: each engine's current release; the first names the deployed one); `overlap`,
    `dp_attention` and `redundant_experts` shape the search as there. `arrival`: the serving loop's arrival
    process (None: each workload's closed loop). `bench`: measured results to set beside the predictions.
    `search_top`: how many of the search's plans join (0: no search); `prompt_lengths` the lengths each
    deployment's plan is priced at (None: not); `crossover_tokens` the token counts of the thresholds (None: the
    default)."""

    deployment: MeshAsk = field(default_factory=MeshAsk)
    dtype: str = "bf16"
    expert_dtype: str | None = None
    plans: tuple[str, ...] = ()
    current: str = "baseline"
    memory_cap_gib: float | str | None = "serving"
    engines: tuple[str, ...] = ()
    overlap: OverlapName | None = None
    dp_attention: bool = False
    redundant_experts: int = 0  # copies beside the experts in the search's EP plans (`tpplan search` option)
    server: ServerSettings = field(default_factory=ServerSettings)
    arrival: Arrival | None = None
    bench: BenchResults | None = None
    search_top: int = 1
    prompt_lengths: tuple[int, ...] | None = PROMPT_LENGTHS
    crossover_tokens: tuple[int, ...] | None = None

    @property
    def engine_list(self) -> list[str] | None:
        """`engines` as the engine lookups take it (None: the defaults)."""
        return list(self.engines) or None
