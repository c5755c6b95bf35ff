"""Plans as files: what `tpplan search --save DIR` writes and every `--plan` accepts.

A plan file is a small JSON object: a schema version, the plan's decisions (everything a `Plan`
holds), the deployment it was ranked at (TP, PP, EP, MoE mode) and what it was found for (model,
its layer kinds, topology, workload, rank and score). `make_plan` reads one whenever a plan name
ends in `.json`, so every command that takes `--plan` takes a file.

Reuse. A plan's decisions are qualified op names (`mla+moe/mla.g_proj`), independent of the TP
size, so a file applies to any model whose layer kinds it was found for and whose ops it names:
the same model at another TP size, its tiny preset, or the bench's slice of it. The audit re-checks
legality there, so a plan that does not fit the new size is reported, never run silently; a note on
stderr says that the file was found for another model or size. A model with a layer kind the file
has no decisions for, or without an op a decision names, is another architecture: exit 2.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Final, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    model_serializer,
    model_validator,
)

from tpplan.errors import TpplanError, validated
from tpplan.inputs import NAME_CHARS, load_json
from tpplan.layout.plan import MoEMode, Plan
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.outputs import write_dir
from tpplan.placement import S_TOK, Placement, R
from tpplan.plans.decisions import check_decisions, exact_decisions

PLAN_FILE_VERSION: Final = 1
PLAN_FILE_SUFFIX = ".json"


MAX_RANKS = 2**16  # TP, PP and EP sizes: far beyond any cluster tpplan prices


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Size = Annotated[StrictInt, Field(ge=1, le=MAX_RANKS)]


class Decisions(_Strict):
    stream: Literal["R", "S(tok)"]
    reduce: Literal["R", "S(tok)"]
    gather: list[str] = []
    gather_for: list[tuple[str, str]] = []
    a2a: list[str] = []
    replicate: list[str] = []
    token_shard: list[str] = []
    fold: list[str] = []  # residual adds folded into an all-reduce (docs/design.md); search never writes it
    moe: Literal["tp", "ep", "a2a"] = "tp"
    ep_size: Size | None = None
    dp_attention: Literal["max_len", "sum_len"] | None = None  # docs/design.md, "DP attention"
    bank: Literal["R", "S(tok)"] | None = None  # K3's attention-residual bank (None: with the stream)
    # an engine's micro-batch overlap (tpplan.engines.overlap) or async TP's fused GEMMs (tpplan.engines.async_tp)
    overlap: Literal["tbo", "dbo", "asynctp"] | None = None
    # redundant copies beside the routed experts (`tpplan.engines.redundant_experts`); written only where > 0
    redundant_experts: Annotated[StrictInt, Field(ge=0)] = 0

    @model_serializer(mode="wrap")
    def _without_no_copies(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """A file of a plan without redundant experts reads as files did before the field."""
        out: dict[str, object] = handler(self)
        if not self.redundant_experts:
            out.pop("redundant_experts", None)
        return out

    @model_validator(mode="after")
    def _ep_needs_its_size(self) -> Self:
        if self.overlap in ("tbo", "dbo") and self.moe != "a2a":
            raise ValueError(f'overlap "{self.overlap}" hides the MoE all-to-all, but moe is "{self.moe}", not "a2a"')
        if self.moe == "ep" and self.ep_size is None:
            raise ValueError('moe "ep" needs ep_size (the number of expert groups, at least 1)')
        if self.moe != "ep" and self.ep_size is not None:
            raise ValueError(f'ep_size {self.ep_size} is given but moe is "{self.moe}", not "ep"')
        if self.redundant_experts and self.moe == "tp":
            raise ValueError(f'redundant_experts {self.redundant_experts} needs moe "ep" or "a2a", not "tp"')
        return self


class Deployment(_Strict):
    """The whole deployment a plan was ranked at; audit, explain, verify and report take it from the file
    (a flag that differs overrides it, with a note: `tpplan.commands._plan_deployment`)."""

    tp: Size
    pp: Size = 1
    cp: Size = 1  # context-parallel groups per stage (layout.context_parallel); absent in older files
    replicas: Size = 1  # identical copies of the TP x CP x PP deployment; the plan is one replica's
    ep: Size | None = None
    moe: Literal["tp", "ep", "a2a"] = "tp"
    cp_layers: Literal["all", "mla"] = "all"  # which layers CP token-shards ("mla": CP inside the TP group)
    cp_recurrence: Literal["scan", "serial"] = "scan"  # linear attention's state hand-off under CP
    cp_kv: Literal["engines", "sharded"] = "engines"  # the KV a CP rank keeps (engines.context_parallel)
    router: str | None = None  # the replicas' request router (`--router`; None: the engine release's default)

    def to_mesh(self) -> Mesh:
        """The mesh the file's deployment is (the edge between the file format and the planner)."""
        return Mesh(self.tp, pp=self.pp, ep=self.ep, replicas=self.replicas, cp=self.cp,
                    cp_recurrence=self.cp_recurrence, cp_layers=self.cp_layers, cp_kv=self.cp_kv,
                    router=self.router)  # fmt: skip

    @classmethod
    def from_mesh(cls, mesh: Mesh) -> Deployment:
        """The file's deployment for `mesh` (EP and the MoE mode are the plan's: `plan_file_data` sets them)."""
        sizes = {"tp": mesh.tp, "pp": mesh.pp, "cp": mesh.cp, "replicas": mesh.replicas}
        modes = {"cp_layers": mesh.cp_layers, "cp_recurrence": mesh.cp_recurrence, "cp_kv": mesh.cp_kv,
                 "router": mesh.router}  # fmt: skip
        return cls.model_validate({**sizes, **modes})

    def label(self) -> str:
        """`TP8xPP4`, `TP8xCP4 (cp-layers mla)`, `2x TP16`: the deployment in words."""
        mode = f" (cp-layers {self.cp_layers})" if self.cp > 1 and self.cp_layers != "all" else ""
        one = replace(self.to_mesh(), replicas=1).label() + mode
        return f"{self.replicas}x {one}" if self.replicas > 1 else one


