"""The runtime's public observer hook (`tpplan.runtime.observe`), which the bench's timers use."""

import pytest

torch = pytest.importorskip("torch")

from tpplan.models.config import load_model  # noqa: E402
from tpplan.models.graph import build_model_graph  # noqa: E402
from tpplan.plans.named import make_plan  # noqa: E402
from tpplan.runtime.distributed import PlanRunner, make_comm  # noqa: E402
from tpplan.runtime.executor import numerics_for  # noqa: E402
from tpplan.runtime.observe import CollectiveSite  # noqa: E402
from tpplan.runtime.shard import DictSource  # noqa: E402
from tpplan.runtime.weights import random_weights  # noqa: E402


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, int, str]] = []
        self.depth = 0

    def open(self, kind: str, layer: int, name: str) -> tuple[str, int, str]:
        self.events.append(("open", kind, layer, name))
        self.depth += 1
        return (kind, layer, name)

    def close(self, token: tuple[str, int, str], site: CollectiveSite | None = None) -> None:
        self.depth -= 1
        self.events.append(("close", *token))


def test_observer_sees_every_layer_and_op_nested_and_the_output_is_unchanged() -> None:
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    nu = numerics_for(graph)
    w = random_weights(graph, nu, seed=3)
    plan = make_plan("baseline", graph, 1)
    ids = torch.randint(0, graph.spec.vocab, (6,), generator=torch.Generator().manual_seed(0))

    def run(observer: _Log | None) -> torch.Tensor:
        r = PlanRunner(graph, plan, 1, 0, DictSource(w), comm=make_comm(0, 1), numerics=nu, observer=observer)
        return r.forward_chunk(ids).t

    log = _Log()
    assert torch.equal(run(log), run(None))
    assert log.depth == 0
    layers = [e for e in log.events if e[1] == "layer"]
    assert [e[2] for e in layers if e[0] == "open"] == list(range(len(graph.layer_kinds)))
    for i, kind in enumerate(graph.layer_kinds):
        ops = [e[3] for e in log.events if e[:3] == ("open", "op", i)]
        assert sorted(ops) == sorted(op.name for op in graph.kinds[kind].ops)  # every op once (order may move)
        start = log.events.index(("open", "layer", i, ""))
        end = log.events.index(("close", "layer", i, ""))
        assert all(start < log.events.index(("open", "op", i, o)) < end for o in ops)  # inside its layer
