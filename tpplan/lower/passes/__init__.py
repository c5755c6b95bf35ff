"""The built-in lowering passes, one module per axis or rewrite; importing this package registers them
(`tpplan.lower.registry`). Their order: tp_sp 10, dp_attention 20, ep_a2a 30, cp 40, pp 50, overlap 60,
async_tp 70."""

from tpplan.lower.passes import async_tp, cp, dp_attention, ep_a2a, overlap, pp, tp_sp

__all__ = ["async_tp", "cp", "dp_attention", "ep_a2a", "overlap", "pp", "tp_sp"]
