"""Tiny transformers models built from a preset's config dict, for the HF-parity tests (no download).

One place for how a parity test builds its reference: fp32 eval mode, eager attention (also in a
wrapper's text config), seed 0, and the parameters HF zero-initialises (router bias, norm weights,
biases, sinks, the recurrences' A_log / dt_bias) given random values so the parity exercises them.
"""

from __future__ import annotations

import torch


def build_hf_model(transformers: object, raw: dict, classes: tuple[str, str]) -> torch.nn.Module:
    """`classes` = (config class, model class) names in `transformers`; `raw` the config dict."""
    cfg_cls, model_cls = (getattr(transformers, n) for n in classes)
    cfg = cfg_cls(**{k: v for k, v in raw.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    if getattr(cfg, "text_config", None) is not None:
        cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_cls(cfg).float().eval()
    perturb_zero_inits(model)
    return model


def perturb_zero_inits(model: torch.nn.Module) -> None:
    """Random values where HF initialises to zero or one, scaled to keep logits of order one."""
    gpt_oss = "gpt_oss" in type(model).__module__
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "e_score_correction_bias" in name:
                p.copy_(torch.randn_like(p) * 0.05)
            elif "norm" in name and p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
            elif "A_log" in name or "dt_bias" in name:
                p.copy_(torch.randn_like(p) * 0.5)
            elif name.endswith("gate.weight") and p.dim() == 2:
                p.copy_(torch.randn_like(p) * 0.2)
            elif name.endswith(("_bias", ".bias", "sinks")):  # biases, sinks: HF zero-inits them
                p.copy_(torch.randn_like(p) * 0.5)
            elif gpt_oss and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(torch.randn_like(p) * 0.3)  # large enough that gpt-oss's SwiGLU clamp is reached