class FoundFor(_Strict):
    model: str
    layer_kinds: list[str]
    topology: str | None = None
    nodes: int | None = None
    workload: str | None = None
    dtype: str = "bf16"
    expert_dtype: str | None = None
    objective: str | None = None
    rank: StrictInt | None = Field(default=None, ge=1)
    score: float | None = None


class PlanFile(_Strict):
    """The schema of a plan file (docs/search-json.md, "Plan files")."""

    schema_version: Literal[1]
    name: str = Field(min_length=1, max_length=NAME_CHARS)
    title: str = Field(max_length=20 * NAME_CHARS)
    summary: str = Field(max_length=20 * NAME_CHARS)
    found_by: str
    engine_notes: list[str] = []
    decisions: Decisions
    deployment: Deployment
    found_for: FoundFor


def plan_file_data(plan: Plan, graph: ModelGraph, found_for: dict[str, object], deployment: Deployment) -> PlanFile:
    """The file for `plan`, ranked at `deployment` (its sizes and CP mode; EP and MoE mode are the plan's) on
    `graph` (`found_for`: topology, workload, dtype, expert_dtype, objective, rank, score). Every replica runs
    the same plan, so the decisions are one replica's (`verify` checks one). Patterns are written as the exact
    op names they match on `graph` (a file names every op exactly: `tpplan.plans.decisions`)."""
    plan = exact_decisions(plan, graph)
    decisions = Decisions.model_validate(
        {
            "stream": plan.stream.value,
            "reduce": plan.reduce.value,
            "gather": sorted(plan.gather),
            "gather_for": sorted(plan.gather_for),
            "a2a": sorted(plan.a2a),
            "replicate": sorted(plan.replicate),
            "token_shard": sorted(plan.token_shard),
            "fold": sorted(plan.fold),
            "moe": plan.moe,
            "ep_size": plan.ep_size if plan.moe == "ep" else None,
            "dp_attention": plan.dp_attention,
            "bank": plan.bank.value if plan.bank is not None else None,
            "overlap": plan.overlap,
            "redundant_experts": plan.redundant_experts,
        }
    )
    return PlanFile(
        schema_version=PLAN_FILE_VERSION,
        name=plan.name,
        title=plan.title,
        summary=plan.summary,
        found_by=plan.found_by,
        engine_notes=list(plan.engine_notes),
        decisions=decisions,
        deployment=deployment.model_copy(update={"ep": decisions.ep_size, "moe": plan.moe}),
        found_for=FoundFor.model_validate({"model": graph.spec.name, "layer_kinds": list(graph.kinds), **found_for}),
    )


def is_plan_file(name: str) -> bool:
    """Whether a `--plan` value names a file (it ends in .json) rather than a named plan."""
    return name.lower().endswith(PLAN_FILE_SUFFIX)


def read_plan_file(path: str | Path) -> PlanFile:
    """Parse and validate a plan file (TpplanError naming the file on any problem)."""
    where = f"--plan {path}"
    fix = "pass a plan file written by `tpplan search --save DIR`"
    raw = load_json(path, where, fix)
    got = raw.get("schema_version") if isinstance(raw, dict) else None
    # exactly the integer: 1.0 and true compare equal to 1 in Python but are not this schema's version
    if not isinstance(raw, dict) or type(got) is not int or got != PLAN_FILE_VERSION:
        raise TpplanError(
            where,
            f"not a tpplan plan file of schema version {PLAN_FILE_VERSION} (schema_version {got!r})",
            "save it again with this tpplan's `tpplan search --save DIR`",
        )
    return validated(PlanFile, raw, where, "save it again with `tpplan search --save DIR`")


def _placement(v: str) -> Placement:
    return S_TOK if v == str(S_TOK) else R


