"""A topology: one GPU model (`cost.gpu`) in one cluster (`cost.cluster`), the pair a prediction prices.

A topology file is either small, naming the two (`gpu = "h200-measured"`, `cluster = "h200x8-ib400"`,
presets or paths), or the single file of before the split, with an inline `[gpu]` table and the
cluster's fields at the top (every recorded run and `tpplan calibrate` output is one). A cluster file
that names its GPU (`gpu = "..."`) is a topology as well. `load_topology` reads all three and lets
`--gpu`/`--cluster` replace either half; the result is one flat, validated `Topology`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from pydantic import Field

from tpplan.cost._files import read_mapping, validate
from tpplan.cost.cluster import (
    CLUSTER_FIELDS,
    COLLECTIVE_KINDS,
    MAX_NODES,
    AllReduceAlgorithm,
    Cluster,
    CollectiveCurve,
    CollectiveKind,
    Fabric,
    FittedCollective,
    InterLink,
    IntraLink,
)
from tpplan.cost.compute import kernel_sources
from tpplan.cost.curve_sets import expand_curve_sets
from tpplan.cost.gpu import NEW_FIELDS_DEFAULTS, GemmPoint, GpuModel, GpuSpec, KernelProfile, SourceRef
from tpplan.errors import TpplanError, unknown_name
from tpplan.inputs import check_path, parse_toml


class Topology(Fabric):
    """One GPU model in a fabric (`cost.cluster.Fabric`: nodes x GPUs with their links); `fitted`
    (from calibration) and `curves` (measured) override the link model. `gpu_preset`/`cluster_preset`
    name the halves it was composed from, if any."""

    gpu: GpuSpec
    notes: str = ""
    provenance: str = Field(default="", description="where the cluster's link figures and curves come from")
    gpu_preset: str | None = Field(default=None, description="the GPU model preset or file it names")
    cluster_preset: str | None = Field(default=None, description="the cluster preset or file it names")

    def file_data(self) -> dict[str, Any]:
        """Plain data as topology files hold it: the GPU before the fabric's links, the order files
        had before `Fabric` was factored out (the base class's fields come first in the model)."""
        data = self.model_dump(mode="json", exclude_none=True)
        head = [k for k in ("name", "nodes", "gpus_per_node") if k in data]
        return {**{k: data[k] for k in head}, "gpu": data["gpu"], **data}

    @property
    def cluster(self) -> Cluster:
        """The cluster half, as its own object."""
        fields = {k: getattr(self, k) for k in CLUSTER_FIELDS}
        return Cluster(name=self.cluster_preset or self.name, notes=self.notes, provenance=self.provenance,
                       gpu=self.gpu_preset, **fields)  # fmt: skip

    def with_nodes(self, nodes: int) -> Topology:
        """Same hardware, another node count (validated)."""
        _check_network(self.name, nodes, self.inter is not None, self.gpus_per_node)
        return validate(Topology, {**self.model_dump(), "nodes": nodes}, f"topology {self.name}")

    @classmethod
    def compose(cls, gpu: GpuSpec, cluster: Cluster, name: str | None = None, *, nodes: int | None = None) -> Topology:
        """`gpu` in `cluster` (with `nodes` nodes): the pair a prediction prices."""
        n = cluster.nodes if nodes is None else nodes
        _check_network(name or cluster.name, n, cluster.inter is not None, cluster.gpus_per_node)
        data = {k: getattr(cluster, k) for k in CLUSTER_FIELDS}
        data.update(nodes=n, name=name or cluster.name, gpu=gpu, notes=cluster.notes, provenance=cluster.provenance,
                    cluster_preset=cluster.name)  # fmt: skip
        return validate(cls, data, f"topology {name or cluster.name}")


_PRESETS = "presets"
_GPUS = "gpus"
_CLUSTERS = "clusters"


def _preset_names(sub: str | None) -> list[str]:
    root = resources.files("tpplan.cost").joinpath(_PRESETS)
    if sub is not None:
        root = root.joinpath(sub)
    return sorted(
        p.name[: -len(".toml")]
        for p in root.iterdir()
        if p.name.endswith(".toml") and not p.name.startswith("workload-")
    )


def list_topologies() -> list[str]:
    """Names of the packaged topology presets."""
    return _preset_names(None)


def list_gpus() -> list[str]:
    """Names of the packaged GPU model presets."""
    return _preset_names(_GPUS)


def list_clusters() -> list[str]:
    """Names of the packaged cluster presets."""
    return _preset_names(_CLUSTERS)


def _read(what: str, name_or_path: str, sub: str | None, names: list[str]) -> tuple[dict[str, Any], str]:
    """(data, where) of a preset `name_or_path` under presets/`sub`, or of a .toml/.json file."""
    option, listing = _LISTINGS[what]
    check_path(name_or_path, f"{option} {name_or_path}", f"pass a {what} preset (`{listing}`) or a .toml/.json file")
    path = Path(name_or_path)
    if path.suffix.lower() in (".toml", ".json") or path.exists():
        return read_mapping(path), str(path)
    if name_or_path not in names:
        raise unknown_name(f"a .toml/.json {what}", name_or_path, names, option, listing)
    parts = (_PRESETS, sub, f"{name_or_path}.toml") if sub else (_PRESETS, f"{name_or_path}.toml")
    res = resources.files("tpplan.cost").joinpath(*parts)
    where = f"{what} preset {name_or_path}"
    return parse_toml(res.read_text(encoding="utf-8"), where, "reinstall tpplan"), where


# The option that names a preset of each kind, and the command that lists them.
_LISTINGS = {
    "topology": ("--topology", "tpplan topologies"),
    "GPU model": ("--gpu", "tpplan gpus"),
    "cluster": ("--cluster", "tpplan topologies"),
}


def _gpu_data(ref: str) -> dict[str, Any]:
    data, where = _read("GPU model", ref, _GPUS, list_gpus())
    data = data.get("gpu", data) if isinstance(data.get("gpu"), dict) else data  # a topology file: its [gpu]
    return validate(GpuSpec, data, where).model_dump()


T = TypeVar("T")


def _named_in(where: str, field: str, ref: str, load: Callable[[str], T]) -> T:
    """`load(ref)` for a preset or file that field `field` of `where` names; its error names that
    field (the user gave no option for it), and an empty name is refused as such."""
    if not ref.strip():
        raise TpplanError(f"{where}: {field}", "is empty", f"name a {field} preset or a .toml/.json file, or drop it")
    try:
        return load(ref)
    except TpplanError as exc:
        raise TpplanError(f"{where}: {field} {ref}", exc.reason, exc.fix) from None


def load_gpu(name_or_path: str) -> GpuSpec:
    """A GPU model preset (presets/gpus/) or file; a topology file gives its [gpu] table. One that names
    `kernel_models_from` and has no kernel models of its own gets that model's, scaled (`cost.gpu_inherit`)."""
    return inherit_kernel_models(_own_gpu(name_or_path), name_or_path)


def _own_gpu(name_or_path: str) -> GpuSpec:
    """A GPU model as its file states it, without inherited kernel models."""
    return GpuSpec.model_validate(_gpu_data(name_or_path))


def inherit_kernel_models(gpu: GpuSpec, where: str) -> GpuSpec:
    """`gpu` (read from `where`) with the kernel models of the measured GPU model it names
    (`kernel_models_from`), scaled to it. The source's own models only: no chain, so no cycle."""
    if not gpu.kernel_models_from or gpu.kernel_models:
        return gpu
    from tpplan.cost.gpu_inherit import scaled_kernel_models

    src = _named_in(where, "kernel_models_from", gpu.kernel_models_from, _own_gpu)
    if not src.kernel_models:
        raise TpplanError(f"{where}: kernel_models_from {gpu.kernel_models_from}",
                          "that GPU model has no kernel models of its own",
                          "name a measured GPU model (e.g. h100-measured, h200-measured)")  # fmt: skip
    note = f"kernel models of {src.name} ({gpu.kernel_models_from}) scaled by HBM bandwidth and compute"
    prov = {k: note for k in ("attention", "moe", "recurrence", "elementwise")} | dict(gpu.provenance)
    return gpu.model_copy(update={"kernel_models": scaled_kernel_models(src, gpu), "provenance": prov})


def _cluster_data(ref: str) -> tuple[dict[str, Any], str]:
    data, where = _read("cluster", ref, _CLUSTERS, list_clusters())
    data = expand_curve_sets(data, where)
    if isinstance(data.get("gpu"), dict):  # a whole old-style topology used as a cluster: its cluster half
        data = {k: v for k, v in data.items() if k != "gpu"}
    return data, where


def load_cluster(name_or_path: str) -> Cluster:
    """A cluster preset (presets/clusters/) or file."""
    data, where = _cluster_data(name_or_path)
    data = {k: v for k, v in data.items() if k not in ("gpu_preset", "cluster_preset")}
    return validate(Cluster, data, where)


def _check_network(name: str, nodes: int, has_inter: bool, gpus_per_node: int) -> None:
    """One line, before any validation dump: a multi-node count on a cluster without a network."""
    if not 1 <= nodes <= MAX_NODES:
        raise TpplanError(f"--nodes {nodes}", f"must be 1 to {MAX_NODES}", "pass a node count in that range")
    if nodes > 1 and not has_inter:
        raise TpplanError(
            f"topology {name} with {nodes} nodes",
            f"its cluster is one node of {gpus_per_node} GPUs with no [inter] network between nodes",
            "add a multi-node cluster (e.g. --cluster h200x8-ib400: 8 measured H200 per node) or drop --nodes",
        )


def load_topology(
    name_or_path: str, nodes: int | None = None, *, gpu: str | None = None, cluster: str | None = None,
    option: str = "--topology",
) -> Topology:  # fmt: skip
    """Load a topology preset, file, or cluster (preset or file, with its default GPU); `cluster`
    (preset or file) replaces its cluster and, where the cluster names one, its GPU; `gpu` (preset or
    file) replaces the GPU model; `nodes` the node count.

    Every validation problem becomes a TpplanError naming the file and the field; `option` is the flag
    that named `name_or_path` (`--cluster` where no `--topology` was given).
    """
    topologies = list_topologies()
    check_path(name_or_path, f"{option} {name_or_path}", "pass a preset (`tpplan topologies`) or a .toml/.json file")
    if name_or_path not in topologies and name_or_path in list_clusters() and not Path(name_or_path).exists():
        data: dict[str, Any] = {"cluster": name_or_path}
        where = f"cluster preset {name_or_path}"
    elif option == "--cluster" and name_or_path not in topologies:  # a cluster file, or a name no cluster has
        data, where = _read("cluster", name_or_path, _CLUSTERS, list_clusters())
    else:
        data, where = _read("topology", name_or_path, None, topologies)
    data = expand_curve_sets(dict(data), where)
    if isinstance(data.get("cluster"), str):
        cdata, _ = _named_in(where, "cluster", data["cluster"], _cluster_data)
        data = {**cdata, **{k: v for k, v in data.items() if k != "cluster"}, "cluster_preset": data["cluster"]}
        data.setdefault("name", data["cluster_preset"])
    if cluster is not None and cluster != data.get("cluster_preset"):
        cdata, cwhere = _cluster_data(cluster)
        validate(Cluster, {k: v for k, v in cdata.items() if k not in ("gpu_preset", "cluster_preset")}, cwhere)
        kept = {k: v for k, v in data.items() if k not in CLUSTER_FIELDS}
        fabric = {k: v for k, v in cdata.items() if k in CLUSTER_FIELDS}
        name = f"{data.get('name', cluster)}@{Path(cluster).stem}"
        data = {**kept, **fabric, "cluster_preset": cluster, "name": name}
        if isinstance(cdata.get("gpu"), str):  # the cluster names the GPU it holds
            data["gpu"] = cdata["gpu"]
    if gpu is not None:
        data["gpu"] = gpu
    if isinstance(data.get("gpu"), str):
        ref = data["gpu"]
        named = load_gpu(ref) if gpu is not None else _named_in(where, "gpu", ref, load_gpu)  # --gpu: its own errors
        data["gpu"], data["gpu_preset"] = named.model_dump(), ref
        if gpu is not None:
            data["name"] = f"{data.get('name', ref)}+{Path(ref).stem}"
    if nodes is not None:
        data["nodes"] = nodes
    n = data.get("nodes")
    per_node = data.get("gpus_per_node")
    if isinstance(n, int) and not isinstance(n, bool) and (nodes is not None or isinstance(data.get("intra"), dict)):
        _check_network(str(data.get("name", name_or_path)), n, data.get("inter") is not None,
                       per_node if isinstance(per_node, int) else 0)  # fmt: skip
    return validate(Topology, data, where)


def select_topology(
    topology: str | None,
    nodes: int | None = None,
    *,
    gpu: str | None = None,
    cluster: str | None = None,
    engine: str | None = None,
) -> Topology | None:
    """The topology the CLI's `--topology`, `--cluster`, `--gpu`, `--engine` and `--nodes` name
    (None: none given).

    `--cluster` alone is the cluster with the GPU it names; `--gpu` and `--engine` need one of the two.
    `--engine` makes the GPU model run that engine's kernels (`GpuSpec.with_engine`); its sources are
    built here, so a missing `tpplan[aic]` extra or an unknown version is one line before any work."""
    source = topology if topology is not None else cluster
    if source is None:
        for flag, value in (("--gpu", gpu), ("--engine", engine)):
            if value is not None:
                raise TpplanError(f"{flag} {value}", "a GPU model needs a cluster to run in",
                                  "add --cluster or --topology")  # fmt: skip
        return None
    option = "--topology" if topology is not None else "--cluster"
    topo = load_topology(source, nodes, gpu=gpu, cluster=cluster, option=option)
    if engine is None:
        return topo
    topo = topo.model_copy(update={"gpu": topo.gpu.with_engine(engine), "name": f"{topo.name}/{engine}"})
    kernel_sources(topo.gpu)
    return topo


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        import json

        return json.dumps(v)  # a JSON string literal is a valid TOML basic string
    if isinstance(v, list) and all(not isinstance(x, dict) for x in v):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as an inline TOML value")


def _toml_key(k: str) -> str:
    """A bare TOML key when it is one, else a quoted one (kernel profile keys hold ':')."""
    import json
    import re

    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_table(data: dict[str, object], prefix: str, out: list[str]) -> None:
    scalars = {k: v for k, v in data.items() if v is not None and not isinstance(v, dict) and not _is_table_list(v)}
    if prefix and (scalars or not data):
        out.append(f"\n[{prefix}]")
    for k, v in scalars.items():
        out.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for k, v in data.items():
        key = f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k)
        if isinstance(v, dict):
            _toml_table(v, key, out)
        elif _is_table_list(v):
            for item in v:
                out.append(f"\n[[{key}]]")
                out.extend(f"{ik} = {_toml_value(iv)}" for ik, iv in item.items())


