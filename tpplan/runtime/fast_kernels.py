"""GPU fast paths for the reference kernels in `tpplan.runtime.kernels`.

The references are written for clarity and exactness; on CUDA they dominate per-layer time (the chunked
delta rule alone is ~1000x an fla-class kernel). `kernels.py` dispatches here with one line per op when
`use(x, op)` holds: the tensor is on CUDA, `TPPLAN_FAST_KERNELS` is not "0", no `disabled()` block is
active, and (for fla-backed ops) `fla` imports. On CPU the references run unchanged.

What each fast path maps to and its numerical contract (fp32 inputs: equal to fp32 rounding unless noted;
bf16 inputs: within bf16 rounding of the reference, which computes in fp32 from the same bf16 inputs):

- `kda`: `fla.ops.kda.chunk_kda` with the gate -exp(A_log)*softplus(f + dt_bias), sigmoid(beta) and the
  q/k L2 norm (eps 1e-6, x/sqrt(sum x^2 + eps)) fused in the kernel, scale d^-1/2, fp32 state
  [H, dk, dv] carried across chunks via initial_state/output_final_state. fla's softplus uses
  ex2/lg2.approx and its tl.dot may use TF32 for fp32 inputs: expect ~1e-3 relative, not 1e-6.
  `TPPLAN_FLA_FUSED_GATE=0` computes g and beta in torch (fp32) instead and passes them precomputed.
- `gdn`: `fla.ops.gated_delta_rule.chunk_gated_delta_rule` (GVA: v head h reads key head h // r, as ours),
  same fusions; conv and gated output norm use the fast paths below.
- `short_conv`: fla's Triton `causal_conv1d` (the serving kernel of fla-based engines: one pass, the
  previous K-1 rows read from its initial state, SiLU fused, fp32 accumulation) when fla has it on
  CUDA; else one depthwise `F.conv1d` in the input dtype over [prev K-1 rows | chunk], activation in
  fp32. The state keeps the last K-1 input rows either way.
- `rms_norm` / `head_rms_norm`: fla's fused Triton RMSNorm / gated RMSNorm (fp32 math, weight in fp32,
  one read and one write) when fla imports on CUDA, else a lean torch path (`vector_norm` in fp32
  straight from the input dtype, no full-size fp32 copy of x).
- `causal_attention` (MLA and GQA core): `F.scaled_dot_product_attention` with a lower-right causal
  mask (queries are the last T of S positions), fp32 accumulation inside the backend. In bf16/fp16 on
  CUDA a narrower v (MLA 128 vs q/k 192) is zero-padded so the flash backend applies
  (`TPPLAN_SDPA_PAD_V=0` leaves SDPA to pick mem-efficient instead).
- `attn_res`: fla's fused AttnRes kernel (`fla.ops.attnres.fused_attnres`: one read of every row, online
  softmax over depth in fp32) when fla has it on CUDA; its sources must be contiguous, so the bank's
  snapshots (token-major [T, nb, H] here) are copied out first. Else the same depth softmax in torch
  with one fp32 copy of the rows: the score of a row is (row . w) * rstd(row).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tpplan.runtime.activations import unary

FLA_OPS = frozenset({"kda", "gdn"})
_DISABLED = [0]
_FORCED = [0]


@functools.cache
def fla_available() -> bool:
    """Whether fla's ops import (they need triton; the kernels themselves only run on CUDA)."""
    try:
        import fla.modules.norm.fused_norm_gate
        import fla.modules.norm.layernorm
        import fla.ops.gated_delta_rule
        import fla.ops.kda  # noqa: F401
    except Exception:  # ImportError, or triton failing to initialise without a GPU
        return False
    return True


def fast_enabled() -> bool:
    """The global switch: env `TPPLAN_FAST_KERNELS=0` and `disabled()` turn every fast path off."""
    return not _DISABLED[0] and os.environ.get("TPPLAN_FAST_KERNELS", "1") != "0"


