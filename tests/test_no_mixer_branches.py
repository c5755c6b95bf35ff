"""No code outside the op-kind registry and the lowering passes branches on a token mixer's name. Issue 30.

What a token mixer means to a caller (keeps MLA's latent KV cache, split by `--cp-layers mla`, a
per-channel gated recurrence, its KV and state bytes, its cost class) is stated once, by its `Mixer` in
the family module that registers it (`tpplan.models.opkinds.mixer(attn.kind).latent_kv`,
`mixer_of(op).cp_layers_mla`, ...), so a new mixer is written in one place instead of in every
`if attn.kind == "mla"` across the package. The sibling of `tests/test_no_opkind_branches.py`.

The rule, exactly: in every module of `tpplan/` outside `tpplan/models/` and `tpplan/lower/passes/`, no
comparison (`==`, `!=`, `in`, `not in`, `is`, `is not`) has an operand that reads a mixer's name: an
attention spec's kind (`<x>.attn.kind`), a TOKEN_MIX op's impl (`<x>.attrs.get("impl")`,
`<x>.attrs["impl"]`, either inside `str(...)`), or a local named `impl` (what those are read into) where
the other operand names a registered mixer (a literal, or a collection of them) or is a module constant
(`MLA_IMPLS`): kernel implementations are called `impl` too. No `match` on one either.

`PENDING` holds, per module, how many such comparisons it still has; the count may only go down
(lower it in the commit that converts them, drop the entry at zero). The goal is an empty `PENDING`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ratchet import assert_ratchet

from tpplan.models.opkinds import mixer_names

PACKAGE = Path(__file__).resolve().parents[1] / "tpplan"
ALLOWED = ("models/", "lower/passes/")  # the registry (and the families that register mixers) and the passes

# module: comparisons on a mixer's name it still has (2026-12-06: 32 in 9 modules, then 7 in 3; now none). The last
# ones stood for `Mixer.head_kv` (the kernel pricer's GQA decode fit, bench/slice_memory's GQA cache),
# `Mixer.topk_indexer` (DSA's indexer in the bench's tables and cache) and `Mixer.kernel_shape` (the bench's
# per-mixer KDA / GDN / short conv tables).
PENDING: dict[str, int] = {}

_OPS = (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn)
MIXERS = set(mixer_names())


def _names_a_mixer(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in MIXERS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_mixer(e) for e in node.elts)
    return isinstance(node, ast.Name) and node.id.isupper()


def _reads_a_mixer_name(node: ast.expr) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
        return _reads_a_mixer_name(node.args[0])
    if isinstance(node, ast.Attribute) and node.attr == "kind":  # <x>.attn.kind, attn.kind
        inner = node.value
        return (isinstance(inner, ast.Attribute) and inner.attr == "attn") or (
            isinstance(inner, ast.Name) and inner.id == "attn"
        )
    if isinstance(node, ast.Subscript):  # <x>.attrs["impl"]
        key = node.slice
        return _is_attrs(node.value) and isinstance(key, ast.Constant) and key.value == "impl"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        key = node.args[0] if node.args else None  # <x>.attrs.get("impl")
        return _is_attrs(node.func.value) and isinstance(key, ast.Constant) and key.value == "impl"
    return False


def _is_attrs(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "attrs") or (
        isinstance(node, ast.Name) and node.id == "attrs"
    )


def _is_impl(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "impl"


def _compares_a_mixer_name(operands: tuple[ast.expr, ...]) -> bool:
    if any(_reads_a_mixer_name(e) for e in operands):
        return True
    return any(_is_impl(e) for e in operands) and any(_names_a_mixer(e) for e in operands if not _is_impl(e))


def mixer_branches(source: str) -> list[int]:
    """Line of each comparison in `source` with an operand reading a mixer's name, and of each `match` on one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Match):
            hit = _reads_a_mixer_name(node.subject) or (
                _is_impl(node.subject)
                and any(isinstance(c.pattern, ast.MatchValue) and _names_a_mixer(c.pattern.value) for c in node.cases)
            )
        elif isinstance(node, ast.Compare):
            operands = (node.left, *node.comparators)
            hit = any(isinstance(o, _OPS) for o in node.ops) and _compares_a_mixer_name(operands)
        else:
            hit = False
        if hit:
            found.append(node.lineno)
    return sorted(found)


def checked_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not p.relative_to(PACKAGE).as_posix().startswith(ALLOWED)]


