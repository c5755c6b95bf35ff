"""docs/engines.md, rendered from the engine data (tests/engines keep the checked-in file current:
`python -m tpplan.engines.doc > docs/engines.md`)."""

from __future__ import annotations

from collections.abc import Sequence

from tpplan.engines import ENGINES, version_overlaps, vllm
from tpplan.engines.async_tp import (
    AG_DECOMPOSITION,
    AG_PIPELINE,
    FUSIONS,
    NO_VLLM_PASS,
    OLD_VLLM_PASS,
    PEERS,
    RS_DECOMPOSITION,
    RS_PIPELINE,
    UNUSED_VLLM_OP,
    VOLUME,
)
from tpplan.engines.citations import held, kind, unread_calls
from tpplan.engines.context_parallel import CP_PATHS
from tpplan.engines.overlap import DEEPEP_SMS
from tpplan.engines.schema import Comm, EngineVersion, Gate, Mode

INTRO = """# Engines as they run

What SGLang and vLLM really do with the flags tpplan's memo prints, per engine version and model
class, read from the engines' code. This file is rendered from the engine data (`tpplan/engines/`:
`sglang.py` with its SP-MoE mode in `sglang_sp_moe.py` and `vllm.py` hold the records read; each
version is one module of `releases/`, with its scheduler, KV sizing and P/D hand-off; schema in
`schema.py`; the launch lines built from it are `engines/recipes/`; adding a version:
docs/adding-an-engine-version.md); regenerate it with
`python -m tpplan.engines.doc > docs/engines.md`. Every fact names the file, the function and the
version or commit read; `source: unread` marks a statement nobody checked in the code.

`tpplan report --engine sglang@VERSION --engine vllm@VERSION` judges the memo's flags against one
of the versions below; the default is each engine's newest release (the first of each engine).
An engine-named plan equals the engine's dataflow op by op for every model class that wires the
flag (`tests/engines/test_dataflow.py` holds the per-layer collectives to tables transcribed from
the code); a model class that does not wire it runs the engine's actual path, and the memo says so
first, with its source.

Rows: `T` every token of the batch on every rank, `T/N` the rank's share. Widths: `hidden` H,
`qkv_latent` q_lora_rank + kv_lora_rank + rope dim (2112 on DeepSeek-V3), `moe_latent` the MoE's
latent width (K3), `moe_input` what the experts read.

## Checking launch lines with the engines' own parsers

`tests/engines/test_engine_parsers.py` feeds every SGLang launch line the memo prints to SGLang's
`prepare_server_args` (a `slow` test, skipped when SGLang is not importable). It runs on a CPU
machine with `pip install --no-deps sglang==0.5.23` plus these import-time dependencies (also
`--no-deps`): orjson, psutil, pybase64, requests, urllib3, certifi, triton, starlette, msgspec,
pyzmq, ipython, traitlets, aiohttp, multidict, attrs, yarl, propcache, aiohappyeyeballs, aiosignal,
frozenlist; or point `TPPLAN_SGLANG_PATH` at a folder holding them. The parser returns the given
`--ep-size` (default 1) with an a2a backend: SGLang sets ep_size = tp_size in a later post-process
(`arg_groups/overrides.py` `_a2a_ep_size`), which the memo states as an `adjusts` condition.
`test_vllm_parses_every_line_with_the_plans_settings` does the same with vLLM 0.33.0's `EngineArgs`
(also `slow`, skipped without vLLM): `pip install --no-deps vllm==0.33.0` plus, with `--no-deps`, the
SGLang list above and apache-tvm-ffi, cachetools, cbor2, cloudpickle, fastapi, llguidance, openai,
openai-harmony, opentelemetry-api, partial-json-parser, prometheus-client, py-cpuinfo, sniffio,
uvloop, xgrammar (or `TPPLAN_VLLM_PATH`). The wheel is a CUDA build: on a machine without a GPU its
DeviceConfig cannot infer a device, so the test sets `VLLM_TARGET_DEVICE=cpu` (parsing only). A
second test checks that 0.33.0's parser refuses `pass_config.enable_sp`, as its engine entry says.
"""


