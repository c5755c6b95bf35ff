"""The measured axes of AIConfigurator's tables, which the adapter (`aic.AicSource`) checks a question
against before asking AIC's engine: which weight formats a table holds, and the measured range of
each size axis (GEMM m/n/k; attention heads, tokens, batches per layout; MoE tokens per configuration;
collective message sizes per group).

Why a file of its own: AIC's engine answers a question from its compiled tables in milliseconds once
loaded (about 2 s per op family), but the nested Python mappings the adapter used to read these axes
from (`PerfDatabase._<family>_data`, rebuilt from the engine's table view on every load) cost 5-15 s
per family on a 2-core machine: more than everything else a cold `--engine` run does. The axes are a
few hundred KB per database, built once from those mappings on first use and kept in the database's
answer file (`aic_cache`: per system x engine x version, invalidated by the package version and the
adapter's digest, which covers this module), so a question the answer file lacks costs the engine's
own load only. Built from the very mappings the adapter read before, so every decision (format,
inside/outside/beyond `FAR`) is the same; tests/cost/test_aic_cache.py checks prices with and without
the file.

Keys of the mappings (ints, or a routing distribution's name) are joined with "/" into one string
per layout, as JSON wants; `axis_key` writes a number as Python's `int` does, so a lookup by the
shape's integers finds what the mapping's own lookup found.
"""

from __future__ import annotations

from typing import Any

Range = tuple[float, float]  # (first, last) measured value of one axis


def keys(d: Any) -> list[Any]:
    """The keys of one level of AIC's nested mappings ([] for a leaf or None)."""
    return list(d.keys()) if d is not None and hasattr(d, "keys") else []


def union_keys(nodes: list[Any]) -> list[Any]:
    out: set[Any] = set()
    for n in nodes:
        out.update(keys(n))
    return sorted(out)


def children(nodes: list[Any]) -> list[Any]:
    return [n[k] for n in nodes for k in keys(n)]


def outside(value: float, lo: float, hi: float) -> float:
    """How many times outside [lo, hi] `value` lies (1.0 inside)."""
    if value > hi:
        return value / hi
    if 0 < value < lo:
        return lo / value
    return 1.0


def axis_key(*parts: Any) -> str:
    """One layout's key: its mapping keys joined by "/" (integral numbers as ints, names by `.name`)."""

    def one(p: Any) -> str:
        if isinstance(p, bool):
            return str(p)
        if isinstance(p, int | float) and float(p).is_integer():
            return str(int(p))
        return str(getattr(p, "name", p))

    return "/".join(one(p) for p in parts)


def _span(values: list[Any]) -> list[Any] | None:
    return [values[0], values[-1]] if values else None


def _names(view: Any) -> list[str]:
    return [str(getattr(k, "name", k)) for k in keys(view)]


def _pick(view: Any, name: str) -> Any | None:
    """The key of `view` whose name is `name`, or None."""
    return next((k for k in keys(view) if str(getattr(k, "name", k)) == name), None)


def reach_axes(by_heads: Any) -> list[Any] | None:
    """[[heads], [tokens], [batches]] first and last measured values of an attention layout, or None
    where it has no rows."""
    heads = sorted(keys(by_heads))
    if not heads:
        return None
    tokens = union_keys([by_heads[h] for h in heads])
    batches = union_keys(children([by_heads[h] for h in heads]))
    return [_span(heads), _span(tokens), _span(batches)]


def reach(axes: list[Any], heads: int, tokens: int, batch: int) -> float:
    """How far a shape lies outside an attention layout's measured axes (the largest factor; 1.0 inside)."""
    (h0, h1), (t0, t1), (b0, b1) = axes
    return max(outside(heads, h0, h1), outside(tokens, t0, t1), outside(batch, b0, b1))


def _gemm(view: Any) -> dict[str, Any]:
    """{quant name: [[m first, last], [n ...], [k ...]]}."""
    out = {}
    for quant in keys(view):
        by_m = view[quant]
        ms = sorted(keys(by_m))
        ns_nodes = [by_m[m] for m in ms]
        out[str(quant.name)] = [_span(ms), _span(union_keys(ns_nodes)), _span(union_keys(children(ns_nodes)))]
    return out


def _bf16_pair(view: Any) -> Any | None:
    """The bfloat16 FMHA x bfloat16 KV-cache node of an attention table, the only one priced."""
    fmha = _pick(view, "bfloat16")
    kv = _pick(view[fmha], "bfloat16") if fmha is not None else None
    return view[fmha][kv] if kv is not None else None


def _context_attention(view: Any) -> dict[str, Any]:
    """{"layouts": {"kv heads/head_dim/window": reach axes}} of the bf16 x bf16 rows ({} without)."""
    node = _bf16_pair(view)
    if node is None:
        return {}
    layouts = {
        axis_key(kv, dim, window): reach_axes(node[kv][dim][window])
        for kv in keys(node)
        for dim in keys(node[kv])
        for window in keys(node[kv][dim])
    }
    return {"layouts": layouts}


def _context_mla(view: Any) -> dict[str, Any]:
    """{"axes": reach axes} of the bf16 x bf16 rows ({} without)."""
    node = _bf16_pair(view)
    return {} if node is None else {"axes": reach_axes(node)}


def _moe(view: Any) -> dict[str, Any]:
    """{"quants": [names], "tokens": [distinct measured token lists], "configs": {"quant/distribution/
    top_k/experts/hidden/intermediate/tp/ep": index into tokens}}."""
    lists: dict[tuple[Any, ...], int] = {}
    configs: dict[str, int] = {}

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        if len(path) == 8:
            tokens = tuple(sorted(keys(node)))
            configs[axis_key(*path)] = lists.setdefault(tokens, len(lists))
            return
        for k in keys(node):
            walk(node[k], (*path, k))

    walk(view, ())
    return {"quants": _names(view), "tokens": [list(t) for t in lists], "configs": configs}


def _nccl(view: Any) -> dict[str, Any]:
    """{op: {GPUs: [first, last] half elements}} of the half-precision rows."""
    half = _pick(view, "half")
    if half is None:
        return {}
    return {str(op): {axis_key(n): _span(sorted(keys(view[half][op][n]))) for n in keys(view[half][op])}
            for op in keys(view[half])}  # fmt: skip


def _custom_allreduce(view: Any) -> dict[str, Any]:
    """{GPUs: [first, last] half elements} of the half-precision rows (over AIC's strategy level)."""
    half = _pick(view, "half")
    if half is None:
        return {}
    return {axis_key(n): _span(union_keys(children([view[half][n]]))) for n in keys(view[half])}


BUILD = {
    "gemm": _gemm,
    "context_attention": _context_attention,
    "context_mla": _context_mla,
    "moe": _moe,
    "nccl": _nccl,
    "custom_allreduce": _custom_allreduce,
}


def build_axes(family: str, view: Any) -> dict[str, Any]:
    """The axes of one op family's table from AIC's view of it ({} where it has no rows)."""
    return {} if view is None else BUILD[family](view)


__all__ = ["BUILD", "axis_key", "build_axes", "keys", "outside", "reach", "reach_axes", "union_keys"]
