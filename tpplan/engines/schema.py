"""The schema of engine knowledge: what an engine version does with a flag, as data with sources.

Every fact cites the engine's file, function and the version or commit it was read at (`Source`);
a fact nobody read says so (`Source.unread`). Per engine version (`EngineVersion`) there are modes
(`Mode`: a flag or a set of flags), each with the model classes that wire it (`Wiring`: the
per-layer dataflow as ops on full or scattered rows and the collectives, with their tensors and
widths), the gates that decide whether it runs (`Gate`, one structured form for every engine
condition: server arguments, environment variables, the model, the batch, the GPU), and what runs
otherwise (`fallback`). How the engine pipelines prefill chunks over PP stages is `PipelineSchedule`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Literal

from tpplan.mesh import Mesh

# What the engine does when a gate fails:
# "refuses": the server does not start (an argument check raises);
# "runs baseline": it starts and runs the all-reduce path (it may log an info line);
# "asserts": it starts, and a batch that fails the gate stops it with an assertion error;
# "falls back": the same collectives on a slower path (NCCL instead of a fused kernel);
# "adjusts": it changes another setting (the memo says what it derives);
# "per batch": it decides per batch (prefill batches take the mode, others do not).
Effect = Literal["refuses", "runs baseline", "asserts", "falls back", "adjusts", "per batch"]

# Where a gate's input comes from.
Setting = Literal["server arg", "env", "model", "batch", "gpu", "build"]

Rows = Literal["T", "T/N"]  # every token of the batch, or the rank's share
CollectiveName = Literal["AR", "RS", "AG", "A2A"]


@dataclass(frozen=True)
class Source:
    """Where a fact was read: repository, file, function, and the version or commit read."""

    repo: str  # "sgl-project/sglang", "vllm-project/vllm"
    path: str  # inside the repository (for a release: inside its wheel, same layout as `python/`)
    function: str
    ref: str  # "0.5.23 (PyPI wheel)" or "commit 4eb3ad5a" (`tpplan.engines.citations` names the kinds allowed)
    read: bool = True  # False: nobody read it; the fact is a statement to check, not a finding
    why: str = ""  # unread: why it was not read (docs/engines.md lists every unread citation with it)

    def cite(self) -> str:
        """One short citation for a report line."""
        if not self.read:  # where nothing was located, what was not read stands for the place
            where = " ".join(p for p in (self.repo, self.path) if p.strip("- ")) or self.function
            return f"source: unread ({where})"
        return f"{self.repo} {self.path} `{self.function}` @ {self.ref}"

    @classmethod
    def unread(cls, repo: str, path: str, what: str, *, why: str) -> Source:
        """A fact nobody read in the engine's code, and why (no release to read it at, code not published, ...)."""
        return cls(repo, path, what, "unread", read=False, why=why)


@dataclass(frozen=True)
class Op:
    """One op of the engine's per-layer dataflow that runs on a token set (`rows`)."""

    name: str  # the engine's module name, e.g. "input_layernorm", "fused_qkv_a_proj_with_mqa"
    rows: Rows


@dataclass(frozen=True)
class Comm:
    """One collective of the engine's per-layer dataflow: its tensor and width."""

    collective: CollectiveName
    tensor: str  # the engine's words for what moves, e.g. "o_proj partial sum + residual slice"
    width: str  # a width key `widths()` resolves per model: "hidden", "qkv_latent", "2*hidden", ...
    source: Source


Step = Op | Comm


@dataclass(frozen=True)
class Wiring:
    """A model class that wires the mode, and the per-layer dataflow it then runs."""

    model_types: tuple[str, ...]  # tpplan's `ModelSpec.model_type` values it covers
    architectures: tuple[str, ...]  # the engine's model classes (HF `architectures`)
    layers: str  # which layers run the dataflow: "every layer", "MoE layers", ...
    dataflow: tuple[Step, ...]
    plan: str | None  # the tpplan plan whose per-layer collectives equal `dataflow` (None: no plan does)
    source: Source
    differences: tuple[str, ...] = ()  # what tpplan's plan does differently, outside the per-layer table

    def steps_text(self) -> str:
        """The per-layer dataflow in one line: each op with its rows, each collective with its width key."""
        words = (
            f"{s.collective}({s.width}) of {s.tensor.split(' (')[0]}"
            if isinstance(s, Comm)
            else f"{s.name} on {s.rows}"
            for s in self.dataflow
        )
        return "; ".join(words)