def _is_table_list(v: object) -> TypeGuard[list[dict[str, object]]]:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def topology_to_toml(topo: Topology, header: str = "") -> str:
    """Serialise a topology to TOML that `load_topology` reads back unchanged."""
    out = [f"# {line}" for line in header.splitlines()]
    data = topo.file_data()
    if not data["intra"].get("all_reduce"):
        data["intra"].pop("all_reduce", None)  # no declaration: files read as before
    for key, default in NEW_FIELDS_DEFAULTS.items():  # fields added with the GPU/cluster split, at defaults
        if data["gpu"].get(key) == default:
            data["gpu"].pop(key, None)
    for key, default in (("curves", []), ("provenance", "")):
        if data.get(key) == default:
            data.pop(key, None)
    _toml_table(data, "", out)
    return "\n".join(out).lstrip("\n") + "\n"


__all__ = [
    "COLLECTIVE_KINDS",
    "AllReduceAlgorithm",
    "Cluster",
    "CollectiveCurve",
    "CollectiveKind",
    "FittedCollective",
    "GemmPoint",
    "GpuModel",
    "GpuSpec",
    "InterLink",
    "IntraLink",
    "KernelProfile",
    "SourceRef",
    "Topology",
    "list_clusters",
    "list_gpus",
    "list_topologies",
    "load_cluster",
    "load_gpu",
    "load_topology",
    "select_topology",
    "topology_to_toml",
]
