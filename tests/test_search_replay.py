"""The search's replayed walks (`tpplan.search.replay.StepMemo`) against real ones.

`enumerate_kind` steps every op of every branch for real (`LayerWalk.step`); the replay memo steps
an op once per distinct situation and copies the outcome after that. Walking the whole decision
tree both ways must give the same leaves: the same configs in the same order, the same placements,
op decisions and collectives. The models cover every layer-kind shape the presets have (dense,
MoE, MLA, latent MoE, KDA, GDN, sliding window, chunked attention) and both streams.
"""

from __future__ import annotations

import functools

import pytest

from tpplan.layout.propagate import LayerWalk
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.placement import P
from tpplan.search import SpaceOptions, enumerate_kind, global_choices, make_search_plan
from tpplan.search.replay import StepMemo
from tpplan.search.space import KindConfig, KindIndex

SMALL = SpaceOptions(replicate=False, token_shard=False, gather_for=False)
CASES = [
    ("tiny-llama", 4, SpaceOptions(token_shard=False)),
    ("tiny-qwen3-moe", 2, SpaceOptions()),
    ("tiny-deepseek-v3", 4, SpaceOptions(replicate=False, a2a=False, gather_for=False)),
    ("tiny-qwen3-next", 2, SpaceOptions(replicate=False)),
    ("tiny-kimi-k3", 2, SMALL),
    ("tiny-gpt-oss", 2, SpaceOptions(replicate=False)),
    ("tiny-llama4", 2, SpaceOptions(replicate=False)),
]


@functools.cache
def graph_of(model: str):
    return build_model_graph(load_model(model))


def replayed_leaves(lg, g, n, memo):
    """Every leaf of the kind's tree under `g`, walked through the memo (the order `enumerate_kind`
    uses), and how many expansions it asked the memo for."""
    leaves, asked = [], 0
    stack = [(KindConfig(lg.kind), LayerWalk(lg, make_search_plan(g, []), n, P))]
    while stack:
        cfg, walk = stack.pop()
        if walk.index == len(walk.ops):
            leaves.append((cfg, walk.res))
            continue
        branches, _, _ = memo.expand(walk, cfg, g)
        asked += 1
        stack.extend((c, w) for c, w, _ in reversed(branches))
    return leaves, asked


def facts(leaves):
    return [(cfg, res.placements, res.decisions, res.comms, res.violations) for cfg, res in leaves]


@pytest.mark.parametrize(("model", "n", "opts"), CASES, ids=[f"{m}-tp{n}" for m, n, _ in CASES])
def test_replayed_walks_equal_real_ones(model, n, opts):
    graph = graph_of(model)
    replays = 0
    for lg in graph.kinds.values():
        memo = StepMemo(KindIndex(lg), opts)  # one memo for every global choice, as the search keeps it
        for g in global_choices(graph, n, streams=opts.streams):
            if g.moe == "ep":  # walked as "tp" by the search (the EP front is the TP front repriced)
                continue
            recorded = len(memo.expansions)
            got, asked = replayed_leaves(lg, g, n, memo)
            assert facts(got) == facts(enumerate_kind(lg, g, n, opts)), (model, g, lg.kind)
            replays += asked - (len(memo.expansions) - recorded)
    assert replays > 0  # most expansions were replayed, not walked