def _gate_table(gates: Sequence[Gate]) -> list[str]:
    """A markdown table of gates: what, set by which keys (or setting), what happens if not, source."""
    out = ["| gate | set by | if not | source |", "| --- | --- | --- | --- |"]
    for g in gates:
        keys = ", ".join(f"`{k}`" for k in g.keys) or g.setting
        out.append(f"| {g.text} | {keys} | {g.effect} | {g.source.cite()} |")
    return out


def _mode(m: Mode) -> list[str]:
    out = [f"### `{m.name}`: {m.summary}", ""]
    if not m.exists:
        out += ["This version has no such mode.", ""]
    if m.flags:
        out += ["Flags: " + ", ".join(f"`{f}`" for f in m.flags) + ".", ""]
    for w in m.wiring:
        arch = ", ".join(w.architectures) or "-"
        plan = f"tpplan plan `{w.plan}`" if w.plan else "no tpplan plan equals it"
        out += [f"**{', '.join(w.model_types)}** ({arch}), {w.layers}; {plan}. Source: {w.source.cite()}.", ""]
        if w.dataflow:
            out += ["| step | rows / collective | tensor | width | source |", "| --- | --- | --- | --- | --- |"]
            for s in w.dataflow:
                if isinstance(s, Comm):
                    out.append(f"| **{s.collective}** | collective | {s.tensor} | {s.width} | {s.source.cite()} |")
                else:
                    out.append(f"| {s.name} | {s.rows} | | | |")
            out.append("")
        else:
            out += ["Per-layer dataflow: source: unread.", ""]
        out += [f"- differs in tpplan: {d}" for d in w.differences]
        if w.differences:
            out.append("")
    for n in m.not_wired:
        runs = "the server refuses" if n.runs == "refused" else f"runs `{n.runs}`"
        out += [f"**Not wired: {', '.join(n.model_types)}**: {runs}; {n.why} ({n.source.cite()}).", ""]
    if m.gates:
        out += [*_gate_table(m.gates), ""]
    if m.fallback != "-":
        out += [f"Fallback: {m.fallback} ({m.fallback_source.cite()}).", ""]
    out += [f"Derived by the engine: {d}." for d in m.derived]
    if m.derived:
        out.append("")
    return out


def _engine(ev: EngineVersion) -> list[str]:
    p = ev.pipeline
    out = [f"## `{ev.key}`: {ev.released}", ""]
    out += [f"Note: {n}" for n in ev.notes]
    if ev.notes:
        out.append("")
    for m in ev.modes:
        out += _mode(m)
    if ev.collectives is not None:
        c = ev.collectives
        out += [
            f"### NCCL's NVLS at the launch line's defaults (`{c.setting}`)",
            "",
            f"{c.text} ({c.source.cite()}). tpplan prices in-node collectives from the cluster's own curves, "
            "fitted constants and declared algorithms (`tpplan/cost/collective_pricer.py`); `--engine` adds the "
            "engine's tables only where the cluster states nothing, so a cluster priced with NVLS should be launched "
            "with " + (", ".join(f"`{f}`" for f in c.enable) or "NCCL's default") + " to run what was priced.",
            "",
        ]
    if ev.supports:
        out += ["### Options only some model classes run", "", "| option | model types | runs | how | source |",
                "| --- | --- | --- | --- | --- |"]  # fmt: skip
        runs = {True: "yes", False: "no: refused", None: "not known"}
        out += [f"| `{s.option}` | {', '.join(s.model_types)} | {runs[s.runs]} | {s.how} | {s.source.cite()} |"
                for s in ev.supports]  # fmt: skip
        out.append("")
    out += [
        "### Pipeline parallelism as this engine schedules it",
        "",
        f"- in flight: {p.in_flight} ({p.source.cite()})",
        f"- chunks of one prompt: {p.chunks_of_one_request} ({p.chunks_source.cite()})",
        f"- stage boundary: {p.boundary_for()} ({p.boundary_source.cite()})",
        f"- more sources: {'; '.join(s.cite() for s in p.more_sources)}",
        *(f"- not modelled: {n}" for n in p.not_modelled),
        f"- what tpplan assumes with `--engine {ev.key}`: {p.assumption(ev.engine + ' ' + ev.version)}.",
        "",
    ]
    return out + _serving(ev)