def load_plan_file(path: str, graph: ModelGraph, n: int) -> Plan:
    """The plan a file holds, checked against the model it is about to be applied to."""
    pf = read_plan_file(path)
    where = f"--plan {path}"
    ff = pf.found_for
    missing = [k for k in graph.kinds if k not in ff.layer_kinds]
    if missing:
        raise TpplanError(
            where,
            f"found for {ff.model} (layer kinds {', '.join(ff.layer_kinds)}); model {graph.spec.name} has layer "
            f"kind(s) {', '.join(missing)} it has no decisions for",
            f"search this model: tpplan search --model {graph.spec.name} ... --save DIR",
        )
    d = pf.decisions
    notes: tuple[str, ...] = ()
    dep = pf.deployment
    if ff.model != graph.spec.name or dep.tp != n:
        found = f"TP{dep.tp}" + (f" x PP{dep.pp}" if dep.pp > 1 else "")
        notes = (
            f"plan file {path} was found for {ff.model} at {found}; applying its decisions to "
            f"{graph.spec.name} at TP{n} (the audit checks them there)",
        )
    if dep.replicas > 1:  # every replica runs the same plan: what is checked or run is one of them
        notes += (
            f"plan file {path} was ranked for {dep.replicas} replicas of TP{dep.tp}"
            + (f" x PP{dep.pp}" if dep.pp > 1 else "")
            + "; its decisions are one replica's, and audit, verify and run check one replica",
        )
    moe: MoEMode = d.moe
    plan = Plan(
        pf.name,
        pf.title,
        pf.summary,
        stream=_placement(d.stream),
        reduce=_placement(d.reduce),
        gather=frozenset(d.gather),
        gather_for=frozenset(d.gather_for),
        a2a=frozenset(d.a2a),
        replicate=frozenset(d.replicate),
        token_shard=frozenset(d.token_shard),
        fold=frozenset(d.fold),
        moe=moe,
        ep_size=d.ep_size,
        redundant_experts=d.redundant_experts,
        dp_attention=d.dp_attention,
        bank=_placement(d.bank) if d.bank is not None else None,
        overlap=d.overlap,
        engine_notes=tuple(pf.engine_notes),
        found_by=pf.found_by,
        notes=notes,
        extra={"file": str(path), "deployment": pf.deployment.model_dump()},
    )
    check_decisions(plan, graph, ff.layer_kinds, where)
    return _check_async_tp(plan, graph, n, where) if plan.overlap == "asynctp" else plan


def _check_async_tp(plan: Plan, graph: ModelGraph, n: int, where: str) -> Plan:
    """A file's async TP applied to this model at TP `n`: refused where its decisions leave nothing to
    fuse here; else the plan with the note every `+asynctp` plan carries."""
    from tpplan.engines.async_tp import VERIFY_NOTE
    from tpplan.layout.fused_gemm import async_tp_refusal
    from tpplan.layout.propagate import propagate_model

    base = plan.with_(overlap=None)
    why = async_tp_refusal(base, n, propagate_model(graph, base, n).results)
    if why is not None:
        raise TpplanError(where, f"its async TP fuses collectives into GEMMs, and {why} ({graph.spec.name}, TP{n})",
                          "drop decisions.overlap, or search this model with --overlap asynctp")  # fmt: skip
    return plan.with_(notes=(*plan.notes, VERIFY_NOTE))


# ----------------------------------------------------------------------------------------------
# A directory of plan files (`tpplan search --save DIR`)

INDEX_NAME = "index.json"
INDEX_MARK = "tpplan search --save"


def plan_file_name(rank: int) -> str:
    """`plan-1.json` for the best plan, and so on."""
    return f"plan-{rank}{PLAN_FILE_SUFFIX}"


def save_plan_dir(path: Path, files: list[PlanFile]) -> list[Path]:
    """Write `files` (ranked, best first) as `plan-<rank>.json` plus an index into folder `path`.

    The folder is written as every tpplan output folder is (`tpplan.outputs.write_dir`): a new or
    empty folder, or one tpplan wrote before (replaced whole); anything else is refused, exit 2.
    """
    contents: dict[str, bytes] = {}
    entries = []
    for rank, pf in enumerate(files, start=1):
        name = plan_file_name(rank)
        contents[name] = (pf.model_dump_json(indent=2) + "\n").encode()
        dep = pf.deployment
        entries.append(
            {"rank": rank, "file": name, "name": pf.name, "tp": dep.tp, "pp": dep.pp, "replicas": dep.replicas}
        )
    index = {"written_by": INDEX_MARK, "schema_version": PLAN_FILE_VERSION, "plans": entries}
    contents[INDEX_NAME] = (json.dumps(index, indent=2) + "\n").encode()
    write_dir(path, contents, "--save")
    return [path / plan_file_name(rank) for rank in range(1, len(files) + 1)]


__all__ = [
    "PLAN_FILE_VERSION",
    "Deployment",
    "PlanFile",
    "is_plan_file",
    "load_plan_file",
    "plan_file_data",
    "plan_file_name",
    "read_plan_file",
    "save_plan_dir",
]