def use(x: Tensor, op: str) -> bool:
    """Dispatch predicate for `kernels.py`: fast path only on CUDA, when enabled, with fla if `op` needs it."""
    if not (x.is_cuda or _FORCED[0]) or not fast_enabled():
        return False
    return op not in FLA_OPS or fla_available()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the references even on CUDA (used by the self-check to compare against them)."""
    _DISABLED[0] += 1
    try:
        yield
    finally:
        _DISABLED[0] -= 1


@contextlib.contextmanager
def forced() -> Iterator[None]:
    """Take the fast paths on CPU too (tests and the CPU smoke run; fla ops still need fla)."""
    _FORCED[0] += 1
    try:
        yield
    finally:
        _FORCED[0] -= 1


def _fla_norms() -> bool:
    return fla_available() and os.environ.get("TPPLAN_FLA_NORMS", "1") != "0"


@functools.cache
def fla_has(module: str) -> bool:
    """Whether fla (and this fla version) has `module`: attnres and causal_conv1d came after kda."""
    if not fla_available():
        return False
    try:
        importlib.import_module(module)
    except Exception:  # an older fla, or triton failing to initialise
        return False
    return True


_IMPORT_FAILURES: dict[str, str] = {}  # "module.name" -> why `optional_callable` returned None


@functools.cache
def optional_callable(module: str, name: str) -> Any | None:
    """`module.name` where `module` imports, else None: a GPU kernel whose library (fla, triton) may be absent
    or fail to initialise without a GPU. Imported once per process; why it failed: `import_failure`."""
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as exc:  # ImportError, a missing name, or triton failing to initialise
        _IMPORT_FAILURES[f"{module}.{name}"] = f"{type(exc).__name__}: {exc}"[:300]
        return None


def import_failure(module: str, name: str) -> str | None:
    """Why `optional_callable(module, name)` returned None in this process (None if it did not fail)."""
    return _IMPORT_FAILURES.get(f"{module}.{name}")


FLA_CONV = "fla.modules.causal_conv1d"
FLA_ATTNRES = "fla.ops.attnres"


def fla_enabled(module: str, switch: str) -> bool:
    """fla has the kernel `module` and env `switch` does not turn it off (not "0")."""
    return os.environ.get(switch, "1") != "0" and fla_has(module)


def fla_kernel(x: Tensor, module: str, switch: str) -> bool:
    """Take fla's kernel `module` for x: on CUDA and `fla_enabled`."""
    return x.is_cuda and fla_enabled(module, switch)


# ----------------------------------------------------------------------------------------------
# Norms


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """`kernels.rms_norm`: fused fla RMSNorm on CUDA, else one fp32 reduction read from x's dtype."""
    w = weight.float() + offset if offset else weight.float()
    shape = x.shape
    if x.is_cuda and _fla_norms():
        from fla.modules.norm.layernorm import rms_norm as fla_rms_norm

        with torch.no_grad():
            y = fla_rms_norm(x.reshape(-1, shape[-1]).contiguous(), w.contiguous(), None, eps=eps)
        return y.reshape(shape)
    return _torch_rms(x, eps).mul_(w).to(x.dtype)


def _torch_rms(x: Tensor, eps: float) -> Tensor:
    """x * rsqrt(mean(x^2) + eps) in fp32, reading x once for the norm and once for the scale."""
    ss = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32).square_()
    return x * ss.div_(x.shape[-1]).add_(eps).rsqrt_()


def head_rms_norm(
    x: Tensor, weight: Tensor, eps: float, head_dim: int, gate: Tensor | None = None, gate_fn: str = "sigmoid"
) -> Tensor:
    """`kernels.head_rms_norm`: fla's fused (gated) RMSNorm over rows of head_dim, else lean torch."""
    t = x.shape[0]
    if x.is_cuda and _fla_norms():
        xr = x.reshape(-1, head_dim).contiguous()
        w = weight.float().contiguous()
        with torch.no_grad():
            if gate is None:
                from fla.modules.norm.layernorm import rms_norm as fla_rms_norm

                y = fla_rms_norm(xr, w, None, eps=eps)
            else:
                from fla.modules.norm.fused_norm_gate import rms_norm_gated

                act = "sigmoid" if gate_fn == "sigmoid" else "swish"
                y = rms_norm_gated(xr, gate.reshape(-1, head_dim).contiguous(), w, None, activation=act, eps=eps)
        return y.reshape(t, -1)
    y = _torch_rms(x.reshape(t, -1, head_dim), eps).mul_(weight.float())
    if gate is not None:
        g = gate.reshape(t, -1, head_dim).float()
        y.mul_(torch.sigmoid(g) if gate_fn == "sigmoid" else F.silu(g))
    return y.reshape(t, -1).to(x.dtype)


# ----------------------------------------------------------------------------------------------
# Short convolution


