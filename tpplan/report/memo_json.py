"""The memo's facts as one JSON object: `tpplan report --json FILE` (docs/report-json.md, schema version 1).

Built from the same `Analysis` the memo prints, with each concept's own serializer: `PlanPrediction.to_json`
(audit JSON's `prediction`), `Provenance.to_json` (the band), `TargetsOutcome.to_json` (search JSON's
`serving_search`) and, per chosen deployment, the `serving` block audit and search add
(`commands/_serving.serving_block`, passed in by the command: the report package sits below the CLI).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from tpplan.engines.recipes import EngineRecipe
from tpplan.report.results import Analysis, Variant, Verdict
from tpplan.report.rows import DeploymentRow

SCHEMA_VERSION = 1


def chosen_variants(a: Analysis) -> list[Variant]:
    """The deployments the memo decides between: today's (`--current`) and the bottom line's target."""
    keys = [a.current_key] + ([a.bottom.target] if a.bottom is not None else [])
    return [v for k in dict.fromkeys(keys) if (v := a.variant(k)) is not None]


def memo_json(a: Analysis, command: str, serving: Mapping[str, dict[str, object]] | None = None) -> dict[str, Any]:
    """The memo as plain data; `serving`: each chosen variant's `serving` block by its key (absent: none)."""
    served = a.serving
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "model": a.model,
        "topology": a.topology.name,
        "gpus": a.topology.world_size,
        "workloads": [w.name for w in a.workloads],
        "dtype": a.dtype,
        "tp": a.tp,
        "engines": list(a.engines),
        "pp_engine": a.pp_engine,
        "memory_cap_bytes": None if math.isinf(a.memory_cap_bytes) else a.memory_cap_bytes,
        "cp_kv": a.cp_kv,
        "arrival": None if a.arrival is None else a.arrival.describe(),
        "predicted": a.predictor_note is None,
        "band": a.provenance.to_json(),
        "current": a.current_key,
        "bottom_line": None if a.bottom is None else asdict(a.bottom),
        "chosen": [_variant(v, (serving or {}).get(v.key)) for v in chosen_variants(a)],
        "verdicts": [_verdict(v) for v in a.verdicts],
        "next_steps": [{**asdict(s), "conditions": list(s.conditions)} for s in a.next_steps],
        "deployments": {w: [_row(r) for r in rows] for w, rows in a.deployments.items()},
        "search_best": None if a.search_best is None else {"plan": a.search_best[0], "deployment": a.search_best[1]},
        "kernel_sources": _kernel_sources(a),
        "serving_search": None if served is None else served.outcome.to_json(),
        "serving_launches": [] if served is None else [asdict(x) for x in served.launches],
        "decode_band": _decode_band(a),
        "sources": _sources(a),
    }


def _decode_band(a: Analysis) -> dict[str, object] | None:
    """The Serving section's decode band (`cost.decode_band`), with the deployment it was composed for."""
    held = None if a.serving is None else a.serving.decode_band
    return None if held is None else {"deployment": held[0], **held[1].to_json()}


def _variant(v: Variant, serving: dict[str, object] | None) -> dict[str, object]:
    """One chosen deployment: its plan and mesh, each workload's prediction, both engines' lines, its serving."""
    out: dict[str, object] = {
        "key": v.key,
        "plan": v.plan.name,
        "deployment": v.deployment,
        "tp": v.tp,
        "pp": v.pp,
        "cp": v.cp,
        "replicas": v.replicas,
        "legal": v.legal,
        "predictions": {w: p.to_json() for w, p in v.predictions.items()},
        "prediction_error": v.prediction_error,
        "engines": [_recipe(e) for e in v.engines],
    }
    if serving is not None:
        out["serving"] = serving
    return out


def _recipe(e: EngineRecipe) -> dict[str, object]:
    return {
        "engine": e.engine,
        "version": e.version,
        "realises": e.realises,
        "blocked": e.blocked,
        "command": e.command(),
        "summary": e.summary,
        "conditions": [{"text": c.text, "met": c.met, "effect": c.effect, "source": c.source} for c in e.conditions],
    }


def _verdict(v: Verdict) -> dict[str, object]:
    return {"key": v.key, "status": v.status, "headline": v.headline, "reasons": list(v.reasons)}


def _row(r: DeploymentRow) -> dict[str, object]:
    """One row of the deployment ranking (`rows.DeploymentRow`)."""
    return {
        "deployment": r.label,
        "variant": r.variant,
        "rank": r.rank,
        "ttft_mean_s": r.ttft_s,
        "memory_bytes_per_rank": r.memory_bytes,
        "fits": r.fits,
        "reason": r.reason,
        "flags": list(r.flags),
    }


def _kernel_sources(a: Analysis) -> dict[str, object] | None:
    """The answer under each kernel-price source (`rows.KernelSensitivity`), where the memo compared them."""
    ks = a.kernel_sources
    if ks is None:
        return None
    return {"chosen": ks.chosen, "workload": ks.workload, "sources": ks.sources, "reason": ks.reason,
            "skipped": list(ks.skipped), "answers": [asdict(s) for s in ks.answers]}  # fmt: skip


def _sources(a: Analysis) -> list[str]:
    """Every citation the chosen deployments' engine lines and the Serving section rest on, once each."""
    cites = [c.source for v in chosen_variants(a) for e in v.engines for c in e.conditions if c.source]
    cites += list(a.serving.sources) if a.serving is not None else []
    return list(dict.fromkeys(cites))


__all__ = ["SCHEMA_VERSION", "chosen_variants", "memo_json"]
