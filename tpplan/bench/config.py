"""What a `tpplan bench` run is given, checked before any rank starts, and the vocabulary its results use.

`BenchConfig` travels to every rank (picklable). `check_inputs` fails fast with one line (exit 2)
on a bad model, plan, workload or topology, so no process group is formed for a run that cannot
succeed. The names here (dtype short names, collective short names, op categories, the targets)
are used by the results, the checks and the markdown alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpplan.bench.host_ahead import MODES
from tpplan.bench.model_slice import ModelSlice, build_slice
from tpplan.cost.workload import Workload, check_priceable, load_workload
from tpplan.errors import TpplanError

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology

DTYPE_SHORT = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8",
}
SHORT = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "all_to_all": "A2A", "send_recv": "P2P"}
# Targets of issue 5 (docs/benchmarks.md).
TARGET_COLLECTIVE_MEDIAN = 0.05
TARGET_LAYER = 0.10
TARGET_OVERHEAD = 0.03
TARGET_BATCH = 0.05  # batch totals, and one pass's predicted GPU time against its measured busy time
TARGET_SAVING = 0.90


@dataclass(frozen=True)
class BenchConfig:
    """Everything a run needs; picklable, sent to every rank."""

    model: str
    plans: tuple[str, ...]
    workload: str
    topology: str = "h200x2-calibrated"
    layers: str | None = None
    experts: int | None = None  # None: as many as fit (GPU), the model's (CPU)
    tokens: int | None = None  # override the workload's prompt length
    chunk: int | None = None  # override the workload's chunk size
    requests: int | None = None  # override the workload's number of requests
    iters: int = 2
    warmup: int = 2
    direct_iters: int = 20
    backend: str = "auto"
    nproc: int = 2
    dtype: str | None = None  # None: bf16 with NCCL, fp32 with gloo
    kernels: str = "fast"  # fast | reference (see bench.serving_kernels)
    overhead: bool = False  # one more pass without probe events and one profiled (bench.overhead)
    timing: str = "as-issued"  # as-issued | host-ahead (bench.host_ahead; CPU runs are synchronous either way)
    target_topology: str | None = None
    target_nodes: int | None = None
    seed: int = 0
    timeout_s: float = 600.0
    progress: bool = True
    command: str = "tpplan bench"


# ----------------------------------------------------------------------------------------------
# Input checks (parent process, before any rank starts)


def resolved_workload(cfg: BenchConfig, base: Workload | None = None) -> Workload:
    """The workload (`base`, or `cfg.workload` loaded) with --tokens/--chunk/--requests applied."""
    wl = base if base is not None else load_workload(cfg.workload)
    upd: dict[str, Any] = {}
    if cfg.tokens is not None:
        if cfg.tokens < 1:
            raise TpplanError(f"tokens={cfg.tokens}", "must be at least 1", "pass a positive prompt length")
        upd.update(input_len=cfg.tokens, input_lens=None)
    if cfg.chunk is not None:
        if cfg.chunk < 1:
            raise TpplanError(f"chunk={cfg.chunk}", "must be at least 1", "pass a positive chunk size")
        upd["chunk_size"] = cfg.chunk
    if cfg.requests is not None:
        if cfg.requests < 1:
            raise TpplanError(f"requests={cfg.requests}", "must be at least 1", "pass a positive count")
        upd["num_requests"] = cfg.requests
    if not upd:
        return wl
    where = "--tokens/--chunk/--requests"
    return check_priceable(wl.with_overrides(where, **upd), where)


def act_dtype(cfg: BenchConfig, backend: str) -> str:
    """Activation/weight dtype name: bf16 on NCCL, fp32 on gloo (CPU), unless given."""
    name = cfg.dtype or ("bf16" if backend == "nccl" else "fp32")
    if name not in ("bf16", "fp16", "fp32"):
        raise TpplanError(f"dtype={name}", "unsupported", "use bf16, fp16 or fp32")
    return name


def _check_target(cfg: BenchConfig) -> None:
    """target_nodes sizes target_topology: refused without it (it was ignored) and below one node."""
    if cfg.target_nodes is None:
        return
    if cfg.target_topology is None:
        raise TpplanError(f"target_nodes={cfg.target_nodes}", "sizes the target topology, and none is given",
                          "add target_topology= or drop target_nodes=")  # fmt: skip
    if cfg.target_nodes < 1:
        raise TpplanError(f"target_nodes={cfg.target_nodes}", "must be at least 1", "pass a node count")


def _target_topology(cfg: BenchConfig) -> Topology | None:
    """The target topology; its errors name target_topology (the loader names the topology option)."""
    from tpplan.cost.topology import load_topology

    if cfg.target_topology is None:
        return None
    try:
        return load_topology(cfg.target_topology, cfg.target_nodes)
    except TpplanError as err:
        where = err.where.replace("--topology ", "target_topology=", 1)
        raise TpplanError(where, err.reason, err.fix) from None


def check_inputs(cfg: BenchConfig, world: int) -> tuple[Workload, ModelSlice]:
    """Fail fast (TpplanError, exit 2) on a bad model, plan, workload or topology; nothing runs."""
    from tpplan.audit import audit_plan
    from tpplan.cost.topology import load_topology
    from tpplan.plans.named import make_plan

    if not cfg.plans:
        raise TpplanError("plan=", "no plan given", "pass plan=NAME (repeatable)")
    if cfg.iters < 1 or cfg.warmup < 0:
        raise TpplanError("iters=/warmup=", "iters must be >= 1 and warmup >= 0", "pass sensible counts")
    if cfg.direct_iters < 1:
        raise TpplanError(f"direct_iters={cfg.direct_iters}", "must be at least 1", "pass calls per replay")
    if not 0 < cfg.timeout_s < float("inf"):  # else every rank fails in gloo/NCCL's setup (nan, 0, -1)
        raise TpplanError(f"timeout_s={cfg.timeout_s:g}", "must be a positive number of seconds", "pass e.g. 600")
    _check_target(cfg)
    if cfg.kernels not in ("fast", "reference"):
        raise TpplanError(f"kernels={cfg.kernels}", "unknown kernel set", "use fast or reference")
    if cfg.timing not in MODES:
        raise TpplanError(f"timing={cfg.timing}", "unknown timing mode", "use " + " or ".join(MODES))
    wl = resolved_workload(cfg)
    topo = load_topology(cfg.topology)
    target = _target_topology(cfg)
    if world > topo.world_size:
        raise TpplanError(
            f"topology={cfg.topology}",
            f"has {topo.world_size} GPUs, the run uses {world} ranks",
            "predict on a topology with at least as many GPUs (e.g. a calibrated one from `tpplan calibrate`)",
        )
    sl = build_slice(cfg.model, cfg.layers, cfg.experts)
    for name in cfg.plans:
        plan = make_plan(name, sl.graph, world)
        pa = audit_plan(sl.graph, plan, world, "fp32")
        if not pa.legal:
            first = pa.violations[0].sentence()
            raise TpplanError(
                f"plan={name} (TP{world})",
                f"the audit calls this plan illegal: {first}",
                "bench legal plans only (`tpplan audit` lists them)",
            )
    if target is not None:  # the whole model must take every plan at the target's TP size
        for name in cfg.plans:
            pa = audit_plan(sl.full, make_plan(name, sl.full, target.world_size), target.world_size, "bf16")
            if not pa.legal:
                raise TpplanError(
                    f"plan={name} target_topology={cfg.target_topology}",
                    f"illegal for the whole model at TP{target.world_size}: {pa.violations[0].sentence()}",
                    "pick another target topology or drop target_topology=",
                )
    if cfg.experts is not None and sl.experts is not None and sl.experts % world:
        raise TpplanError(f"experts={cfg.experts}", f"must be divisible by the {world} ranks", "pick a multiple")
    return wl, sl


def op_category(op_kind: str, predicted_category: str) -> str:
    """The schema's categories: elementwise ops split into norm and other."""
    if predicted_category != "elementwise":
        return predicted_category
    return "norm" if op_kind in ("NORM", "HEAD_NORM", "ATTN_RES") else "other"


