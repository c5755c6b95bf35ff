"""CPU tests of the fast-kernel dispatch and of the torch-level fast paths (the fla ones need a GPU:
`python -m tpplan.runtime.fast_check` covers them there)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import tpplan.runtime.kernels as K
from tpplan.runtime import fast_kernels as fast

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _rn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_dispatch_picks_reference_on_cpu_and_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _rn(3, 8)
    for op in ("rms_norm", "head_rms_norm", "short_conv", "causal_attention", "attn_res", "kda", "gdn"):
        assert not fast.use(x, op)
    calls: list[str] = []
    monkeypatch.setattr(fast, "rms_norm", lambda *a, **k: calls.append("fast") or a[0])
    want = K.rms_norm(x, torch.ones(8), 1e-6)
    assert calls == [] and not torch.equal(want, x)
    with fast.forced():
        assert fast.use(x, "rms_norm") and fast.use(x, "short_conv")
        assert fast.use(x, "kda") == fast.fla_available()
        K.rms_norm(x, torch.ones(8), 1e-6)
        assert calls == ["fast"]
        monkeypatch.setenv("TPPLAN_FAST_KERNELS", "0")
        assert not fast.use(x, "rms_norm")
        assert torch.equal(K.rms_norm(x, torch.ones(8), 1e-6), want)
        monkeypatch.delenv("TPPLAN_FAST_KERNELS")
        with fast.disabled():
            assert not fast.use(x, "rms_norm")
        assert fast.use(x, "rms_norm")
    assert calls == ["fast"]


def test_import_without_fla() -> None:
    code = (
        "import sys; sys.modules['fla'] = None\n"
        "import tpplan.runtime.kernels as K\n"
        "from tpplan.runtime import fast_kernels as f\n"
        "assert not f.fla_available()\n"
        "import torch\n"
        "with f.forced():\n"
        "    assert not f.use(torch.zeros(1), 'kda') and f.use(torch.zeros(1), 'rms_norm')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_equals_reference(offset: float) -> None:
    x, w = _rn(5, 3, 32) * 3, _rn(32, seed=1)
    torch.testing.assert_close(fast.rms_norm(x, w, 1e-6, offset), K.rms_norm(x, w, 1e-6, offset), **TOL)
    xb = x.bfloat16()
    torch.testing.assert_close(
        fast.rms_norm(xb, w, 1e-6, offset), K.rms_norm(xb, w, 1e-6, offset), atol=2e-2, rtol=1e-2
    )


@pytest.mark.parametrize("gate_fn", [None, "sigmoid", "silu"])
def test_head_rms_norm_equals_reference(gate_fn: str | None) -> None:
    x, w, g = _rn(7, 4 * 16), _rn(16, seed=1), _rn(7, 4 * 16, seed=2)
    gate = None if gate_fn is None else g
    got = fast.head_rms_norm(x, w, 1e-5, 16, gate, gate_fn or "sigmoid")
    torch.testing.assert_close(got, K.head_rms_norm(x, w, 1e-5, 16, gate, gate_fn or "sigmoid"), **TOL)


@pytest.mark.parametrize("kernel", [1, 2, 4])
@pytest.mark.parametrize("activation", ["silu", ""])
def test_short_conv_chunked_state_equals_reference(kernel: int, activation: str) -> None:
    x, w = _rn(11, 6), _rn(6, 1, kernel, seed=1)
    s_ref: dict[str, torch.Tensor] = {}
    s_fast: dict[str, torch.Tensor] = {}
    for sl in (slice(0, 2), slice(2, 3), slice(3, 11)):  # chunks shorter than the kernel too
        want = K.short_conv(x[sl], w, s_ref, activation)
        got = fast.short_conv(x[sl], w, s_fast, activation)
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(s_fast["conv"], s_ref["conv"], **TOL)
    torch.testing.assert_close(fast.short_conv(x, w, None, activation), K.short_conv(x, w, None, activation), **TOL)


def test_causal_attention_lower_right_equals_reference() -> None:
    q, k, v = _rn(3, 2, 8), _rn(7, 2, 8, seed=1), _rn(7, 2, 5, seed=2)  # 3 queries = last 3 of 7 keys
    torch.testing.assert_close(fast.causal_attention(q, k, v, 0.3), K.causal_attention(q, k, v, 0.3), **TOL)
    torch.testing.assert_close(
        fast.causal_attention(q, k[:3], v[:3], 0.3), K.causal_attention(q, k[:3], v[:3], 0.3), **TOL
    )


def test_mla_chunked_cache_through_dispatch_equals_reference() -> None:
    n, nope, rope, vd, t = 2, 8, 4, 6, 9
    q, kv, kr = _rn(t, n * (nope + rope)), _rn(t, n * (nope + vd), seed=1), _rn(t, rope, seed=2)
    pos = torch.arange(t)

    def run() -> torch.Tensor:
        cache: dict[str, torch.Tensor] = {}
        outs = []
        for sl in (slice(0, 4), slice(4, 9)):
            outs.append(
                K.mla_attention(
                    q[sl],
                    kv[sl],
                    kr[sl],
                    nope_dim=nope,
                    rope_dim=rope,
                    v_dim=vd,
                    positions=pos[sl],
                    rope=K.Rope(),
                    scale=0.25,
                    cache=cache,
                )
            )
        return torch.cat(outs)

    want = run()
    with fast.forced():
        got = run()
    torch.testing.assert_close(got, want, **TOL)


def test_attn_res_equals_reference() -> None:
    prefix, bank, proj, sn = _rn(5, 32), _rn(5, 3, 32, seed=1) * 4, _rn(32, seed=2), _rn(32, seed=3)
    torch.testing.assert_close(fast.attn_res(prefix, bank, proj, sn, 1e-6), K.attn_res(prefix, bank, proj, sn, 1e-6))


# ----------------------------------------------------------------------------------------------
# The fla-backed paths' plumbing (layout, GVA, fused gate/beta/l2norm flags, state in and out) against a
# CPU stand-in for fla that implements the documented contract of chunk_kda / chunk_gated_delta_rule.


def _fake_fla_op(per_channel: bool):
    def op(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
        b, t, h, dk = q.shape
        hv = v.shape[2]
        assert b == 1 and k.shape == q.shape and beta.shape == (1, t, hv)
        assert g.shape == ((1, t, hv, dk) if per_channel else (1, t, hv))
        assert initial_state is None or (initial_state.dtype == torch.float32 and initial_state.shape[:2] == (1, hv))
        assert kw.pop("chunk_size") in (32, 64)
        if kw.pop("use_qk_l2norm_in_kernel", False):
            q, k = K.l2norm(q.float()), K.l2norm(k.float())
        if kw.pop("use_gate_in_kernel", False):
            a_log, dt_bias = kw.pop("A_log"), kw.pop("dt_bias")
            assert a_log.shape == (hv,) and dt_bias.shape == ((hv * dk,) if per_channel else (hv,))
            shape = (hv, dk) if per_channel else (hv,)
            g = -a_log.float().reshape(hv, *([1] if per_channel else [])).exp() * torch.nn.functional.softplus(
                g.float() + dt_bias.reshape(shape)
            )
        if kw.pop("use_beta_sigmoid_in_kernel", False):
            beta = torch.sigmoid(beta.float())
        assert not kw, kw
        q, k = (z.float().repeat_interleave(hv // h, dim=2) for z in (q, k))  # v head i reads key head i // r
        init = None if initial_state is None else initial_state[0]
        o, s = K.chunk_gated_delta_rule(q[0] * scale, k[0], v[0], g[0], beta[0], init)
        return o[None].to(v.dtype), (s[None] if output_final_state else None)

    return op


@pytest.fixture
def fake_fla(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    kda_mod, gdr_mod = types.ModuleType("fla.ops.kda"), types.ModuleType("fla.ops.gated_delta_rule")
    kda_mod.chunk_kda = _fake_fla_op(per_channel=True)
    gdr_mod.chunk_gated_delta_rule = _fake_fla_op(per_channel=False)
    for name, mod in {
        "fla": types.ModuleType("fla"),
        "fla.ops": types.ModuleType("fla.ops"),
        "fla.ops.kda": kda_mod,
        "fla.ops.gated_delta_rule": gdr_mod,
    }.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(fast, "fla_available", lambda: True)


@pytest.mark.parametrize("fused_gate", ["1", "0"])
def test_kda_plumbing_against_fla_contract(fake_fla: None, monkeypatch: pytest.MonkeyPatch, fused_gate: str) -> None:
    monkeypatch.setenv("TPPLAN_FLA_FUSED_GATE", fused_gate)
    t, n, d = 10, 2, 8
    q, k, v, f = (_rn(t, n * d, seed=i) for i in range(4))
    bl, a_log, dtb = _rn(t, n, seed=5), _rn(n, seed=6) * 0.5, _rn(n * d, seed=7)
    kw = {"head_dim": d, "a_log": a_log, "dt_bias": dtb, "chunk_size": 64}
    s_ref: dict[str, torch.Tensor] = {}
    s_fast: dict[str, torch.Tensor] = {}
    for sl in (slice(0, 3), slice(3, 10)):
        want = K.kda(q[sl], k[sl], v[sl], f[sl], bl[sl], state=s_ref, **kw)
        got = fast.kda(q[sl], k[sl], v[sl], f[sl], bl[sl], state=s_fast, **kw)
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(s_fast["recurrent"], s_ref["recurrent"], **TOL)
    with fast.forced():  # and through the dispatch
        torch.testing.assert_close(K.kda(q, k, v, f, bl, **kw), fast.kda(q, k, v, f, bl, **kw), **TOL)


@pytest.mark.parametrize("fused_gate", ["1", "0"])
def test_gdn_plumbing_against_fla_contract(fake_fla: None, monkeypatch: pytest.MonkeyPatch, fused_gate: str) -> None:
    monkeypatch.setenv("TPPLAN_FLA_FUSED_GATE", fused_gate)
    t, ng, r, dk, dv = 9, 2, 2, 8, 4
    qkvz, ba = _rn(t, ng * (2 * dk + 2 * r * dv)), _rn(t, ng * 2 * r, seed=1)
    kw = {
        "conv_weight": _rn(ng * (2 * dk + r * dv), 1, 4, seed=2),
        "a_log": _rn(ng * r, seed=3) * 0.5,
        "dt_bias": _rn(ng * r, seed=4),
        "norm_weight": _rn(dv, seed=5),
        "eps": 1e-6,
        "k_head_dim": dk,
        "v_head_dim": dv,
        "v_per_k": r,
    }
    s_ref: dict[str, torch.Tensor] = {}
    s_fast: dict[str, torch.Tensor] = {}
    for sl in (slice(0, 2), slice(2, 9)):
        want = K.gdn(qkvz[sl], ba[sl], state=s_ref, **kw)
        with fast.forced():  # the fla delta rule (and the conv and norm fast paths) through the dispatch
            got = K.gdn(qkvz[sl], ba[sl], state=s_fast, **kw)
        torch.testing.assert_close(got, want, **TOL)
        for key in ("conv", "recurrent"):
            torch.testing.assert_close(s_fast[key], s_ref[key], **TOL)