def _serving(ev: EngineVersion) -> list[str]:
    """What the version's release module states for the serving loop, the KV sizing and the P/D hand-off."""
    out = []
    if ev.scheduling is not None:
        r = ev.scheduling
        out += ["### The scheduler, as the serving loop reads it (`tpplan/simulate/`)", ""]
        out += [f"- {f.text} ({f.source.cite()})" for f in r.facts()]
        out += [f"- not modelled: {n}" for n in r.not_modelled] + [""]
    if ev.memory is not None:
        out += ["### KV-cache sizing at the launch line's defaults (`tpplan/cost/kv_capacity.py`)", ""]
        out += [f"- {f.text} ({f.source.cite()})" for f in ev.memory.facts] + [""]
        fabric = getattr(ev.memory, "pd_fabric", None)
        if fabric is not None:  # vLLM: a P/D server's connector may turn the extensible cache off
            out += [f"P/D servers ({fabric.connector}) on nodes without an IMEX channel:", ""]
            out += [f"- {f.text} ({f.source.cite()})" for f in fabric.facts] + [""]
    if ev.dp_attention_beside is not None:
        b = ev.dp_attention_beside
        runs = [
            f"beside {axis}: {'starts, no check refuses it' if ok else 'needs code'}"
            for axis, ok in (("PP", b.pp), ("prefill CP", b.cp))
        ]
        out += ["### DP attention beside PP and prefill CP (`tpplan/engines/recipes/`)", "", f"{'; '.join(runs)}.", ""]
        out += [f"- {f.text} ({f.source.cite()})" for f in b.facts] + [""]
    if ev.sparse_prefill is not None:
        out += ["### DSA's sparse MLA prefill, as the planner prices it (`tpplan/cost/sparse_attention.py`)", ""]
        out += [f"- {f.text} ({f.source.cite()})" for f in ev.sparse_prefill.facts] + [""]
    if ev.handoff is not None:
        h = ev.handoff
        words = (
            f"the {'decode server reserves the KV first' if h.decode_first else 'prefill server computes first'}; "
            f"the {'prefill side pushes' if h.push else 'decode side pulls'} the KV"
            f"{', chunk by chunk' if h.chunked_send else ' after the last chunk'}; the first output token comes "
            f"from the {'decode' if h.first_token_on_decode else 'prefill'} server"
        )
        out += ["### Prefill/decode disaggregation hand-off (`tpplan/simulate/disagg_loop.py`)", "",
                f"- {words}", *(f"- source: {s.cite()}" for s in h.sources), ""]  # fmt: skip
        if h.router is not None:
            out += ["P/D router (`tpplan/cost/routing.py`):", ""]
            out += [f"- {f.text} ({f.source.cite()})" for f in h.router.facts] + [""]
    elif ev.scheduling is not None:
        unread = "- not read for this version: the engine's default release's rule is used, with a note"
        out += ["### Prefill/decode disaggregation hand-off", "", unread, ""]
    return out