def short_conv(x: Tensor, weight: Tensor, state: dict[str, Tensor] | None = None, activation: str = "silu") -> Tensor:
    """`kernels.short_conv` by fla's causal_conv1d, else one depthwise conv in x's dtype; same K-1 row
    state contract."""
    w = weight.reshape(weight.shape[0], -1)
    kernel = w.shape[1]
    prev = state.get("conv") if state is not None else None
    if activation in ("silu", "swish", "") and kernel > 1 and fla_kernel(x, FLA_CONV, "TPPLAN_FLA_CONV"):
        return _fla_conv(x, w, prev, state, activation)
    if prev is None:
        prev = x.new_zeros(kernel - 1, x.shape[1])
    xx = torch.cat([prev.to(x.dtype), x], dim=0)
    if state is not None:
        state["conv"] = xx[-(kernel - 1) :] if kernel > 1 else xx[:0]
    y = F.conv1d(xx.t().unsqueeze(0), w.unsqueeze(1).to(x.dtype), groups=w.shape[0])[0].t()
    if not activation:
        return y.contiguous()
    return unary(y.float(), activation).to(x.dtype)


def _fla_conv(x: Tensor, w: Tensor, prev: Tensor | None, state: dict[str, Tensor] | None, activation: str) -> Tensor:
    """fla's causal_conv1d on [1, T, C]; its initial state [1, C, K] holds the previous K-1 input rows in
    columns 1..K-1 (oldest first; column 0 is never read). The carried state is taken from x directly."""
    from fla.modules.causal_conv1d import causal_conv1d

    kernel = w.shape[1]
    init = None
    if prev is not None:
        init = x.new_zeros(1, x.shape[1], kernel)
        init[0, :, 1:] = prev.to(x.dtype).t()
    if state is not None:
        if x.shape[0] >= kernel - 1:
            state["conv"] = x[-(kernel - 1) :]
        else:
            before = prev.to(x.dtype) if prev is not None else x.new_zeros(kernel - 1, x.shape[1])
            state["conv"] = torch.cat([before, x])[-(kernel - 1) :]
    with torch.no_grad():
        y, _ = causal_conv1d(x.unsqueeze(0), w.to(x.dtype).contiguous(), None, initial_state=init,
                             activation=activation or None)  # fmt: skip
    return y[0]


# ----------------------------------------------------------------------------------------------
# Gated delta rules (fla)


def _fused_gate() -> bool:
    return os.environ.get("TPPLAN_FLA_FUSED_GATE", "1") != "0"


def kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    f: Tensor,
    beta_logits: Tensor,
    *,
    head_dim: int,
    a_log: Tensor,
    dt_bias: Tensor,
    state: dict[str, Tensor] | None = None,
    chunk_size: int = 64,
) -> Tensor:
    """`kernels.kda` via `fla.ops.kda.chunk_kda` ([1, T, H, d] layout, fp32 state carried in `state`)."""
    from fla.ops.kda import chunk_kda

    t = q.shape[0]
    n = q.shape[1] // head_dim
    shp = (1, t, n, head_dim)
    prev = state.get("recurrent") if state is not None else None
    init = None if prev is None else prev.float().reshape(1, n, head_dim, -1).contiguous()
    qh, kh, vh = (z.reshape(shp).contiguous() for z in (q, k, v))
    a = a_log.float().reshape(n).contiguous()
    dtb = dt_bias.float().reshape(n * head_dim).contiguous()
    if _fused_gate():
        g, beta = f.reshape(shp).contiguous(), beta_logits.reshape(1, t, n).contiguous()
        extra = {"use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "A_log": a, "dt_bias": dtb}
    else:
        g = -a.reshape(1, 1, n, 1).exp() * F.softplus(f.float().reshape(shp) + dtb.reshape(1, 1, n, head_dim))
        beta, extra = torch.sigmoid(beta_logits.float()).reshape(1, t, n).to(q.dtype), {}
    o = _fla_chunk(chunk_kda, qh, kh, vh, g, beta, head_dim**-0.5, init, state, chunk_size, extra)
    return o.reshape(t, -1).to(q.dtype)


def _fla_chunk(
    fn: Any, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float, init: Tensor | None,
    state: dict[str, Tensor] | None, chunk_size: int, extra: dict[str, Any],
) -> Tensor:  # fmt: skip
    """One call of an fla chunked delta-rule kernel (`chunk_kda`, `chunk_gated_delta_rule`; same
    contract): q/k l2-normalised in the kernel, the final state kept in `state` when one is carried."""
    with torch.no_grad():
        o, s = fn(q, k, v, g, beta, scale=scale, initial_state=init, output_final_state=state is not None,
                  use_qk_l2norm_in_kernel=True, chunk_size=chunk_size, **extra)  # fmt: skip
    if state is not None:
        state["recurrent"] = s[0]
    return o


def gdn_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, b: Tensor, a: Tensor, a_log: Tensor, dt_bias: Tensor, v_per_k: int,
    state: dict[str, Tensor] | None, chunk_size: int,
) -> Tensor:  # fmt: skip
    """`kernels.gdn_delta_rule` via `fla.ops.gated_delta_rule.chunk_gated_delta_rule` with GVA (no
    repeat of q/k); `kernels.gdn` runs the conv and the gated norm around it."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    t, hv = q.shape[0], b.shape[1]
    ng = hv // v_per_k
    dk, dv = q.shape[1] // ng, v.shape[1] // hv
    b, a = b.reshape(1, t, hv), a.reshape(1, t, hv)
    qh, kh = (z_.reshape(1, t, ng, dk).contiguous() for z_ in (q, k))
    vh = v.reshape(1, t, hv, dv).contiguous()
    prev = state.get("recurrent") if state is not None else None
    init = None if prev is None else prev.float().reshape(1, hv, dk, dv).contiguous()
    a_log32, dtb = a_log.float().reshape(hv).contiguous(), dt_bias.float().reshape(hv).contiguous()
    if _fused_gate():
        g, beta = a.contiguous(), b.contiguous()
        extra = {"use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "A_log": a_log32, "dt_bias": dtb}
    else:
        g = -a_log32.exp() * F.softplus(a.float() + dtb)
        beta, extra = torch.sigmoid(b.float()).to(vh.dtype), {}
    o = _fla_chunk(chunk_gated_delta_rule, qh, kh, vh, g, beta, dk**-0.5, init, state, chunk_size, extra)
    return o.reshape(t, -1)


# ----------------------------------------------------------------------------------------------
# Softmax attention and K3 attention residual


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """`kernels.causal_attention` via SDPA; the mask is lower-right aligned since q are the last T of S."""
    from torch.nn.attention.bias import causal_lower_right

    t, s = q.shape[0], k.shape[0]
    qh, kh, vh = (z.transpose(0, 1).unsqueeze(0) for z in (q, k, v))  # [1, n, T|S, d]
    vh = vh.to(q.dtype)
    kh = kh.to(q.dtype)
    dv, dq = vh.shape[-1], qh.shape[-1]
    # Flash needs one head dim for q, k and v: zero-padding v (MLA: 128 -> 192) keeps the result exact.
    pad = dv < dq <= 256 and q.dtype in (torch.float16, torch.bfloat16) and q.is_cuda
    if pad and os.environ.get("TPPLAN_SDPA_PAD_V", "1") != "0":
        vh = F.pad(vh, (0, dq - dv))
    mask = causal_lower_right(t, s)
    with torch.no_grad():
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out[0, ..., :dv].transpose(0, 1).reshape(t, -1)


def attn_res(prefix: Tensor, bank: Tensor, proj: Tensor, score_norm: Tensor, eps: float) -> Tensor:
    """`kernels.attn_res` by fla's fused kernel, else with one fp32 rows tensor: score_j = (row_j . w) * rstd(row_j)."""
    if prefix.dtype != torch.float32 and fla_kernel(prefix, FLA_ATTNRES, "TPPLAN_FLA_ATTNRES"):
        from fla.ops.attnres import fused_attnres

        sources = [bank[:, i].contiguous() for i in range(bank.shape[1])] + [prefix.contiguous()]
        with torch.no_grad():
            return fused_attnres(proj.reshape(-1), sources, score_norm.reshape(-1), rms_eps=eps)
    rows = torch.cat([bank, prefix[:, None, :]], dim=1).float()  # [T, r, H]
    h = rows.shape[-1]
    w = score_norm.float() * proj.float().reshape(-1)
    ss = torch.linalg.vector_norm(rows, dim=-1).square_().div_(h).add_(eps).rsqrt_()  # [T, r]
    p = torch.softmax((rows @ w).mul_(ss), dim=-1)  # [T, r]
    return (p.unsqueeze(1) @ rows).squeeze(1).to(prefix.dtype)