@dataclass(frozen=True)
class NotWired:
    """Model classes that do not enter the mode: what they run instead, and why, with its source."""

    model_types: tuple[str, ...]
    runs: str  # the tpplan plan the engine really runs for them ("baseline")
    why: str
    source: Source


@dataclass(frozen=True)
class Gate:
    """One condition of the engine. `check` names a predicate in `tpplan.engines.gates` that decides
    it from the deployment (None: it depends on a setting the memo cannot see; keep it as stated)."""

    text: str
    setting: Setting
    keys: tuple[str, ...]  # the server arguments / environment variables that drive it
    effect: Effect
    source: Source
    check: str | None = None


@dataclass(frozen=True)
class Mode:
    """A flag (or set of flags) of one engine version."""

    name: str  # "input-scattered", "sp-moe", "layernorm-sp", "moe-sp", "sp-pass", "dp-attention", ...
    flags: tuple[str, ...]  # what the launch line adds (besides TP/PP/chunk)
    summary: str
    wiring: tuple[Wiring, ...]
    not_wired: tuple[NotWired, ...]
    gates: tuple[Gate, ...]
    fallback: str
    fallback_source: Source
    exists: bool = True  # False: this version has no such mode (the flag is refused or ignored)
    derived: tuple[str, ...] = ()  # settings the engine's parser derives from these flags


@dataclass(frozen=True)
class PipelineSchedule:
    """How the engine runs PP for prefill: micro-batches in flight, chunk pipelining, the boundary.

    The structured fields (`extra_in_flight`, `chunks_overlap`, `boundary_gathers`) are what tpplan's
    PP TTFT model reads (`tpplan.cost.pipeline`, which also words the assumption the memo prints);
    the prose beside each says the same with the engine's words, and each fact has its own source."""

    in_flight: str  # how many micro-batches are in flight, and what gates the next one
    extra_in_flight: int  # micro-batches in flight beyond pp_size, at the launch line's defaults
    source: Source  # of the in-flight fact
    chunks_of_one_request: str  # whether consecutive chunks of one prompt overlap across stages
    chunks_overlap: bool  # chunk k+1 of a prompt may enter stage 0 while chunk k is still in the pipeline
    chunks_source: Source
    boundary: str  # what crosses a stage boundary, and whether sequence-parallel shards do
    boundary_gathers: bool  # each TP rank sends 1/N of every tensor; the next stage all-gathers it over TP
    boundary_source: Source
    more_sources: tuple[Source, ...] = ()
    not_modelled: tuple[str, ...] = ()  # engine settings the TTFT model leaves at their defaults
    # (model_types, clause): what crosses the boundary for those models only (K3's attention-residual
    # bank), each clause with its leading separator; a memo prints only its own model's (`boundary_for`)
    boundary_models: tuple[tuple[tuple[str, ...], str], ...] = ()

    def boundary_for(self, model_type: str | None = None) -> str:
        """`boundary` with the clauses for `model_type` (None: every model's, as docs/engines.md lists them)."""
        return self.boundary + "".join(
            c for types, c in self.boundary_models if model_type is None or model_type in types
        )

    def in_flight_at(self, mesh: Mesh) -> int:
        """Micro-batches in flight on `mesh` (its PP size plus the engine's extra)."""
        return mesh.pp + self.extra_in_flight

    def assumption(self, engine: str, mesh: Mesh | None = None) -> str:
        """What tpplan's PP TTFT model (`tpplan.cost.pipeline`, which reads these same fields) assumes of
        `engine` ("SGLang 0.5.23"), in one sentence, at the mesh's PP size (None: in words of pp_size)."""
        extra, pp = self.extra_in_flight, (mesh.pp if mesh is not None else None)
        plus = f" + {extra}" if extra else ""
        count = f"pp_size{plus}" if pp is None else str(pp + extra)
        flight = ("pp_size" if pp is None else f"pp_size {pp}") + plus
        chunks = (
            "a request's chunks pipeline across the stages (chunk k+1 enters stage 0 while chunk k is still in the "
            "pipeline, so C equal chunks over P equal stages take (C + P - 1) stage times and a one-chunk request "
            "gets no overlap)"
            if self.chunks_overlap
            else "a request's next chunk waits until its previous chunk has left the last stage (only other "
            "requests fill the pipeline)"
        )
        boundary = (
            "each TP rank sends its 1/N slice of the boundary tensors and the next stage all-gathers them over TP, "
            "a token-sharded stream included"
            if self.boundary_gathers
            else "each TP rank sends its own rows and a token-sharded stream is not re-gathered"
        )
        return (
            f"PP TTFT is priced as {engine} schedules prefill: at most {count} micro-batches in flight ({flight}), "
            f"formed when stage 0 is free from the requests that have arrived; {chunks}; the stages run "
            f"micro-batches in order, each waiting for the stage ahead to finish the one before it; {boundary} "
            "(the engine's PP schedule as tpplan.engines records it, each fact with its source)"
        )


