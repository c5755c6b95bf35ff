"""NVIDIA AIConfigurator's measured per-engine kernel database as a `KernelSource`.

AIConfigurator (PyPI `aiconfigurator-core`, Apache-2.0) ships tables of GEMM, context attention,
MLA, MoE, NCCL and custom all-reduce latencies measured per GPU x engine x engine version. This
module asks them through the package's own op-list API: `perf_database.get_database` loads a
database, `EngineHandle.for_database` binds its compiled query engine, and each price is one op
(`GEMM`, `ContextAttention`, `ContextMLA`, `MoE`, `NCCL`, `CustomAllReduce`) serialised with
`build_ops_json` and evaluated by `EngineHandle.evaluate_ops_json` (the path
`aiconfigurator_core/sdk/operations/README.md` names as canonical in 0.12.0). The raw table views
the package binds (`PerfDatabase._<family>_data`, its documented data plane) are read only to know
the measured range, so an answer can say whether it left it, and only once per database: their axes
are kept in the answer file (`aic_axes`, `aic_cache`).

`aiconfigurator_core` is imported lazily: this module imports without it, `aic_available()` says
whether it is there, and constructing an `AicSource` without it is a one-line TpplanError.

What an answer means:
- None: the database has no row for this configuration (another dtype, MoE widths/experts/TP/EP it
  never measured, an attention head_dim/kv-head/window layout it lacks, a multi-node or unmeasured
  group size, send/recv), or the query lies more than `FAR` (4x) beyond the measured range of a
  size axis (GEMM m/n/k, tokens, message bytes). The next source (the fitted models) then answers.
- `extrapolated=True`: the query is inside 4x but outside the measured range of an axis, the
  attention call has cached context (the tables are measured without a prefix), the table lacks
  the weight format and another's rows stood in (block-scaled fp8 for per-tensor fp8 or the
  reverse; the price's name says so: `kernel_source.stand_in`), or the engine reported a non-silicon
  provenance. Points between measured grid points are interpolated by the engine and count as
  measured.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, wraps
from typing import Any, Literal

from tpplan.cost.kernel_source import (
    AttentionShape,
    CollectiveShape,
    GemmShape,
    KernelPrice,
    MoeShape,
    stand_in,
)
from tpplan.cost.sources.aic_axes import axis_key, build_axes, keys, outside, reach
from tpplan.cost.sources.aic_cache import answer_file
from tpplan.cost.sources.aic_log import _FALLBACKS, route_aic_logging
from tpplan.errors import TpplanError

AIC_ENGINES = ("sglang", "vllm", "trtllm")
AIC_VERSION = "0.12.0"
FAR = 4.0  # beyond this factor outside a measured size range a query gets no answer
INSTALL_FIX = 'pip install "tpplan[aic]"'

# tpplan's short GPU names for AIC's system names (AIC's own names are accepted as they are).
SYSTEM_ALIASES = {
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "rtxpro6000": "rtx_pro_6000_server",
    "rtx_pro_6000": "rtx_pro_6000_server",
}

MoeDistribution = Literal["balanced", "power_law_1.01", "power_law_1.2"]
AllReducePath = Literal["engine", "nccl"]
TableFamily = Literal["gemm", "context_attention", "context_mla", "moe", "nccl", "custom_allreduce"]

# tpplan dtype -> AIC quant names of that format, then rows that stand in where a table lacks it
# (the price then names the stand-in and counts as extrapolated: `kernel_source.stand_in`).
_GEMM_QUANT = {
    "bf16": (("bfloat16",), ()),
    "fp8": (("fp8",), ("fp8_block",)),  # per-tensor (or per-channel) scales
    "fp8_block": (("fp8_block",), ("fp8",)),  # DeepSeek-style 128x128 block scales
    "nvfp4": (("nvfp4",), ()),
    "int4": (("int4_wo",), ()),
    "mxfp4": ((), ()),
}
_MOE_QUANT = {
    "bf16": (("bfloat16",), ()),
    "fp8": (("fp8",), ("fp8_block",)),
    "fp8_block": (("fp8_block",), ("fp8",)),
    "nvfp4": (("nvfp4", "w4a16_nvfp4", "nvfp4_wo"), ()),
    "mxfp4": (("w4a8_mxfp4_mxfp8", "w4a16_mxfp4"), ()),
    "int4": (("int4_wo",), ()),
}
_NCCL_OP = {
    "all_reduce": "all_reduce",
    "reduce_scatter": "reduce_scatter",
    "all_gather": "all_gather",
    "all_to_all": "alltoall",
}
_COMM_BYTES = 2  # AIC's comm tables count half-precision elements
_MEASURED = ("silicon", "mixed")  # AIC provenances that rest on its measured rows


def aic_available() -> bool:
    """Whether `aiconfigurator-core` is importable (the optional extra `tpplan[aic]`)."""
    if "aiconfigurator_core" in sys.modules:
        return sys.modules["aiconfigurator_core"] is not None  # None: imports of it are blocked
    try:
        return importlib.util.find_spec("aiconfigurator_core") is not None
    except (ImportError, ValueError):
        return False


def _require_aic(what: str) -> None:
    if not aic_available():
        raise TpplanError(what, "needs the AIConfigurator kernel database, which is not installed", INSTALL_FIX)
    route_aic_logging()


def resolve_system(system: str) -> str:
    """AIC's system name for `system` (an AIC name or one of `SYSTEM_ALIASES`)."""
    return SYSTEM_ALIASES.get(system, system)