def _overlaps() -> list[str]:
    """The engines' micro-batch overlaps (`tpplan.engines.overlap`): plans `<plan>+tbo`, `<plan>+dbo`."""
    out = [
        "## Micro-batch overlap: SGLang two-batch overlap, vLLM dual-batch overlap",
        "",
        "Plans `<plan>+tbo` and `<plan>+dbo` (any plan with all-to-all experts). Both engines split a prefill",
        "batch in two and run the halves' MoE layers as three stages each, cut at the all-to-all (router",
        "and dispatch | experts and combine | shared experts and output), in the order A0 B0 A1 B1 A2 B2,",
        "so one half's all-to-all runs on the communication SMs while the other computes",
        "(`tpplan/cost/overlap.py` simulates that order).",
        "",
    ]
    for o in dict.fromkeys(o for ev in ENGINES.values() for o in version_overlaps(ev)):  # each version's, once
        models = ", ".join(o.model_types) if o.model_types is not None else "every model with all-to-all experts"
        out += [
            f"### `+{o.name}`: {o.engine}, {', '.join(f'`{f}`' for f in o.flags)}",
            "",
            f"- staged MoE layers: {models} ({o.schedule_source.cite()})",
            f"- dense layers: {o.dense_layers}",
            f"- split: {o.split}; below {o.min_tokens} tokens the batch runs whole ({o.split_source.cite()})",
            f"- SMs: the all-to-all keeps {o.comm_sms}; DeepGEMM runs on the rest ({o.sms_source.cite()}; "
            f"{DEEPEP_SMS.cite()})",
        ]
        if o.raises_for:
            out.append(f"- raises NotImplementedError for: {', '.join(o.raises_for)}")
        if o.refused is not None:
            r = o.refused
            kinds = [f"{r.model_words} ({', '.join(r.model_types)}: {r.model_source.cite()})"] if r.model_types else []
            refused = "; ".join([*r.axis_words, *kinds])
            out.append(f"- refused at startup: {refused} ({r.source.cite()}); no launch line")
        if o.runs_on and o.runs_on_source is not None:
            out.append(f"- where it starts: {o.runs_on} ({o.runs_on_source.cite()})")
        if o.shared_experts_source is not None:
            when = "before" if o.shared_experts_before_combine_wait else "after"
            out.append(f"- shared experts: {when} the combine's wait ({o.shared_experts_source.cite()})")
        if o.assumption:
            out.append(f"- what tpplan assumes: {o.assumption}")
        out += ["", *_gate_table(o.gates), ""]
    return out


def _async_tp() -> list[str]:
    """GEMM + collective fusion (`tpplan.engines.async_tp`): plans `<plan>+asynctp`."""
    out = [
        "## Async TP: GEMM + collective fusion",
        "",
        "Plans `<plan>+asynctp` (any plan with an all-gather feeding a GEMM or a GEMM feeding a reduce-scatter:",
        "the sequence-parallel plans; `tpplan/layout/fused_gemm.py`). Both patterns run as one PyTorch",
        "symmetric-memory op whose work `tpplan/cost/async_tp.py` simulates chunk by chunk:",
        "",
        f"- all-gather -> GEMM: {AG_DECOMPOSITION} ({AG_PIPELINE.cite()})",
        f"- GEMM -> reduce-scatter: {RS_DECOMPOSITION} ({RS_PIPELINE.cite()})",
        f"- volume: {VOLUME}",
        f"- peers: every rank maps its peers' buffers; {PEERS.cite()}: one NVLink domain (a node here)",
        f"- vLLM {vllm.VERSION} (and 0.33.0) has no async-TP or sequence-parallelism pass "
        f"({NO_VLLM_PASS.cite()}); the op "
        f"`vllm.patched_fused_scaled_matmul_reduce_scatter` is registered and called by nothing "
        f"({UNUSED_VLLM_OP.cite()}). Earlier main had one: `pass_config.fuse_gemm_comms` on top of "
        f"`enable_sp`, the same two torch ops (and FP8 scaled-mm variants for bf16 models), with piecewise "
        f"compilation only for sizes divisible by TP ({OLD_VLLM_PASS.cite()})",
        "",
    ]
    for f in FUSIONS:
        priced = "what `+asynctp` prices" if f.priced else "recorded, not priced: not torch's chunk pipeline"
        out += [
            f"### {f.engine}: {', '.join(f'`{x}`' for x in f.flags)} ({priced})",
            "",
            f"- models: {', '.join(f.model_types)} ({f.model_gate.cite()})",
            *(f"- fused op: {s.cite()}" for s in f.ops),
            "",
            *_gate_table(f.all_gates),
            "",
        ]
    return out