@dataclass(frozen=True)
class Support:
    """A launch option the engine runs only for the model classes that implement it (`--pp-size`), read
    in those classes' files: which tpplan model types have it (or, `runs` False, are refused it), how, and where."""

    option: str  # "--pp-size"
    model_types: tuple[str, ...]
    how: str  # what the model class does to support it (or, runs False/None, what the engine does instead)
    source: Source
    runs: bool | None = True  # False: the engine refuses the option for the class; None: what happens was not read


@dataclass(frozen=True)
class CollectiveDefault:
    """What the engine's launcher sets for NCCL's in-node collectives at its defaults, with the
    flags that change it: a cluster priced with another setting prices collectives the server does not run."""

    setting: str  # "NCCL_NVLS_ENABLE"
    nvls: bool | None  # NVLS at the launch line's defaults (None: the engine leaves it to NCCL's own default)
    text: str
    enable: tuple[str, ...]  # flags that turn NVLS on where the default keeps it off
    source: Source


@dataclass(frozen=True)
class Fact:
    """One statement about an engine version's serving loop or memory, and where it was read."""

    text: str
    source: Source


@dataclass(frozen=True)
class BudgetTier:
    """GPUs with less than `below_gib` of memory (None: any more) get `tokens` per step by default."""

    below_gib: float | None
    tokens: int


@dataclass(frozen=True)
class StepBudget:
    """The step's prefill token budget: its flag and its default, by GPU memory."""

    flag: str
    tiers: tuple[BudgetTier, ...]  # ascending; the first whose bound the GPU is under applies
    small_tier_names: tuple[str, ...]  # GPU names kept on the first tier whatever their memory
    fact: Fact

    def default_tokens(self, memory_gib: float, gpu_name: str = "") -> int:
        """The budget the engine picks when the flag is not given, for a GPU of this memory and name."""
        if any(s in gpu_name.lower() for s in self.small_tier_names):
            return self.tiers[0].tokens
        return next(t.tokens for t in self.tiers if t.below_gib is None or memory_gib < t.below_gib)