def test_no_mixer_name_branches_outside_the_registry():
    hits = [
        (rel, f"{rel}:{line}")
        for path in checked_modules()
        for rel in [path.relative_to(PACKAGE).as_posix()]
        for line in mixer_branches(path.read_text())
    ]
    fix = "ask the mixer's traits (tpplan.models.opkinds.mixer / mixer_of), not its name"
    assert_ratchet(hits, PENDING, fix, "mixer-name branches")


def test_the_scan_sees_every_way_to_read_a_mixer_name():
    """An attention spec's kind, a TOKEN_MIX op's impl (get, subscript, str()), a local `impl`, and
    match; not an MLP spec's kind, other attrs, or a name as data."""
    source = (
        "a = layer.attn.kind == 'mla'\n"
        "b = attn.kind in ('mla', 'dsa')\n"
        "c = op.attrs.get('impl') == 'mla'\n"
        "d = str(op.attrs.get('impl')) in ('kda', 'gdn')\n"
        "e = op.attrs['impl'] != 'kda'\n"
        "f = impl == 'gqa'\n"
        "g = layer.mlp.kind == 'moe'\n"
        "h = op.attrs.get('bias') == 1\n"
        "i = mixer('mla')\n"
        "j = {'mla': 1}[op.attrs.get('impl')]\n"
        "k = impl in MLA_IMPLS\n"
        "l = impl == 'cascade'\n"
        "match impl:\n"
        "    case 'gqa': pass\n"
    )
    assert mixer_branches(source) == [1, 2, 3, 4, 5, 6, 11, 13]


def test_the_traits_follow_the_mixer_s_structure():
    """On tiny presets of each mixer: a latent KV cache exactly where the layer's attention is MLA (or MLA
    inside DSA), and on the ops that read that latent; `--cp-layers mla` exactly on plain MLA; the
    per-channel gate exactly on KDA; per-head K/V exactly on the softmax attention that keeps no latent, with
    k and v at its KV heads; the top-k indexer feeding the sparse attention's fourth input; the state hand-off
    is the recurrences' CP method, with the state's shape; a kernel shape of its own exactly on the mixers the
    pricer times apart from attention (recurrences, the short conv)."""
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.models.opkinds import mixer, mixer_of
    from tpplan.models.spec import KDASpec, MLASpec

    seen, latent_ops, indexed = set(), set(), 0
    tiny = ("deepseek-v3", "deepseek-v32", "kimi-linear", "qwen3-next", "llama", "glm4-moe", "minimax-m2")
    for name in (f"tiny-{t}" for t in tiny):
        graph = build_model_graph(load_model(name))
        for lg in graph.kinds.values():
            attn, m = lg.spec.attn, mixer(lg.spec.attn.kind)
            seen.add(attn.kind)
            latent = isinstance(attn, MLASpec) or isinstance(getattr(attn, "mla", None), MLASpec)
            assert m.latent_kv is latent
            assert m.cp_layers_mla is isinstance(attn, MLASpec)
            assert m.channel_gated is isinstance(attn, KDASpec)
            assert m.sparse_topk is (latent and not isinstance(attn, MLASpec))  # DSA: MLA inside, indexed
            assert m.head_kv is (m.cost == "attention" and not latent)
            sparse = [op for op in lg.ops if (mx := mixer_of(op)) is not None and mx.sparse_topk]
            for op in lg.ops:
                mx = mixer_of(op)
                if mx is not None and mx.latent_kv:
                    assert latent and "kv_latent" in lg.values, (name, op.name)
                    latent_ops.add(mx.name)
                if mx is not None and mx.head_kv:
                    kv = op.int_attr("kv_heads") * op.int_attr("head_dim")
                    assert m.head_kv and [lg.values[v].width for v in op.inputs[1:3]] == [kv, kv], (name, op.name)
                if mx is not None and mx.topk_indexer:
                    assert [s.inputs[3] for s in sparse] == [op.output], (name, op.name)
                    indexed += 1
    assert {"mla", "dsa", "kda", "gqa", "gdn", "gqa_qkv_bias", "gqa_wide_norm"} <= seen
    assert latent_ops == {"mla", "mla_dsa"} and indexed > 0  # met both ways
    for n in mixer_names():  # a CP state hand-off knows the state's shape; only recurrences hand one on
        m = mixer(n)
        assert (m.cp == "state") is (m.state_dims is not None) is (m.cost == "recurrence"), n
        assert (m.kernel_shape is not None) is (m.cost in ("recurrence", "elementwise")), n
