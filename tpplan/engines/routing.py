"""A deployment's request router: what spreads its requests over its R replicas, chosen once per deployment from
the engine release's records (`SchedulerRules.replica_routers`, each with its sources) and read by every
consumer: the launch lines start it (`launch_header`: the in-process router's flags, or the external router in
front of R servers), and the serving loop runs its policy (`tpplan.simulate.engine.engine_loop`, whose TTFT audit,
search and report all take). `Mesh.router` names the choice (`--router`); None is the release's default, its
first record. A release whose routers tpplan has not read gets none: its launch lines say that a router must be
put in front of the servers (a loop on such a release, were its scheduler read, would deal round-robin:
`LoopConfig.router`'s default)."""

from __future__ import annotations

from tpplan.engines.schema import ReplicaRouter, RouterRule
from tpplan.errors import TpplanError
from tpplan.models.spec import ModelSpec, MoESpec


def replica_routers(key: str) -> tuple[ReplicaRouter, ...]:
    """Every router engine version `key` ("sglang@0.5.23") can put in front of its replicas, its default first."""
    from tpplan.engines import ENGINES, select

    ev = ENGINES.get(key) or select(key)
    return ev.scheduling.replica_routers if ev.scheduling is not None else ()


def replica_router(key: str, name: str | None = None) -> ReplicaRouter | None:
    """The router `name` of engine version `key` (None: its default), None where the version has none read; a
    name the version does not have is refused, naming the ones it has."""
    have = replica_routers(key)
    if name is None:
        return have[0] if have else None
    for r in have:
        if r.name == name:
            return r
    names = ", ".join(r.name for r in have)
    fix = f"use one of {names} (or leave --router out for {have[0].name})" if have else "leave --router out"
    raise TpplanError(f"router={name}", f"{key} has no such request router", fix)


def router_note(router: ReplicaRouter | None, spec: ModelSpec, nodes: int) -> str:
    """Why the in-process router's one server does not start R separate copies of what was priced here ("" where
    it does): its `on_moe` on an MoE model, its `across_nodes` with the replicas on `nodes` > 1 nodes."""
    if router is None or not router.flags:
        return ""
    moe = any(isinstance(layer.mlp, MoESpec) for layer in spec.layers)
    return "; ".join(x for x in (router.on_moe if moe else "", router.across_nodes if nodes > 1 else "") if x)


def _separate(args: tuple[str, ...]) -> str:
    """R separate servers: where each one's GPUs are, and (a copy over several nodes) its own head node."""
    spans = any(a.startswith(("--nnodes", "--distributed-executor-backend ray")) for a in args)
    return "servers, each on GPUs of its own" + (" and with its own head node" if spans else "")


def launch_header(
    router: ReplicaRouter | None, instances: int, args: tuple[str, ...], note: str = ""
) -> tuple[tuple[str, ...], str]:
    """The flags one launch line takes for `instances` copies behind `router` (a mesh's replicas, or a P/D pool's
    instances behind its P/D router), and the line that says what spreads the requests: in-process, the router's
    flags added to `args` (one server starts every copy); external, that many servers each with `args`, behind it.
    Where the in-process flags would not start separate copies (`note`, from `router_note`: an MoE model's
    experts sharded over every rank, ranks spread over every node) or are the plan's own (DP attention's
    `--dp-size`), the copies are separate servers behind the external router that deals alike (`alike`), or
    one still to be put in front of them."""
    if instances == 1:
        return args, ""
    if router is None:
        return args, (f"{instances} {_separate(args)}; needs a request router in front of them "
                      "(none read for this engine version)")  # fmt: skip
    flags = router.launch_flags(instances)
    flag = flags[0].split()[0] if flags else ""
    taken = {a.split()[0] for a in args}
    if flags and not note and flag not in taken:
        return (*args, *flags), f"{instances} replicas in one server, behind {router.what}"
    if not flags:
        command = f": `{router.behind}`" if router.behind else ""
        return args, f"{instances} {_separate(args)}, behind {router.what}{command}"
    why = f"one server's {flag} would not start them: {note}" if note else f"{flag} is the plan's own here"
    if router.alike is not None and router.alike.behind:
        return args, (f"{instances} {_separate(args)}, behind {router.alike.what}, which deals as the priced "
                      f"{router.what} does: `{router.alike.behind}` ({why})")  # fmt: skip
    return args, (f"{instances} {_separate(args)}; needs an external router in front of them that deals as the priced "
                  f"{router.what} does (none read; {why})")  # fmt: skip


def pd_pool_router(key: str) -> ReplicaRouter:
    """A P/D pool's instances, behind the release's P/D router (`HandoffRule.router`, the P/D loop's): what a pool's
    launch line names (its policies are the P/D section's)."""
    from tpplan.engines import handoff_rule

    rule = handoff_rule(key)[0].router
    policy = f"{rule.prefill} prefill, {rule.decode} decode" if rule is not None else "not read: round-robin assumed"
    return ReplicaRouter(
        "pd", rule or RouterRule("round_robin", "round_robin", False, ()), f"its P/D router ({policy})"
    )


__all__ = ["launch_header", "pd_pool_router", "replica_router", "replica_routers", "router_note"]