@cache
def aic_databases() -> dict[str, dict[str, list[str]]]:
    """{system: {engine: [queryable versions]}} the installed package holds (no table is loaded;
    kept in the answer cache, `aic_cache`, since listing them takes seconds)."""
    _require_aic("AIC database list")
    listing = answer_file("databases")
    held, found = listing.get("supported")
    if not held:
        from aiconfigurator_core.sdk import perf_database

        raw = perf_database.get_supported_databases()
        found = {s: {e: list(v) for e, v in sorted(raw[s].items())} for s in sorted(raw)}
        listing.put("supported", found)
    return found


def system_tables(system: str) -> dict[str, list[str]] | None:
    """{engine: [versions]} of the kernel tables the installed AIConfigurator holds for `system`
    ({} where it ships none, as for h100_pcie and l4 in 0.12.0); None when it is not installed."""
    if not system or not aic_available():
        return None
    return aic_databases().get(resolve_system(system), {})


@cache
def default_version(system: str, engine: str) -> str | None:
    """The version AIC itself serves by default for (system, engine): its 'current' slot, the
    newest maintainer-completed collection (a newer 'next' slot, when listed, is a partial drop
    backward-filled from current; ask for it by name)."""
    _require_aic("AIC default version")
    system = resolve_system(system)
    listing = answer_file("databases")
    known, version = listing.get(f"default:{system}/{engine}")
    if known:
        return version
    from aiconfigurator_core.sdk import perf_database

    held = aic_databases().get(system, {}).get(engine, [])
    slots = perf_database.get_version_slots(system, engine)  # cheap: AIC's query_versions.yaml
    if slots is not None and slots.get("current") in held:
        version = slots["current"]
    else:
        version = perf_database.get_latest_database_version(system, engine)  # lists every database again
    listing.put(f"default:{system}/{engine}", version)
    return version


@dataclass
class _Loaded:
    db: Any
    handle: Any
    load_s: float


@cache
def _load(system: str, engine: str, version: str) -> _Loaded:
    """Load one database and bind its query engine once per process (about 0.5 s; each op
    family's tables load on first use, 0.5-3 s more)."""
    from aiconfigurator_core.sdk import perf_database
    from aiconfigurator_core.sdk.engine import EngineHandle

    t0 = time.perf_counter()
    db = perf_database.get_database(system, engine, version)
    if db is None:
        raise TpplanError(
            f"AIC database {system}/{engine}@{version}",
            "the package could not load it",
            f"use a version listed by tpplan.cost.sources.aic.aic_databases() ({INSTALL_FIX} for 0.12)",
        )
    handle = EngineHandle.for_database(db)
    return _Loaded(db, handle, time.perf_counter() - t0)


Shape = GemmShape | AttentionShape | MoeShape | CollectiveShape
_Query = Callable[["AicSource", Any], "KernelPrice | None"]


