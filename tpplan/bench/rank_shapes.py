"""The per-rank shapes a GPU sweep times: what one rank of TP 1-32 (and EP 4-32) runs for each model family.

Why: the kernel models were fitted on whole-model (TP1) shapes, while the deployments the memo ranks run
TP8-32, where a rank holds few heads and thin expert slices (issue 34). This module reads the packaged
model presets through the planner's own graph (`build_model_graph`) and lists, per op class, the distinct
per-rank shapes those deployments give: heads per rank for attention and the recurrences, the
intermediate slice (TP) or expert slice (EP) of the routed experts, the norms' and convs' widths and the
small GEMMs of a column- or row-split projection. Torch-free, so the CPU tests check the list and
`rank_sweep` (GPU) times it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tpplan.mesh import Mesh

TPS = (1, 2, 4, 8, 16, 32)
EPS = (4, 8, 16, 32)
# The families of the project: MLA+KDA (Kimi-K3, Kimi-Linear), MLA (DeepSeek-V3, Kimi-K2), DSA (GLM-5.1,
# DeepSeek-V3.2), GQA (Llama-3, Qwen3, gpt-oss), GDN (Qwen3-Next, Qwen3.5), MoE of every width and top-k.
MODELS = (
    "kimi-k3", "kimi-linear-48b", "deepseek-v3", "glm-5.1", "gpt-oss-120b", "llama-3-70b", "qwen3-next-80b",
    "qwen3.5-397b-a17b", "glm-4.5-air", "mixtral-8x7b", "llama-4-maverick-17b-128e",
)  # fmt: skip
# The families whose attention hides keys: sliding windows (Gemma 3, gpt-oss with sinks), attention chunks
# (Llama 4) and DSA's indexer (GLM-5.1, DeepSeek-V3.2): issue 34's "per-rank sweep not run for them".
MASKED_MODELS = ("gemma-3-4b-it", "gpt-oss-120b", "llama-4-scout-17b-16e", "glm-5.1", "deepseek-v3.2")
# The keys of a `Mixer.kernel_shape` a TP rank runs its share of (the rest are per head).
SPLIT = ("heads", "channels")
# Routed-expert weights of one rank above this are not allocated (the card also holds the activations).
MAX_EXPERT_BYTES = 24e9


def per_rank(n: int, mesh: Mesh) -> int:
    """Heads (or channels) one rank of `mesh`'s TP group holds: the planner's `max(1, round(n / tp))`."""
    return max(1, round(n / mesh.tp))


def _graph(model: str) -> Any:
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    return build_model_graph(load_model(model))


def _dedupe(rows: Iterable[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r[x] for x in keys)
        if k in seen:
            seen[k]["models"] = sorted(set(seen[k]["models"]) | set(r["models"]))
        else:
            seen[k] = dict(r)
    return sorted(seen.values(), key=lambda r: tuple(r[x] for x in keys))


def model_rank_shapes(model: str, tps: Iterable[int] = TPS, eps: Iterable[int] = EPS) -> dict[str, list[dict]]:
    """Per-rank shapes of one model's attention, recurrence, experts, norm and conv ops at each TP / EP: a
    mixer timed as its own family (`Mixer.kernel_shape`: KDA, GDN, short conv) under its name."""
    from tpplan.models.opkinds import cost_class, mixer, mixer_names, mixer_of

    g = _graph(model)
    swept = [n for n in mixer_names() if mixer(n).kernel_shape is not None]
    out: dict[str, list[dict[str, Any]]] = {
        k: [] for k in ("attention", *swept, "experts", "norm", "masked", "indexer")
    }
    tps, eps = tuple(tps), tuple(eps)
    meshes = [Mesh(tp) for tp in tps]
    tag = {"models": [model]}
    for lg in g.kinds.values():
        out["norm"].append({"width": lg.hidden, **tag})
        for op in lg.ops:
            cls, mx = cost_class(op), mixer_of(op)
            if mx is not None and mx.kernel_shape is not None:
                shape = mx.kernel_shape(op, lg.values)
                out[mx.name] += [{**{k: per_rank(v, m) if k in SPLIT else v for k, v in shape.items()}, **tag}
                                 for m in meshes]  # fmt: skip
            elif mx is not None and (mx.latent_kv or mx.head_kv):  # softmax attention over its cached keys
                heads = op.int_attr("heads", 1)
                dqk = lg.values[op.inputs[0]].width // heads
                dv = lg.values[op.output].width // heads
                out["attention"] += [{"heads": per_rank(heads, m), "dqk": dqk, "dv": dv, **tag} for m in meshes]
                out["masked"] += masked_shapes(op, dqk, meshes, model)
            elif (
                mx is not None and mx.topk_indexer
            ):  # replicated (`deepseek_v32._indexer_rule`): every head on every rank
                out["indexer"].append({"heads": op.int_attr("index_heads"), "d": op.int_attr("head_dim"),
                                       "topk": op.int_attr("topk"), **tag})  # fmt: skip
            elif cls == "experts":
                out["experts"] += expert_slices(op, tps, eps, model)
    return out


def masked_shapes(op: Any, d: int, meshes: list[Mesh], model: str) -> list[dict[str, Any]]:
    """A windowed or chunked attention op's heads per rank on each mesh's TP group (none for a full-causal op),
    with its KV heads per rank (GQA: fla's window kernel reads each once)."""
    window, chunk = op.optional_int_attr("window") or 0, op.optional_int_attr("chunk") or 0
    if not (window or chunk):
        return []
    heads, sinks = op.int_attr("heads", 1), bool(op.attrs.get("sinks"))
    kv = op.int_attr("kv_heads", heads)

    def kv_per_rank(m: Mesh) -> int:  # vLLM's max(1, kv // tp), or one per query head where they do not group
        q, k = per_rank(heads, m), max(1, kv // m.tp)
        return k if q % k == 0 else q

    return [{"heads": per_rank(heads, m), "d": d, "window": window, "chunk": chunk, "sinks": sinks,
             "kv_heads": kv_per_rank(m), "models": [model]} for m in meshes]  # fmt: skip


def expert_slices(op: Any, tps: tuple[int, ...], eps: tuple[int, ...], model: str) -> list[dict[str, Any]]:
    """The routed experts one rank runs: TP (every expert, intermediate / TP) and EP (experts / EP, whole)."""
    e, k = op.int_attr("experts"), op.int_attr("top_k")
    w, inter = op.int_attr("width"), op.int_attr("intermediate")
    rows = [{"experts": e, "local": e, "top_k": k, "width": w, "inter": max(1, inter // tp), "split": f"tp{tp}"}
            for tp in tps if inter // tp >= 32]  # fmt: skip
    rows += [{"experts": e, "local": e // ep, "top_k": k, "width": w, "inter": inter, "split": f"ep{ep}"}
             for ep in eps if e // ep >= 1 and e % ep == 0]  # fmt: skip
    return [{**r, "models": [model]} for r in rows if expert_bytes(r) <= MAX_EXPERT_BYTES]


def expert_bytes(r: dict[str, Any]) -> float:
    """bf16 gate, up and down weights of one rank's experts."""
    return 3.0 * r["local"] * r["width"] * r["inter"] * 2.0


def rank_shapes(models: Iterable[str] = MODELS, tps: Iterable[int] = TPS, eps: Iterable[int] = EPS) -> dict[str, list]:
    """The distinct per-rank shapes over `models`, per op class (each row lists the models it serves)."""
    tps, eps = tuple(tps), tuple(eps)
    acc: dict[str, list[dict[str, Any]]] = {}
    for m in models:
        for fam, rows in model_rank_shapes(m, tps, eps).items():
            acc.setdefault(fam, []).extend(rows)
    keys = {"attention": ("dqk", "dv", "heads"), "kda": ("d", "heads"), "gdn": ("d", "v_per_k", "heads"),
            "experts": ("experts", "local", "top_k", "width", "inter"), "norm": ("width",),
            "short_conv": ("channels",), "masked": ("d", "window", "chunk", "sinks", "heads", "kv_heads"),
            "indexer": ("heads", "d", "topk")}  # fmt: skip
    # a family without its row order here (a newly swept mixer) sorts by its shape's keys, alphabetically
    return {fam: _dedupe(rows, keys.get(fam) or tuple(sorted({*rows[0]} - {"models"}) if rows else ()))
            for fam, rows in acc.items()}  # fmt: skip


def heads_bucket(h: float) -> str:
    """The heads-per-rank bucket the fit's error is reported by: 1-2, 3-4, 5-8, 9-16, 17-32, 33+."""
    for hi, name in ((2, "1-2"), (4, "3-4"), (8, "5-8"), (16, "9-16"), (32, "17-32")):
        if h <= hi:
            return name
    return "33+"


def tokens_bucket(t: float) -> str:
    """1K, 2K, 4K, 8K, 16K, 32K (rounded to the nearest power of two in K)."""
    for hi, name in ((1536, "1K"), (3072, "2K"), (6144, "4K"), (12288, "8K"), (24576, "16K")):
        if t <= hi:
            return name
    return "32K"


__all__ = [
    "EPS",
    "MASKED_MODELS",
    "MAX_EXPERT_BYTES",
    "MODELS",
    "TPS",
    "expert_bytes",
    "expert_slices",
    "heads_bucket",
    "masked_shapes",
    "model_rank_shapes",
    "per_rank",
    "rank_shapes",
    "tokens_bucket",
]
