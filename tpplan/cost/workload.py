"""Serving workload -> chunked-prefill batches -> time to first token (TTFT).

The scheduler imitates SGLang's chunked prefill with first-come-first-served admission: each
prefill batch holds at most `chunk_size` tokens; a request that does not fit is split, and its
remainder goes first in the next batch. Clients are closed-loop: `concurrency` of them submit at
t = 0 and each submits its next request when the previous one gets its first token. Decode (the
output tokens after the first) is out of scope: it neither delays prefill nor the next request.
With pipeline parallelism the batches run through the stages in order, at most the engine's
micro-batches in flight (`simulate_pipeline`; `tpplan.cost.pipeline` takes the engine's schedule).
With R replicas of a deployment the requests go to them as the deployment's request router sends them
(`simulate_routed`: every replica its own scheduler, the router picking each request as it is sent);
`replica_workloads` deals them beforehand instead (client c to replica c mod R), the search walk's screen.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from tpplan.cost._files import read_mapping, validate
from tpplan.cost.routing import Router
from tpplan.engines.schema import RouterRule
from tpplan.errors import TpplanError, unknown_name
from tpplan.inputs import NAME_CHARS, check_path, parse_toml
from tpplan.mesh import Mesh

# Generous maxima, so a typo (input_len = 10**12) is refused at once instead of simulated for hours:
# prompts up to 16M tokens, 100k requests, and at most MAX_BATCHES chunked-prefill batches in all.
MAX_TOKENS = 2**24
MAX_REQUESTS = 100_000
MAX_CONCURRENCY = 2**16
MAX_BATCHES = 100_000  # scheduled batches: the scheduler itself takes ~1 s for these
# Distinct batches (new tokens and context per request) that a workload may need priced: each one is
# priced once per plan and deployment (then cached), ~3-15 ms for audit's plans and ~10-40 ms for a
# search's on a 64-93-layer model (docs/cost-model.md, "Workload size"), so this keeps a command's
# pricing to seconds. Chunks of 7 tokens of 16K prompts made 16,385 of them: 105 s and 2.7 GB.
MAX_PRICED_BATCHES = 256

Tokens = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]


class Workload(BaseModel):
    """A serving protocol: request shape, concurrency and the chunked-prefill budget."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str = Field(default="custom", min_length=1, max_length=NAME_CHARS)
    input_len: Tokens | None = Field(default=None, description="prompt tokens per request")
    output_len: Tokens = Field(default=1, description="only the first token is modelled")
    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY, description="closed-loop clients")
    chunk_size: Tokens = Field(description="max prefill tokens per batch")
    num_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS, description="default: one wave")
    input_lens: list[Tokens] | None = Field(
        default=None, max_length=MAX_REQUESTS, description="per-request prompt lengths, cycled; overrides input_len"
    )
    cached_share: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="share of each prompt already in the prefix cache (not computed)"
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.input_lens is not None and not self.input_lens:
            raise ValueError("input_lens must be a non-empty list of positive lengths")
        if self.input_len is None and self.input_lens is None:
            raise ValueError("give input_len (or input_lens)")
        if self.num_requests is None and self.concurrency > MAX_REQUESTS:
            raise ValueError(f"one wave of {self.concurrency} requests exceeds {MAX_REQUESTS}; set num_requests")
        lens = self.input_lens or [self.input_len or 1]
        requests = self.num_requests if self.num_requests is not None else self.concurrency
        tokens = sum(lens) * requests // len(lens)  # about: the lengths are cycled
        if tokens // self.chunk_size > MAX_BATCHES:
            raise ValueError(
                f"{requests} requests of ~{tokens // requests} tokens in chunks of {self.chunk_size} make more than "
                f"{MAX_BATCHES} prefill batches; use fewer requests or a larger chunk_size"
            )
        return self

    def with_overrides(self, where: str, **fields: object) -> Workload:
        """This workload with `fields` replaced and validated again (bounds included); `where` names
        the options they came from."""
        return validate(Workload, {**self.model_dump(), **fields}, where)

    @property
    def total_requests(self) -> int:
        """Requests in the run; one wave (= concurrency) when num_requests is not set."""
        return self.num_requests if self.num_requests is not None else self.concurrency

    def cached_len(self, request_id: int) -> int:
        """Prompt tokens of request `request_id` the prefix cache already holds: its cached share, rounded
        down, at most all but one (the engines always compute the last prompt token)."""
        n = self.prompt_len(request_id)
        return min(n - 1, int(n * self.cached_share))

    def prompt_len(self, request_id: int) -> int:
        """Prompt length of request `request_id`."""
        if self.input_lens:
            return self.input_lens[request_id % len(self.input_lens)]
        assert self.input_len is not None  # the validator guarantees one of the two
        return self.input_len