def _remembered(query: _Query) -> _Query:
    """`query` answered from the on-disk answer cache where it holds the question, else asked of
    the database and the answer (or its absence) kept, with any fallback tables loading it logged."""

    @wraps(query)
    def ask(self: AicSource, shape: Any) -> KernelPrice | None:
        key = f"{query.__name__}|{self.moe_distribution}|{self.all_reduce}|{int(self.attention_extras)}|{shape!r}"
        held, answer = self._answers.get(key)
        if held:
            return None if answer is None else KernelPrice(float(answer[0]), str(answer[1]), bool(answer[2]))
        before = set(_FALLBACKS)
        price = query(self, shape)
        logged = {t: f for t, f in _FALLBACKS.items() if t not in before}
        self._answers.put(key, None if price is None else [price.seconds, price.source, price.extrapolated], logged)
        return price

    return ask


class AicSource:
    """Prices from AIConfigurator's database for one GPU system, engine and engine version.

    `system`: an AIC system name (`aic_databases()` lists them: h100_sxm, h200_sxm, b200_sxm,
    b300_sxm, gb200, gb300, rtx_pro_6000_server, ...) or a `SYSTEM_ALIASES` short name.
    `engine`: sglang, vllm or trtllm. `version`: default `default_version(system, engine)`.
    `moe_distribution`: the routed-token distribution of the MoE rows used (AIC measures balanced
    and power-law 1.01 / 1.2 routing; tpplan prices uniform routing, so balanced by default).
    `all_reduce`: "engine" prices an all-reduce with AIC's `CustomAllReduce` op (the TP all-reduce
    its models charge; the engine's own kernel choice), "nccl" with the plain NCCL table.
    `attention_extras`: AIC's context-attention op adds RoPE and the KV-cache write (~13 us on H200)
    to the measured kernel; False (default) returns the kernel alone, since tpplan prices those ops
    apart.
    """

    def __init__(
        self,
        system: str = "h200_sxm",
        engine: str = "sglang",
        version: str | None = None,
        *,
        moe_distribution: MoeDistribution = "balanced",
        all_reduce: AllReducePath = "engine",
        attention_extras: bool = False,
    ) -> None:
        _require_aic(f"kernel source aic:{system}/{engine}")
        self.system = resolve_system(system)
        known = aic_databases()
        if self.system not in known:
            raise TpplanError(
                f"AIC system {system!r}",
                f"AIConfigurator {AIC_VERSION} holds no kernel tables for this GPU system",
                f"drop engine=, or use a GPU model whose system has tables ({', '.join(known)}; `tpplan gpus`)",
            )
        if engine not in known[self.system]:
            raise TpplanError(
                f"AIC engine {engine!r}",
                f"{self.system} has no data for it",
                f"use one of {', '.join(known[self.system])}",
            )
        self.engine = engine
        versions = known[self.system][engine]
        self.version = version or default_version(self.system, engine) or versions[-1]
        if self.version not in versions:
            raise TpplanError(
                f"AIC version {engine}@{self.version}",
                f"{self.system} does not hold it",
                f"use one of {', '.join(versions)}",
            )
        self.moe_distribution = moe_distribution
        self.all_reduce = all_reduce
        self.attention_extras = attention_extras
        self.name = f"aic:{self.system}/{self.engine}@{self.version}"
        self._answers = answer_file(f"{self.system}-{self.engine}-{self.version}")
        for table, path in self._answers.fallbacks.items():  # what loading its tables logged, when they were
            _FALLBACKS.setdefault(table, path)

    @property
    def _loaded(self) -> _Loaded:
        """The database and its query engine, loaded on the first question the answer cache lacks."""
        return _load(self.system, self.engine, self.version)

    @property
    def load_seconds(self) -> float:
        """Seconds the database load and engine bind took (once per process)."""
        return self._loaded.load_s

    # ---- the package's query path ---------------------------------------------------------

    def _evaluate(self, op: Any, *, batch: int, tokens: int, prefix: int = 0) -> tuple[float, bool] | None:
        """(seconds, non-silicon) for one op, or None where the engine refuses the query."""
        from aiconfigurator_core.sdk.engine import build_ops_json

        handle = self._loaded.handle
        try:
            rows = handle.evaluate_ops_json(
                build_ops_json([op]), is_context=True, batch_size=int(batch), s=int(tokens), prefix=int(prefix)
            )
        except Exception:  # the engine raises for shapes its tables cannot serve
            return None
        if not rows:
            return None
        _, latency_ms, _, provenance = rows[0]
        if not math.isfinite(latency_ms) or latency_ms <= 0:
            return None
        # "mixed": a measured kernel plus a modelled part (AIC adds ~13 us to context attention)
        non_silicon = provenance not in _MEASURED or handle.last_provenance() not in (None, "silicon")
        return latency_ms * 1e-3, non_silicon

    def table(self, family: TableFamily) -> Any:
        """AIC's raw measured rows of one op family as the package binds them, or None: nested
        mappings ending in {"latency": ms, ...}, keyed (quant enums first, by their `.name`)
        gemm: quant, m, n, k; context_attention: fmha quant, kv quant, kv heads (0 = as many as
        q heads), head_dim, window, heads, tokens, batch; context_mla: fmha quant, kv quant, heads,
        tokens, batch; moe: quant, distribution, top_k, experts, hidden, intermediate, tp, ep,
        tokens; nccl: comm quant, op, GPUs, half elements; custom_allreduce: quant, GPUs, "AUTO",
        half elements."""
        from aiconfigurator_core.sdk import operations as ops

        op_class, attr = {
            "gemm": (ops.GEMM, "_gemm_data"),
            "context_attention": (ops.ContextAttention, "_context_attention_data"),
            "context_mla": (ops.ContextMLA, "_context_mla_data"),
            "moe": (ops.MoE, "_moe_data"),
            "nccl": (ops.NCCL, "_nccl_data"),
            "custom_allreduce": (ops.CustomAllReduce, "_custom_allreduce_data"),
        }[family]
        return self._view(op_class, attr)

    def _view(self, op_class: Any, attr: str) -> Any:
        db = self._loaded.db
        op_class.load_data(db)
        view = getattr(db, attr, None)
        return view if view is not None and keys(view) else None

    def _axes(self, family: TableFamily) -> dict[str, Any]:
        """The measured axes of one op family's table (`aic_axes`): from the answer file, else read
        once from the engine's view of the table (the rows `table` returns, without the op class's
        load of its sibling tables and deep copy, which cost seconds more) and kept there, with the
        fallback tables its loading logged."""
        held, axes = self._answers.get(f"axes:{family}")
        if held:
            return dict(axes)
        from aiconfigurator_core.sdk.engine_table_view import fetch_table_view

        before = set(_FALLBACKS)
        rows = fetch_table_view(self._loaded.db, f"_{family}_data")  # what `table` binds, without its copies
        axes = build_axes(family, rows if rows is not None and keys(rows) else None)
        self._answers.put(f"axes:{family}", axes, {t: f for t, f in _FALLBACKS.items() if t not in before})
        return axes

    def _price(self, seconds: float, extrapolated: bool, detail: str = "") -> KernelPrice:
        return KernelPrice(seconds, self.name + (f":{detail}" if detail else ""), extrapolated)

    @staticmethod
    def _pick(held: list[str] | dict[str, Any], names: tuple[str, ...]) -> str | None:
        """The first of `names` (a weight format, in order of preference) that a table holds."""
        return next((n for n in names if n in held), None)

    # ---- GEMM ------------------------------------------------------------------------------

    @_remembered
    def gemm(self, shape: GemmShape) -> KernelPrice | None:
        from aiconfigurator_core.sdk import common
        from aiconfigurator_core.sdk.operations import GEMM

        axes = self._axes("gemm")
        matching, stand_ins = _GEMM_QUANT.get(shape.dtype, ((), ()))
        quant = self._pick(axes, matching + stand_ins)
        if quant is None or min(shape.m, shape.k, shape.n) < 1:
            return None
        (m0, m1), (n0, n1), (k0, k1) = axes[quant]
        out = max(outside(shape.m, m0, m1), outside(shape.n, n0, n1), outside(shape.k, k0, k1))
        if out > FAR:
            return None
        op = GEMM("gemm", 1.0, int(shape.n), int(shape.k), getattr(common.GEMMQuantMode, quant))
        got = self._evaluate(op, batch=1, tokens=shape.m)
        if got is None:
            return None
        other = stand_in(quant, shape.dtype, matching)
        return self._price(got[0], got[1] or out > 1.0 or bool(other), f"gemm-{quant}{other}")

    # ---- attention -------------------------------------------------------------------------

    @_remembered
    def attention(self, shape: AttentionShape) -> KernelPrice | None:
        if shape.tokens < 1 or shape.heads < 1 or shape.batch < 1:
            return None
        if shape.kind == "mla":
            return self._mla(shape)
        return self._mha(shape)

    def _mha(self, shape: AttentionShape) -> KernelPrice | None:
        from aiconfigurator_core.sdk import common
        from aiconfigurator_core.sdk.operations import ContextAttention

        if shape.head_dim_qk != shape.head_dim_v or shape.kv_heads < 1 or shape.heads % shape.kv_heads:
            return None
        kv_key = 0 if shape.kv_heads == shape.heads else shape.kv_heads  # AIC keys MHA as 0 kv heads
        window = shape.window or 0
        axes = self._axes("context_attention").get("layouts", {}).get(axis_key(kv_key, shape.head_dim_qk, window))
        out = None if axes is None else reach(axes, shape.heads, shape.tokens, shape.batch)
        if out is None or out > FAR:
            return None
        op = ContextAttention(
            "attn",
            1.0,
            int(shape.heads),
            int(shape.kv_heads),
            common.KVCacheQuantMode.bfloat16,
            common.FMHAQuantMode.bfloat16,
            window_size=int(window),
            head_size=int(shape.head_dim_qk),
        )
        if self.engine != "trtllm":  # AIC's lane resolver knows no TRT-LLM lanes (its default lane serves)
            from aiconfigurator_core.sdk.operations.attention import resolved_lane_order_for_op

            op._lane_order = resolved_lane_order_for_op(self._loaded.db, "_context_attention_data", None)
        got = self._evaluate(op, batch=shape.batch, tokens=shape.tokens, prefix=shape.context)
        if got is None:
            return None
        seconds = got[0] if self.attention_extras else got[0] - self._attention_extras_s(shape)
        return self._price(seconds, got[1] or out > 1.0 or shape.context > 0, "context-attention")

    def _attention_extras_s(self, shape: AttentionShape) -> float:
        """The fused-op extras AIC's ContextAttention adds to the measured kernel: RoPE on q and k and
        the KV-cache write, each priced by its empirical memory-op formula (bytes / (HBM x scaling) +
        a constant per op), times 1.1. Source: aiconfigurator `aic-core/rust/aiconfigurator-core/src/
        operators/attention.rs`, `ContextAttentionOp::query` and `mem_op_latency_ms` (commit
        11ea126dc9cd3e8a25bc3a4e26b1dc5c2c81f703). The byte counts there are per token row of one
        head set, so on H200 the extras are ~13.2 us whatever the sequence length."""
        gpu = self._loaded.db.system_spec["gpu"]

        def mem_op(nbytes: float) -> float:
            return (
                nbytes / (gpu["mem_bw"] * gpu["mem_bw_empirical_scaling_factor"])
                + gpu["mem_empirical_constant_latency"]
            )

        q = shape.heads * shape.head_dim_qk
        kv = shape.kv_heads * shape.head_dim_qk
        rope = 2.0 * mem_op(q * 2.0 + kv * 2.0)
        kv_write = 2.0 * mem_op(kv * 2.0)  # bf16 FMHA: 2 bytes per element, k then v
        return 1.1 * (rope + kv_write)

    def _mla(self, shape: AttentionShape) -> KernelPrice | None:
        from aiconfigurator_core.sdk import common
        from aiconfigurator_core.sdk.operations import ContextMLA

        if (shape.head_dim_qk, shape.head_dim_v) != (192, 128) or shape.window:
            return None  # AIC's MLA kernels are DeepSeek's: 128 nope + 64 rope q/k dims, 128 v dims
        axes = self._axes("context_mla").get("axes")
        out = None if axes is None else reach(axes, shape.heads, shape.tokens, shape.batch)
        if out is None or out > FAR:
            return None
        op = ContextMLA("mla", 1.0, int(shape.heads), common.KVCacheQuantMode.bfloat16, common.FMHAQuantMode.bfloat16)
        got = self._evaluate(op, batch=shape.batch, tokens=shape.tokens, prefix=shape.context)
        if got is None:
            return None
        return self._price(got[0], got[1] or out > 1.0 or shape.context > 0, "context-mla")

    # ---- MoE -------------------------------------------------------------------------------

    def moe_tokens(self, shape: MoeShape) -> tuple[str, list[int]] | None:
        """(AIC quant name, measured token counts) for the shape's exact MoE configuration, or None
        where the database never measured it."""
        axes = self._axes("moe")
        quant = self._pick(axes.get("quants", []), sum(_MOE_QUANT.get(shape.dtype, ((), ())), ()))
        if quant is None:
            return None
        s = shape
        config = axis_key(quant, self.moe_distribution, s.top_k, s.experts, s.hidden, s.intermediate, s.tp, s.ep)
        index = axes["configs"].get(config)
        tokens = [] if index is None else axes["tokens"][index]
        return (quant, list(tokens)) if tokens else None

    @_remembered
    def moe(self, shape: MoeShape) -> KernelPrice | None:
        from aiconfigurator_core.sdk import common
        from aiconfigurator_core.sdk.operations import MoE

        found = self.moe_tokens(shape)
        if found is None or shape.tokens < 1:
            return None
        quant, tokens = found
        out = outside(shape.tokens, tokens[0], tokens[-1])
        if out > FAR:
            return None
        op = MoE(
            "moe",
            1.0,
            int(shape.hidden),
            int(shape.intermediate),
            int(shape.top_k),
            int(shape.experts),
            int(shape.tp),
            int(shape.ep),
            getattr(common.MoEQuantMode, quant),
            self.moe_distribution,
            1,
        )
        got = self._evaluate(op, batch=1, tokens=shape.tokens)
        if got is None:
            return None
        other = stand_in(quant, shape.dtype, _MOE_QUANT[shape.dtype][0])
        return self._price(got[0], got[1] or out > 1.0 or bool(other), f"moe-{quant}-{self.moe_distribution}{other}")

    # ---- collectives -----------------------------------------------------------------------

    def _comm_sizes(self, kind: str, ranks: int) -> tuple[str, list[int]] | None:
        """(op to build, [first, last] measured size in elements) for one collective kind and group size."""
        if kind == "all_reduce" and self.all_reduce == "engine":
            sizes = self._axes("custom_allreduce").get(axis_key(ranks))
            return None if sizes is None else ("custom", sizes)
        op = _NCCL_OP.get(kind)
        sizes = self._axes("nccl").get(str(op), {}).get(axis_key(ranks))
        return None if sizes is None else ("nccl", sizes)

    @_remembered
    def collective(self, shape: CollectiveShape) -> KernelPrice | None:
        from aiconfigurator_core.sdk import common
        from aiconfigurator_core.sdk.operations import NCCL, CustomAllReduce

        if shape.ranks < 2 or shape.ranks_per_node != shape.ranks or shape.nbytes <= 0:
            return None  # AIC's comm tables are single-node
        found = self._comm_sizes(shape.kind, shape.ranks)
        if found is None:
            return None
        path, sizes = found
        elements = max(1, round(shape.nbytes / _COMM_BYTES))
        out = outside(elements, sizes[0], sizes[-1])
        if elements > sizes[-1] * FAR:
            return None
        if path == "custom":
            op = CustomAllReduce("ar", 1.0, elements, int(shape.ranks))
            detail = "custom-allreduce"
        else:
            op = NCCL("nccl", 1.0, _NCCL_OP[shape.kind], elements, int(shape.ranks), common.CommQuantMode.half)
            detail = f"nccl-{_NCCL_OP[shape.kind]}"
        got = self._evaluate(op, batch=1, tokens=1)
        if got is None:
            return None
        return self._price(got[0], got[1] or out > 1.0, detail)


def engine_source(system: str, engine: str, **options: Any) -> AicSource:
    """The source for a CLI-style engine spec, `sglang`, `vllm@0.24.0`, `trtllm@1.3.0rc20`, on one
    AIC system (`options`: `AicSource`'s keywords)."""
    name, _, version = engine.partition("@")
    if name not in AIC_ENGINES:
        raise TpplanError(
            f"engine={engine!r}",
            "no such engine in the AIC database",
            f"use one of {', '.join(AIC_ENGINES)}, optionally @version",
        )
    return AicSource(system, name, version or None, **options)


__all__ = [
    "AIC_ENGINES",
    "FAR",
    "INSTALL_FIX",
    "SYSTEM_ALIASES",
    "AicSource",
    "aic_available",
    "aic_databases",
    "default_version",
    "engine_source",
    "resolve_system",
    "system_tables",
]