@dataclass(frozen=True)
class SchedulerRules:
    """One engine version's prefill scheduling, as the serving loop (`tpplan.simulate`) reads it."""

    budget: StepBudget
    admission: Fact  # order and splitting of requests in a step
    mixes_decode: bool  # prefill chunks and decode tokens share a step
    prefill_decode: Fact
    cpu_overlap: bool  # at PP 1, the CPU forms step n+1 while the GPU runs step n
    cpu_overlap_under_pp: bool  # ... and it keeps doing so under PP (SGLang turns its overlap schedule off)
    cpu_overlap_fact: Fact
    prefill_graph_tokens: int  # prefill steps of at most this many tokens replay a CUDA graph (0: none)
    graph_fact: Fact
    max_running: Fact
    more: tuple[Fact, ...] = ()
    not_modelled: tuple[str, ...] = ()  # what the loop leaves out for this engine: the memo's conditions
    decode_step: Fact | None = None  # how a request decodes once its prompt is done (the loop's `decode`)
    # the ways the engine can spread requests over a deployment's replicas, its default first (`engines.routing`)
    replica_routers: tuple[ReplicaRouter, ...] = ()

    def facts(self) -> tuple[Fact, ...]:
        """Every fact, in the order docs/engines.md lists them."""
        decode = (self.decode_step,) if self.decode_step is not None else ()
        # the in-process routers' (an external router is its own package, cited with the P/D hand-off)
        spread = tuple(dict.fromkeys(f for r in self.replica_routers if r.flags for f in r.rule.facts))
        return (self.budget.fact, self.admission, self.prefill_decode, self.cpu_overlap_fact, self.graph_fact,
                self.max_running, *self.more, *decode, *spread)  # fmt: skip


@dataclass(frozen=True)
class HandoffRule:
    """How an engine version hands a request from its prefill server to its decode server (P/D)."""

    decode_first: bool  # the decode server reserves the KV before the prefill server computes the prompt
    first_token_on_decode: bool  # the decode server computes the first output token (else the prefill's streams)
    push: bool  # the prefill side sends the KV over its link; else the decode side reads it over its own
    sources: tuple[Source, ...]
    chunked_send: bool = False  # each chunk's KV leaves after its step (else the whole prompt's after the last)
    router: RouterRule | None = None  # which instances a request goes to (None: not read; round-robin assumed)


RouterPolicy = Literal["round_robin", "least_loaded", "cache_aware"]


@dataclass(frozen=True)
class RouterRule:
    """Which prefill and which decode instance the P/D router the engine documents sends a request to
    (`tpplan.cost.routing` runs the policies)."""

    prefill: RouterPolicy
    decode: RouterPolicy
    decode_at_prefill_end: bool  # the decode instance is picked when the prefill answers, else with the prefill's
    facts: tuple[Fact, ...]
    cache_threshold: float = 0.3  # cache_aware: prefix-match share above which the holder is chosen
    balance_abs: int = 64  # cache_aware: load imbalance when max - min exceeds this ...
    balance_rel: float = 1.5  # ... and max exceeds min x this
    prefill_load_to_end: bool = False  # a request loads its prefill instance until it ends (else until prefilled)
    ties_rotate: bool = True  # least_loaded: ties to the first from a scan start that moves on (else the lowest index)


@dataclass(frozen=True)
class ReplicaRouter:
    """One way an engine release spreads requests over a deployment's R replicas (`--router NAME`): the policy the
    serving loop runs (`rule`, `tpplan.cost.routing`) and the launch that starts it, both read in the
    release. In-process (`flags`): one server starts every replica and spreads the requests itself (`{replicas}`
    in a flag is R); else R servers, each with the deployment's own flags, `behind` an external router (its
    command, or what it is)."""

    name: str  # the `--router` value: "dp:round_robin", "sglang-router:cache_aware"
    rule: RouterRule  # its prefill policy is what the loop runs (the replicas' requests are whole)
    what: str  # what spreads the requests, in words ("SGLang's DP controller, round-robin")
    flags: tuple[str, ...] = ()  # in-process: the server flags that start it
    behind: str = ""  # external: the router in front of the R servers
    on_moe: str = ""  # what the in-process router's flags do otherwise on an MoE model: not R copies
    across_nodes: str = ""  # ... and with the replicas on more than one node
    alike: ReplicaRouter | None = None  # an external router of the same policy, for R servers where `flags` can't

    def launch_flags(self, copies: int) -> tuple[str, ...]:
        """The in-process router's flags for that many copies of the deployment (none for an external router)."""
        return tuple(f.format(replicas=copies) for f in self.flags)


@dataclass(frozen=True)
class SglangMemory:
    """SGLang's KV sizing: `mem_fraction_static` derived from the GPU and the launch line, the pool what is left
    after the weights (the formulas are `tpplan.engines.memory.sglang_*`; these are the facts they follow)."""

    facts: tuple[Fact, ...]
    swa_full_tokens_ratio: float  # SWA pool tokens per full-attention token
    mamba_full_memory_ratio: float  # state slots : KV pool share of a linear-attention hybrid
    mamba_slots_per_request: int  # state slots one running request holds (radix cache on)