def list_workloads() -> list[str]:
    """Names of the packaged workload presets."""
    root = resources.files("tpplan.cost").joinpath("presets")
    return sorted(
        p.name[len("workload-") : -len(".toml")]
        for p in root.iterdir()
        if p.name.startswith("workload-") and p.name.endswith(".toml")
    )


WORKLOAD_ALIASES = {"seed-c8": "prompt16k-c8", "seed-c16": "prompt16k-c16"}
"""Old preset names (the seed memo's) -> the names that say what the workload is."""


def canonical_workload(name: str) -> str:
    """A preset's current name for an old one (`seed-c8` -> `prompt16k-c8`), else `name` itself."""
    return WORKLOAD_ALIASES.get(name, name)


def load_workload(name_or_path: str) -> Workload:
    """Load a preset by name (an old name in WORKLOAD_ALIASES too) or a .toml/.json file; bad files
    raise TpplanError naming the field, and so does one too large to price (`check_priceable`)."""
    check_path(name_or_path, f"--workload {name_or_path}", "pass a workload preset (`tpplan workloads`) or a file")
    path = Path(name_or_path)
    if path.suffix.lower() in (".toml", ".json") or path.exists():
        return check_priceable(validate(Workload, read_mapping(path), str(path)), str(path))
    name_or_path = canonical_workload(name_or_path)
    if name_or_path not in list_workloads():
        known = list_workloads() + list(WORKLOAD_ALIASES)
        raise unknown_name("a .toml/.json workload", name_or_path, known, "--workload", "tpplan workloads")
    res = resources.files("tpplan.cost").joinpath("presets", f"workload-{name_or_path}.toml")
    where = f"preset {name_or_path}"
    return validate(Workload, parse_toml(res.read_text(encoding="utf-8"), where, "reinstall tpplan"), where)