def _context_parallel() -> list[str]:
    """The engines' prefill-CP paths (`tpplan.engines.context_parallel`) against tpplan's `--cp-layers` modes."""
    out = [
        "## Prefill context parallelism",
        "",
        "What each engine shards, gathers and keeps per CP rank (`tpplan/engines/context_parallel.py`).",
        "tpplan's modes: `--cp-layers all` (every layer on the rank's tokens, a TP group per CP rank) and",
        "`--cp-layers mla` (only the MLA layers token-sharded, inside the TP group). By default a CP rank's KV",
        "cache holds the whole sequence, as both engines keep it (they write the gathered K/V into every rank's",
        "cache: `--cp-kv engines`); `--cp-kv sharded` asks for tpplan's own count, KV / cp.",
        "",
    ]
    for p in CP_PATHS:
        where = "" if p.in_release else " (open PR, not in the release)"
        out += [
            f"### {p.engine}: {p.name}{where}",
            "",
            f"- flags: {', '.join(f'`{f}`' for f in p.flags)}; models: {p.models}",
            f"- token-sharded: {p.token_sharded}; split: {p.split}",
            f"- exchange: {p.exchange}",
            f"- FFN / MoE: {p.ffn}",
            f"- KV per rank: {p.kv_per_rank} ({p.kv_source.cite()})",
            f"- sources: {'; '.join(s.cite() for s in p.sources)}",
            f"- tpplan mode: {f'`--cp-layers {p.tpplan_mode}`' if p.tpplan_mode else 'none'}",
            *(f"- differs: {d}" for d in p.differences),
        ]
        if p.gates:
            out += ["", *_gate_table(p.gates)]
        out.append("")
    return out


def _citations() -> list[str]:
    """What every citation above is pinned to (`tpplan.engines.citations`), and every unread one with why."""
    refs = {(kind(s), s.repo, s.ref) for s in held() if s.read}
    out = [
        "## Citations: what each fact was read at",
        "",
        "Every `Source` the engine records hold (`tpplan/engines/citations.py` walks them), by what it is pinned",
        "to: a release (its PyPI wheel or source distribution), a commit, or an open pull request's description;",
        "`tests/engines/test_citations.py` refuses any other. SGLang's P/D router is its own package: read in",
        "the source distribution of sglang-router 0.3.2 (`pip download --no-binary sglang-router",
        "sglang-router==0.3.2`, the Rust crate sgl-model-gateway 0.3.2; SGLang 0.5.23's P/D test fixture",
        "launches `sglang_router.launch_router`). vLLM's P/D proxy lives in the repository's tests, not the",
        "wheel: read in 0.34.0's source distribution, whose `vllm/_version.py` names commit 62d4bc3c (as the",
        "wheel's does). A release's record cites that release, another package's release or unread, save the",
        "older revisions it names beside the release for the same fact (the test's `OLDER_BESIDE_RELEASE`);",
        "records of main revisions (`sglang@main@...`, `vllm@main@...`) cite those commits.",
        "",
        "| pinned to | repository | reference |",
        "| --- | --- | --- |",
    ]
    order = {"release": 0, "commit": 1, "pull request": 2}
    for k, repo, ref in sorted(refs, key=lambda r: (order.get(str(r[0]), 3), r[1:])):
        out.append(f"| {k or 'nothing'} | {repo} | {ref} |")
    out += ["", "Unread (`Source.unread`, every call in the code), and why:", ""]
    for c in unread_calls():
        where = f"`{c.path}`" + (f" `{c.function}`" if c.function else "")
        out.append(f"- {where}: {c.what} ({c.why or 'no reason given'})")
    return [*out, ""]


def render() -> str:
    """The whole of docs/engines.md."""
    lines = [INTRO]
    for ev in ENGINES.values():
        lines += _engine(ev)
    lines += _overlaps()
    lines += _async_tp()
    lines += _context_parallel()
    lines += _citations()
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
