"""Render one layer of each kind as a dataflow, in the style of the seed memo's arrows:

    delta P  --AR-->  R
    attn_add(resid R, delta R) -> resid_mid R
    attn_norm(resid_mid R) -> x R
    qkv_a [replicated, x R] -> qkv_latent R
    ...

Each line is one op: its weight placement, the placements it receives, what it produces, and
the collectives issued on its inputs. Illegal ops are marked with `!!` and their reason.
"""

from __future__ import annotations

from tpplan.layout.context_parallel import CpAudit
from tpplan.layout.propagate import LayerResult
from tpplan.models.opkinds import op_kind
from tpplan.placement import Placement

_SPLIT_WORDS = {
    "col": "column-parallel",
    "row": "row-parallel",
    "replicated": "replicated",
    "tp": "experts TP",
    "ep": "experts EP",
    "a2a": "experts all-to-all",
}


def explain_layer(res: LayerResult, width_of: dict[str, int]) -> list[str]:
    """Lines describing one propagated layer."""
    lines: list[str] = []
    comms_by_consumer: dict[str, list[str]] = {}
    for c in res.comms:
        if c.internal:
            continue
        comms_by_consumer.setdefault(c.consumer, []).append(
            f"  {c.value}[{c.width}] {c.src} --{c.collective.short}--> {c.dst}   ({c.reason}; {c.units:g} units)"
        )
    bad = {v.op: v for v in res.violations}
    for d in res.decisions:
        op = d.op
        for line in comms_by_consumer.get(op.name, []):
            lines.append(line)
        ins = ", ".join(f"{v} {p}" for v, p in zip(op.inputs, d.inputs_received, strict=True))
        split = _SPLIT_WORDS.get(d.split, "")
        tag = f"[{split}] " if split and (op_kind(op.kind).linear or op_kind(op.kind).routed_experts) else ""
        out_pl: Placement = res.placements[op.output]
        mark = "!! " if not d.legal else "   "
        lines.append(f"{mark}{op.name} {tag}({ins}) -> {op.output}[{width_of.get(op.output, 0)}] {out_pl}")
        if op_kind(op.kind).routed_experts:
            for c in res.comms:
                if c.internal and c.consumer == op.name:
                    lines.append(f"      {c.value}[{c.width}] --A2A-->  ({c.reason}; {c.units:.0f} units)")
        if op.name in bad:
            v = bad[op.name]
            lines.append(f"      illegal: {v.reason}")
            for fix in v.fixes:
                lines.append(f"      fix: {fix}")
    return lines


def explain_cp(cpa: CpAudit, kind: str) -> list[str]:
    """Lines saying how a layer kind runs under context parallelism: its token split and what each
    token mixer exchanges over the CP group (`tpplan.layout.context_parallel`)."""
    ck = cpa.kinds[kind]
    split = {"zigzag": "zigzag (rank i: chunks i and 2c-1-i of 2c)", "contiguous": "contiguous (rank r: the r-th 1/c)",
             "none": "no token mixer needs the others' tokens"}[ck.split]  # fmt: skip
    lines = [f"CP{cpa.cp}: tokens split {split}"]
    if cpa.layers == "mla":
        lines = [f"CP{cpa.cp} inside TP{cpa.tp}, MLA layers only: " + (
            f"attention on the rank's zigzag rows at attention TP {cpa.attn_tp}" if ck.split != "none"
            else "the full sequence, TP as planned")]  # fmt: skip
        for op, times in ck.replicated:
            lines.append(f"  {op}: every rank expands K/V for every key ({times}x its TP share)")
        for v in ck.replaces:
            lines.append(f"  the plan's collective on {v} is replaced by the CP exchanges below")
    words = {
        "kv_all_gather": "all-gathers K and V over the CP group",
        "latent_all_gather": "all-gathers the compressed latent (kv_lora + rope key) over the CP group",
        "state_scan": "two-pass scan: local scan, all-gather of chunk states and transitions, correction",
        "state_serial": f"serial hand-off: waits for the previous rank's final state ({cpa.cp - 1} steps in a chain)",
        "conv_halo": "receives the previous rank's last conv_kernel-1 inputs (halo)",
        "attn_tp_all_reduce": f"all-reduces its rows' partial sums over the {cpa.attn_tp} attention-TP ranks",
        "output_all_gather": "all-gathers the attention output rows over the CP group (the full sequence again)",
    }
    for x in ck.exchanges:
        size = f"{x.per_token:g} per token" if x.per_token else f"{x.per_seq:g} per sequence"
        lines.append(f"  {x.op}: {words[x.method]} ({'+'.join(x.values)}, {size} per TP rank)")
    lines.extend(f"!! CP illegal: {r}" for r in ck.reasons)
    return lines