def distinct_batches(workload: Workload) -> int:
    """How many different prefill batches (new tokens and context of each request in it) the
    workload's schedule holds, or a bound on it of at most MAX_PRICED_BATCHES. The cheap bound first:
    a batch is either full or ends every request in it, so there are at most tokens / chunk_size +
    requests batches; only above the limit is the schedule made (unit batch times) and counted."""
    requests = workload.total_requests
    tokens = sum(workload.prompt_len(i) for i in range(requests))
    bound = -(-tokens // workload.chunk_size) + requests
    if bound <= MAX_PRICED_BATCHES:
        return bound
    return len({tuple((s.n_tokens, s.start_pos) for s in b.segments) for b in schedule(workload)})


def check_priceable(workload: Workload, where: str) -> Workload:
    """`workload`, unless pricing its batches would take minutes (more than MAX_PRICED_BATCHES
    distinct ones): then a TpplanError naming `where`, the limit and the fix."""
    n = distinct_batches(workload)
    if n <= MAX_PRICED_BATCHES:
        return workload
    longest = max(workload.input_lens or [workload.prompt_len(0)])
    suggest = min(1 << (-(-longest // 64) - 1).bit_length(), MAX_TOKENS)  # a power of two: <= 64 chunks a prompt
    raise TpplanError(
        where,
        f"its prefill schedule has {n} different batches (prompts of up to {longest} tokens in chunks of "
        f"{workload.chunk_size}); tpplan prices at most {MAX_PRICED_BATCHES}, each once per plan",
        f"use a larger chunk_size (e.g. {suggest}; engines use 2048-16384) or fewer different prompt lengths",
    )


@dataclass(frozen=True)
class Segment:
    """Part of one request's prompt in a batch: tokens [start_pos, start_pos + n_tokens)."""

    request_id: int
    start_pos: int
    n_tokens: int


@dataclass(frozen=True)
class PrefillBatch:
    """One forward pass of chunked prefill, with its start and end time in the simulation."""

    index: int
    segments: tuple[Segment, ...]
    start_s: float = 0.0
    end_s: float = 0.0
    decode_tokens: int = 0  # decode tokens the same step ran (the serving loop's decode; segments are prefill)

    @property
    def n_tokens(self) -> int:
        """Tokens in the batch (<= chunk_size)."""
        return sum(s.n_tokens for s in self.segments)


@dataclass(frozen=True)
class TTFTResult:
    """Per-request TTFT and summary; p50 is the median (mean of the middle two for even counts)."""

    ttft_s: tuple[float, ...]
    arrival_s: tuple[float, ...]
    batches: tuple[PrefillBatch, ...]
    makespan_s: float
    prefill_tokens: int
    replicas: tuple[ReplicaShare, ...] = ()  # each replica's share, when several served the workload
    mean_s: float = field(init=False)
    p50_s: float = field(init=False)
    max_s: float = field(init=False)
    throughput_tok_s: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean_s", statistics.fmean(self.ttft_s))
        object.__setattr__(self, "p50_s", statistics.median(self.ttft_s))
        object.__setattr__(self, "max_s", max(self.ttft_s))
        tput = self.prefill_tokens / self.makespan_s if self.makespan_s > 0 else float("inf")
        object.__setattr__(self, "throughput_tok_s", tput)


BatchTime = Callable[[PrefillBatch], float]
StageTimes = Callable[[PrefillBatch], Sequence[float]]
"""Seconds one batch holds each pipeline stage, in order (a stage's send into the next included)."""


class _Server:
    """One replica's chunked-prefill scheduler while a run goes (`_Run`): its queue, batches and stages."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, int]] = []  # (when a request reaches it, request), a heap
        self.waiting: dict[int, None] = {}  # FCFS (a dict: O(1) removal); a partly prefilled request stays first
        self.batches: list[PrefillBatch] = []
        self.stage_free: list[float] = []
        self.wake = math.inf  # when something may let it form a batch (a request reached it, a batch was formed)
        self.held = 0  # prompt + output tokens of its requests sent and not yet done
        self.ending: list[tuple[float, int]] = []  # (when a request is done, its tokens), a heap
        self.peak, self.peak_at = 0, 0.0  # `held` at its most, and when

    def ready(self, in_flight: int | None) -> float:
        """When it acts next: at its wake, once stage 0 is free and fewer than `in_flight` batches are out."""
        t = self.wake
        if self.stage_free:
            t = max(t, self.stage_free[0])
        if in_flight is not None and len(self.batches) >= in_flight:
            t = max(t, self.batches[-in_flight].end_s)
        return t


@dataclass(frozen=True)
class _Sent:
    """A request as the router reads it (`cost.routing.Routed`)."""

    prompt_tokens: int
    cached_tokens: int
    prefix_id: str | None = None


class _Run:
    """Event-driven closed-loop simulation of chunked prefill over pipeline stages, on the mesh's replicas
    behind the deployment's request router (one replica: no router).

    A client's request is sent at t = 0 (the first `concurrency`) or when its previous request gets its first
    token; the router (`cost.routing.Router`, policy `rule.prefill`, round-robin without a rule) picks its
    replica the moment it is sent, from the requests then in flight at each. A replica forms its next batch
    when stage 0 is free and, with `in_flight` = M, once the batch M places earlier has left the last stage;
    requests that have reached it by then join its queue. Stages run batches in order (a flow shop). A
    request's TTFT ends when the batch holding its last chunk leaves the last stage. With `chunks_overlap`
    False a request's next chunk waits until its previous chunk has left the pipeline. Events run in time
    order, the router first at a tie and then the replicas in order: the order of `simulate.replicas`'
    co-simulation, whose loop without fixed costs gives the same TTFTs (tests/cost/test_routed_replicas.py)."""

    def __init__(
        self, workload: Workload, stage_times: StageTimes, in_flight: int | None, chunks_overlap: bool,
        mesh: Mesh, rule: RouterRule | None,
    ) -> None:  # fmt: skip
        if in_flight is not None and in_flight < 1:
            fix = "pass the engine's micro-batches in flight"
            raise TpplanError("in_flight", f"must be >= 1, got {in_flight}", fix)
        self.wl, self.stage_times, self.in_flight = workload, stage_times, in_flight
        self.chunks_overlap = chunks_overlap
        self.total = workload.total_requests
        self.servers = [_Server() for _ in range(mesh.replicas)]
        self.router = Router(rule.prefill if rule is not None else "round_robin", mesh.replicas, rule)
        first = min(self.total, workload.concurrency)
        self.sends = [(0.0, rid) for rid in range(first)]  # (when sent, request), a heap
        self.next_id = first
        self.arrival_s: dict[int, float] = dict.fromkeys(range(first), 0.0)
        self.done_s: dict[int, float] = {}
        self.progress: dict[int, int] = {}
        self.out_at: dict[int, float] = {}  # when each request's latest chunk leaves the pipeline
        self.of: dict[int, int] = {}  # the replica each request went to
        self.peak_load = [0] * mesh.replicas  # the most of its requests in flight at once

    def go(self) -> TTFTResult:
        while len(self.done_s) < self.total:
            sent = self.sends[0][0] if self.sends else math.inf
            t, r = min((s.ready(self.in_flight), r) for r, s in enumerate(self.servers))
            if sent <= t:
                self.route(sent)
            elif t == math.inf:
                raise AssertionError("the scheduler stalled with requests unfinished")  # a bug, not an input
            else:
                self.act(r, t)
        return self.result()

    def route(self, now: float) -> None:
        """Every request sent at `now` to the replica the router picks."""
        wl = self.wl
        while self.sends and self.sends[0][0] <= now:
            rid = heapq.heappop(self.sends)[1]
            r = self.router.pick(_Sent(wl.prompt_len(rid), wl.cached_len(rid)), now)
            self.of[rid] = r
            self.peak_load[r] = max(self.peak_load[r], self.router.load[r])
            s = self.servers[r]
            heapq.heappush(s.arrivals, (now, rid))
            s.wake = min(s.wake, now)
            while s.ending and s.ending[0][0] <= now:
                s.held -= heapq.heappop(s.ending)[1]
            s.held += wl.prompt_len(rid) + wl.output_len
            if s.held > s.peak:
                s.peak, s.peak_at = s.held, now

    def act(self, r: int, now: float) -> None:
        """Replica `r` at `now`: take the requests that reached it, form and run a batch, or wait."""
        s, wl = self.servers[r], self.wl
        while s.arrivals and s.arrivals[0][0] <= now:
            s.waiting[heapq.heappop(s.arrivals)[1]] = None
        segs = _fill(wl, s.waiting, self.progress, None if self.chunks_overlap else self.out_at, now)
        if not segs:  # idle until a request reaches it or a request's chunk is out
            later = [s.arrivals[0][0]] if s.arrivals else []
            s.wake = min(later + [self.out_at[x] for x in s.waiting if self.out_at.get(x, 0.0) > now], default=math.inf)
            return
        draft = PrefillBatch(len(s.batches), tuple(segs), now, now)
        t = _through_stages(_stage_seconds(self.stage_times, draft), s.stage_free, now)
        s.batches.append(PrefillBatch(draft.index, draft.segments, draft.start_s, t))
        s.wake = now
        for sg in segs:
            rid = sg.request_id
            self.progress[rid] = sg.start_pos + sg.n_tokens
            self.out_at[rid] = t
            if self.progress[rid] == wl.prompt_len(rid):
                del s.waiting[rid]
                self.done_s[rid] = t
                self.router.release(r, t)
                heapq.heappush(s.ending, (t, wl.prompt_len(rid) + wl.output_len))
                if self.next_id < self.total:  # the client sends its next request at once
                    heapq.heappush(self.sends, (t, self.next_id))
                    self.arrival_s[self.next_id] = t
                    self.next_id += 1

    def result(self) -> TTFTResult:
        """Each request's TTFT (its last chunk out of the pipeline, less its sending), in order; with replicas,
        every replica's batches by start time and each one's share."""
        wl, ids = self.wl, range(self.total)
        batches = [b for s in self.servers for b in s.batches]
        if len(self.servers) > 1:
            batches.sort(key=lambda b: (b.start_s, b.end_s))
        ttft = tuple(self.done_s[i] - self.arrival_s[i] for i in ids)
        return TTFTResult(
            ttft_s=ttft,
            arrival_s=tuple(self.arrival_s[i] for i in ids),
            batches=tuple(batches),
            makespan_s=max(b.end_s for b in batches),
            prefill_tokens=sum(wl.prompt_len(i) for i in ids),
            replicas=tuple(self._share(r, ttft) for r in range(len(self.servers))) if len(self.servers) > 1 else (),
        )

    def _share(self, r: int, ttft: tuple[float, ...]) -> ReplicaShare:
        mine = [i for i, x in self.of.items() if x == r]
        s = self.servers[r]
        if not mine:
            return ReplicaShare(0, 0, 0, math.nan, 0.0)
        mean = math.fsum(ttft[i] for i in mine) / len(mine)
        tokens = sum(self.wl.prompt_len(i) for i in mine)
        at = s.peak_at  # the requests it held at its most tokens: sent by then and not done
        held = tuple(
            self.wl.prompt_len(i) + self.wl.output_len for i in mine if self.arrival_s[i] <= at < self.done_s[i]
        )
        return ReplicaShare(len(mine), self.peak_load[r], tokens, mean, max(b.end_s for b in s.batches), held)


def _run(
    workload: Workload, stage_times: StageTimes, in_flight: int | None = None, chunks_overlap: bool = True,
    mesh: Mesh | None = None, rule: RouterRule | None = None,
) -> TTFTResult:  # fmt: skip
    """`_Run` on `mesh`'s replicas (None: one) behind the router `rule` states."""
    return _Run(workload, stage_times, in_flight, chunks_overlap, mesh or Mesh(1), rule).go()


def _stage_seconds(stage_times: StageTimes, batch: PrefillBatch) -> list[float]:
    """`stage_times` of one batch, checked: a time per stage, none negative (else a TpplanError naming it)."""
    times = [float(t) for t in stage_times(batch)]
    if not times or min(times) < 0:
        raise TpplanError("stage_times", f"returned {times} s for batch {batch.index}", "return >= 0 per stage")
    return times


def _through_stages(times: list[float], stage_free: list[float], start: float) -> float:
    """When a batch formed at `start` that holds the stages `times` seconds leaves the last one. A flow shop:
    it enters stage k once it has left stage k-1 and stage k has finished the batch before it. `stage_free`
    (when each stage is free; empty before the first batch) is updated."""
    if not stage_free:
        stage_free += [0.0] * len(times)
    t = start
    for k, dt in enumerate(times):  # in order through every stage
        t = max(t, stage_free[k]) + dt
        stage_free[k] = t
    return t


def _fill(
    workload: Workload, waiting: dict[int, None], progress: dict[int, int], out_at: dict[int, float] | None, now: float
) -> list[Segment]:
    """The next batch's segments: waiting requests in FCFS order until the chunk budget is spent (with
    `out_at`, only those whose previous chunk has left the pipeline by `now`). It stops there, so a
    batch costs its own segments, not the length of the queue."""
    budget = workload.chunk_size
    segs: list[Segment] = []
    for rid in waiting:
        if budget == 0:
            break
        if out_at is not None and out_at.get(rid, 0.0) > now:
            continue
        pos = progress.get(rid, workload.cached_len(rid))  # a cached prefix is context, not work
        take = min(budget, workload.prompt_len(rid) - pos)
        segs.append(Segment(rid, pos, take))
        budget -= take
    return segs


def schedule(workload: Workload, batch_time: BatchTime | None = None) -> list[PrefillBatch]:
    """The prefill batches the chunked-prefill scheduler runs, in order (unit time per batch
    unless `batch_time` is given; closed-loop arrivals depend on it)."""
    bt = batch_time or (lambda _b: 1.0)
    return list(_run(workload, lambda b: (bt(b),)).batches)


def simulate_ttft(workload: Workload, batch_time: BatchTime) -> TTFTResult:
    """TTFT per request without pipeline stages: from its submission to the end of the batch
    holding its last chunk, batches one after another."""
    return _run(workload, lambda b: (batch_time(b),))


def simulate_pipeline(
    workload: Workload, stage_times: StageTimes, *, in_flight: int, chunks_overlap: bool = True
) -> TTFTResult:
    """TTFT per request with chunked prefill over pipeline stages, as an engine schedules it:
    `stage_times(batch)` the seconds the batch holds each stage, at most `in_flight` batches in the
    pipeline, chunks of one prompt overlapping across stages unless `chunks_overlap` is False
    (`tpplan.cost.pipeline` takes these from the engine data)."""
    return _run(workload, stage_times, in_flight, chunks_overlap)


# -- replicas: the requests split between identical copies of a deployment -------------------------


def check_replicas(workload: Workload, mesh: Mesh) -> None:
    """Every replica needs a client and a request: R above the concurrency or the requests is refused."""
    replicas = mesh.replicas
    if replicas < 1:
        raise TpplanError(f"replicas {replicas}", "must be at least 1", "pass 1 or more replicas")
    clients, total = workload.concurrency, workload.total_requests
    if replicas > min(clients, total):
        raise TpplanError(
            f"replicas {replicas}",
            f"workload {workload.name} has {clients} concurrent clients and {total} requests: some replicas "
            "would get none",
            f"use at most {min(clients, total)} replicas",
        )


def simulate_routed(
    workload: Workload, stage_times: StageTimes, mesh: Mesh, rule: RouterRule | None, *, in_flight: int | None = None,
    chunks_overlap: bool = True,
) -> TTFTResult:  # fmt: skip
    """TTFT of `workload` on the mesh's replicas behind the deployment's request router (`rule`: its record,
    `tpplan.engines.routing`; None: round-robin), each replica's batches `stage_times` through its stages
    (`simulate_pipeline`'s `in_flight`, `chunks_overlap`): per request in the workload's order, the mean over
    all of them, every replica's batches by start time, each replica's share (`ReplicaShare`: its clients
    the most of its requests in flight at once)."""
    check_replicas(workload, mesh)
    return _run(workload, stage_times, in_flight, chunks_overlap, mesh, rule)


def dealt_is_routed(workload: Workload, mesh: Mesh) -> bool:
    """Whether the dealt split's mean TTFT (`replica_workloads`) is the router's (`simulate_routed`) for any batch
    times and every router: one replica, or prompts all alike with R dividing the clients (the replicas then
    run alike, whichever replica a request goes to). Taken from that symmetry, not proven: checked on random
    closed loops of the three policies, PP stages and cached prefixes (tests/cost/test_routed_replicas.py)."""
    if mesh.replicas == 1:
        return True
    alike = workload.input_lens is None or len(set(workload.input_lens)) == 1
    return alike and workload.concurrency % mesh.replicas == 0


def replica_workloads(workload: Workload, mesh: Mesh) -> tuple[Workload, ...]:
    """Each replica's share of `workload` when `mesh.replicas` identical copies of a deployment serve it.

    The split dealt beforehand: client c of the closed loop is served by replica c mod R, and replica r
    serves requests r, r + R, r + 2R, ... of the workload in its own submission order (so their
    prompt lengths), each replica a closed loop of its own with its own chunked-prefill scheduler. It does not
    depend on batch times, which keeps the search's walk linear (`search.objectives.ttft_batches`: its screen)
    and gives each replica's KV a floor (`Predictor.memory`). No TTFT tpplan prints or ranks by is this split's:
    those are the router's (`simulate_routed`, `simulate.replicas`), which this split equals for a round-robin
    router on alike prompts with R dividing C, and for vLLM's least-loaded one there too (tests/simulate/
    test_routing.py; where they differ: tests/cost/test_routed_replicas.py). R above the concurrency or the
    requests is refused (`check_replicas`)."""
    check_replicas(workload, mesh)
    replicas = mesh.replicas
    if replicas == 1:
        return (workload,)
    clients, total = workload.concurrency, workload.total_requests
    lens = workload.input_lens or [workload.prompt_len(0)]
    period = len(lens) // math.gcd(len(lens), replicas)  # replica r's prompts repeat after this many
    out = []
    for r in range(replicas):
        mine = [lens[(r + j * replicas) % len(lens)] for j in range(period)]
        out.append(
            workload.with_overrides(
                f"workload {workload.name}, replica {r}",
                concurrency=len(range(r, clients, replicas)),
                num_requests=len(range(r, total, replicas)),
                input_len=None,
                input_lens=mine,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class ReplicaShare:
    """One replica's part of a workload: its requests, clients, prefill tokens and TTFT."""

    requests: int
    concurrency: int
    prefill_tokens: int
    mean_s: float
    makespan_s: float
    # prompt + output tokens of each request it held at once at its most tokens (the cost model's routed run;
    # sent and not yet at its first token): what its KV pool must hold (`Predictor.memory`)
    peak_held: tuple[int, ...] = ()