@dataclass(frozen=True)
class FabricSharing:
    """A P/D server's KV connector shares the cache with peers on its host through NVLink fabric handles, which
    need an IMEX channel: without one the engine leaves its extensible KV cache off and sizes the profiled way
    at `utilization` (the cluster says whether its nodes have one: `Fabric.imex_channel`)."""

    connector: str  # "NixlConnector"
    utilization: float  # gpu_memory_utilization unset, once the extensible cache is off
    facts: tuple[Fact, ...]  # the rule first, then what it rests on (what a P/D server's sizing cites besides)


@dataclass(frozen=True)
class VllmMemory:
    """One vLLM version's KV sizing: its defaults and how the profiled numbers become the KV bytes."""

    gpu_memory_utilization: float  # the default that applies on CUDA
    extensible: bool  # sized after warm-up from measured free memory (0.34.0's default on CUDA)
    block_size: int  # CacheConfig.DEFAULT_BLOCK_SIZE
    facts: tuple[Fact, ...]
    pd_fabric: FabricSharing | None = None  # None: a P/D server sizes as an aggregated one

    def for_server(self, pd: bool, imex_channel: bool) -> VllmMemory:
        """The sizing a server runs: a P/D server (`pd`) whose connector shares the cache through fabric handles
        on a node without an IMEX channel has the extensible cache off (`pd_fabric`); any other, this one."""
        rule = self.pd_fabric
        if not pd or imex_channel or not self.extensible or rule is None:
            return self
        return replace(
            self, gpu_memory_utilization=rule.utilization, extensible=False, facts=(*rule.facts, *self.facts)
        )

    def max_num_seqs(self, gpu_gib: float, gpu_name: str = "") -> int:
        """max_num_seqs unset (OpenAI server): 1024 at 70 GiB and more except A100 and GB10, else 256."""
        small = any(s in gpu_name.lower() for s in ("a100", "gb10"))
        return 1024 if gpu_gib >= 160 or (gpu_gib >= 70 and not small) else 256

    def kv_bytes(self, card: float, weights: float, activation_peak: float, cuda_graphs: float = 0.0,
                 non_torch: float = 0.0) -> float:  # fmt: skip
        """Bytes the KV cache gets per rank from the card's bytes and the profiled figures."""
        if self.extensible:  # measure_kv_cache_bytes at utilization 1.0: headroom - margin - transient peak
            headroom = card - weights - cuda_graphs - non_torch
            margin = max(1.0 * 2**30, 0.75 * activation_peak)
            return max(0.0, headroom - margin - activation_peak)
        requested = card * self.gpu_memory_utilization  # request_memory: ceil(total x utilization)
        return max(0.0, requested - (weights + non_torch + activation_peak) - cuda_graphs)

    def reserve_text(self) -> str:
        if self.extensible:
            return "the activation peak + max(1 GiB, 0.75 x the peak) (extensible KV cache, utilization 1.0)"
        util = self.gpu_memory_utilization
        return f"{1 - util:.0%} of the card (gpu_memory_utilization {util}) + the activation peak"


KVSizing = SglangMemory | VllmMemory


# Micro-batch overlap (SGLang TBO, vLLM DBO): the form; the records are `tpplan.engines.overlap` and the releases
DenseLayers = Literal["whole batch", "two halves in turn"]