def op_kind_name(graph: Any, layer_kind: str, op: str) -> str:
    """The graph op's kind name; "LAYOUT" for the runtime's layout copies (`pack:<value>`, `unpack:<value>`)."""
    return next((o.kind.name for o in graph.kinds[layer_kind].ops if o.name == op), "LAYOUT")


def impl_class(graph: Any, layer_kind: str, op: str) -> str:
    """Which kernel family runs an op (the key of a run's implementation map, `worker.implementations`):
    gemm, mla, gqa, kda, gdn, short_conv, experts, norm, attn_res, layout (a copy beside a collective) or other."""
    o = next((x for x in graph.kinds[layer_kind].ops if x.name == op), None)
    if o is None:
        return "layout"
    kind = o.kind.name
    if kind in ("LINEAR", "ROUTER"):
        return "gemm"
    if kind == "TOKEN_MIX":
        return str(o.attrs.get("impl", "other"))  # mla, gqa, kda, gdn, short_conv
    return {"EXPERTS": "experts", "NORM": "norm", "HEAD_NORM": "norm", "ATTN_RES": "attn_res"}.get(kind, "other")


def kernel_impls(graph: Any, op_impls: Iterable[tuple[str, str, str | None]]) -> dict[str, str]:
    """Kernel family -> implementation, from (layer kind, op, implementation) of a run's measured ops:
    the map a recorded run is priced with (`KernelPricer.impls`: a physical kernel model prices an op only
    if it ran the kernel the model was fitted on). `build_results` and `repredict_one` both build it
    here, so a run's prediction at run time equals its re-prediction."""
    out: dict[str, str] = {}
    for layer_kind, op, impl in op_impls:
        if impl:
            out.setdefault(impl_class(graph, layer_kind, op), impl)
    return out