@dataclass(frozen=True)
class StartupRefusal:
    """Deployments an engine refuses a micro-batch overlap for when the server starts (a ValueError)."""

    axes: tuple[Literal["pp", "cp"], ...]  # PP > 1 / prefill CP > 1 beside the flag
    axis_words: tuple[str, ...]  # the engine's words for each axis, in `axes` order
    model_types: tuple[str, ...]  # tpplan model types whose engine class the flag is refused for
    model_words: str  # the engine's words for those models
    source: Source  # where the check is
    model_source: Source  # where those model classes say what makes them refused

    def reason(self, model_type: str, mesh: Mesh) -> str | None:
        """Why the server refuses the flag on `mesh` for `model_type` (None: it does not, as read)."""
        sizes = {"pp": mesh.pp, "cp": mesh.cp}
        found = [w for axis, w in zip(self.axes, self.axis_words, strict=True) if sizes[axis] > 1]
        if model_type in self.model_types:
            found.append(f"{self.model_words} ({model_type}: {self.model_source.cite()})")
        if not found:
            return None
        return f"the server refuses it at startup, 'does not support: {', '.join(found)}' ({self.source.cite()})"


@dataclass(frozen=True)
class MicroBatchOverlap:
    """One engine's micro-batch overlap: where it applies, how it splits, what it costs the GEMMs."""

    name: Literal["tbo", "dbo"]  # the plan suffix: `<plan>+tbo`, `<plan>+dbo`
    engine: str  # "SGLang 0.5.23"
    flags: tuple[str, ...]  # what the launch line adds
    model_types: tuple[str, ...] | None  # whose MoE layers run the staged path (None: every MoE model)
    raises_for: tuple[str, ...]  # models whose forward asks for the staged path and gets an error
    dense_layers: DenseLayers  # SGLang runs dense layers on the whole batch; vLLM runs both halves in turn
    split: str  # how a prefill batch splits into the two micro-batches
    balance: float | None  # split between requests unless a side then holds less than this share; None: midpoint
    min_tokens: int  # a batch with fewer tokens runs whole (no overlap)
    comm_sms: int  # SMs the all-to-all kernels hold; DeepGEMM kernels run on the rest
    shared_experts_before_combine_wait: bool  # stage 2 computes the shared experts before waiting
    gates: tuple[Gate, ...]
    schedule_source: Source  # the stage list
    split_source: Source
    sms_source: Source
    assumption: str = ""  # what tpplan assumes where the source was not read
    # What the server refuses at startup beside the flag: PP > 1 ("pp"), prefill CP > 1 ("cp"), and these
    # model types (e.g. vLLM's hybrid model classes); None: not read for this engine
    refused: StartupRefusal | None = None
    runs_on: str = ""  # what else the flag selects where it starts (vLLM 0.33.0: its V1 model runner)
    runs_on_source: Source | None = None
    staged_source: Source | None = None  # where the model forwards that split the batch are listed
    shared_experts_source: Source | None = None  # where the shared experts' place beside the combine was read

    def wires(self, model_type: str) -> bool:
        return self.model_types is None or model_type in self.model_types

    def refusal(self, model_type: str) -> str | None:
        """Why this engine does not overlap `model_type`'s micro-batches, with the source (None: it does)."""
        if self.wires(model_type):
            return None
        gate = next(g for g in self.gates if g.effect == "asserts")
        if model_type in self.raises_for:
            return f"its forward stages {model_type}'s layers and raises NotImplementedError ({gate.source.cite()})"
        callers = f" ({self.staged_source.cite()})" if self.staged_source is not None else ""
        return f"its {model_type} forward never splits the batch, so the flag changes nothing{callers}"

    def refusal_on(self, model_type: str, mesh: Mesh) -> str | None:
        """`refusal`, and why the server refuses the flag on this deployment at startup (None: neither)."""
        why = self.refusal(model_type)
        if why is None and self.refused is not None:
            why = self.refused.reason(model_type, mesh)
        return why


@dataclass(frozen=True)
class DpBeside:
    """Whether the engine's data-parallel attention deployment (vLLM: `--data-parallel-size` at TP 1) starts beside
    PP and beside prefill CP, read from its argument and config checks, its process groups and its model runner."""

    pp: bool  # accepted beside --pipeline-parallel-size
    cp: bool  # accepted beside --prefill-context-parallel-size
    ep_spans_cp: bool  # the MoE's EP (or flattened TP) group then spans the CP ranks as well as the DP ranks
    facts: tuple[Fact, ...]


@dataclass(frozen=True)
class SparseMLAPrefill:
    """How the engine runs DSA's sparse MLA prefill (`tpplan.engines.sparse_mla`): when it runs dense MHA instead
    of the absorbed sparse form, and how many query heads its sparse kernel computes."""

    dense_max_seq: int | None  # dense MHA when the longest prefill sequence is at most this (None: the top-k)
    head_multiple: int  # the sparse kernel computes heads padded up to a multiple of this (its tile rows)
    facts: tuple[Fact, ...] = ()


@dataclass(frozen=True)
class EngineVersion:
    """One engine at one version: its modes, its PP schedule and what its serving loop and memory do;
    one module of `tpplan/engines/releases/` each (docs/adding-an-engine-version.md)."""

    engine: Literal["SGLang", "vLLM"]
    version: str  # "0.5.23", or "main@<commit>" for a revision read from the repository
    released: str  # what this version is ("current PyPI release, 2026-10"; "older main revision")
    launcher: str  # "python -m sglang.launch_server --model-path {model}", "vllm serve {model}"
    modes: tuple[Mode, ...]
    pipeline: PipelineSchedule
    notes: tuple[str, ...] = field(default_factory=tuple)
    supports: tuple[Support, ...] = ()  # options only some model classes implement (read per model file)
    collectives: CollectiveDefault | None = None  # NCCL's NVLS as the launcher leaves it (None: not read)
    # What the serving loop, the KV sizing and the P/D loop read of this version (None: not read for it)
    scheduling: SchedulerRules | None = None
    memory: KVSizing | None = None
    handoff: HandoffRule | None = None
    # Its micro-batch overlaps (SGLang's TBO, vLLM's DBO: what a plan's `+tbo` / `+dbo` launches; () : not read)
    overlaps: tuple[MicroBatchOverlap, ...] = ()
    dp_attention_beside: DpBeside | None = None  # DP attention beside PP / prefill CP (None: not read)
    sparse_prefill: SparseMLAPrefill | None = None  # how it runs DSA's prefill attention (None: not read)
    default: bool = True  # False: selectable, never its engine's default (else the newest release is)

    @property
    def key(self) -> str:
        return f"{self.engine.lower()}@{self.version}"

    @property
    def release(self) -> tuple[int, ...] | None:
        """The version as numbers ("0.34.0" -> (0, 34, 0)); None for a revision ("main@000fc94b")."""
        if not re.fullmatch(r"\d+(\.\d+)*", self.version):
            return None
        return tuple(int(x) for x in self.version.split("."))

    def mode(self, name: str) -> Mode | None:
        return next((m for m in self.modes if m.name == name), None)

    def support(self, option: str, model_type: str) -> Support | None:
        """The read record of whether `model_type`'s model class implements `option` (None: not read here)."""
        return next((s for s in self.supports if s.option == option and model_type in s.model_types), None)


def recite(record: Any, old_ref: str, new_ref: str) -> Any:
    """`record` (any engine record, or a tuple of them) with every Source read at `old_ref` cited at
    `new_ref` instead: for a release whose files were diffed against the one read and found unchanged
    where the record cites them (what changed is replaced by the caller, read at the new release)."""
    if isinstance(record, Source):
        return replace(record, ref=new_ref) if record.ref == old_ref else record
    if isinstance(record, tuple):
        return tuple(recite(x, old_ref, new_ref) for x in record)
    if is_dataclass(record) and not isinstance(record, type):
        return replace(record, **{f.name: recite(getattr(record, f.name), old_ref, new_ref) for f in fields(record)})
    return record


__all__ = [
    "BudgetTier",
    "CollectiveDefault",
    "Comm",
    "DenseLayers",
    "DpBeside",
    "Effect",
    "EngineVersion",
    "FabricSharing",
    "Fact",
    "Gate",
    "HandoffRule",
    "KVSizing",
    "MicroBatchOverlap",
    "Mode",
    "NotWired",
    "Op",
    "PipelineSchedule",
    "Rows",
    "SchedulerRules",
    "Setting",
    "SglangMemory",
    "Source",
    "SparseMLAPrefill",
    "StartupRefusal",
    "Step",
    "StepBudget",
    "Support",
    "VllmMemory",
    "Wiring",
    "recite",
]
