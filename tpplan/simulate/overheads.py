"""Fixed costs outside the forward pass, as data from cited public measurements, each with a band.

Two figures give short prompts their TTFT floor (docs/cost-model.md, "Serving loop"):
- per request: the round trip outside the forward at one request in flight (HTTP, tokenise, hand to
  the scheduler, the step's CPU, sample the first token, detokenise, stream it back); the loop charges
  it before the scheduler sees the request (`LoopConfig.request_in_s`);
- per step: the scheduler's CPU time for a step (schedule, prepare inputs, launch), paid in full when
  the engine cannot overlap it with the previous step's GPU work (SGLang under PP, vLLM without async
  scheduling) and only its residue when it can (`LoopConfig.step_overhead_s`).
Nothing here is fitted to the validation points of docs/benchmarks.md; each value is the figure its
source states, and the band is the range the sources span.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    """One public figure: what it measures, seconds, its band, the setup, where, and its words."""

    quantity: str
    value_s: float
    low_s: float
    high_s: float
    setup: str
    url: str
    quote: str

    def cite(self) -> str:
        band = f"{self.low_s * 1e3:.2f}-{self.high_s * 1e3:.2f} ms"
        return f"{self.value_s * 1e3:.2f} ms ({band}; {self.setup}; {self.url})"


REQUEST_ROUND_TRIP = Measurement(
    quantity="per request, outside the forward",
    value_s=9.54e-3 - 2.632e-3,
    low_s=5e-3,
    high_s=10e-3,
    setup="SGLang with a CPU mock model whose forward busy-waits 2.632 ms, 128-token prompts, one request in flight, "
    "median TTFT 9.54 ms: 6.91 ms outside the forward",
    url="https://github.com/tenstorrent/tt-inference-server/issues/3560",
    quote="Forward floor (1000/TSU) 2.632 ms ... Median TTFT 9.54 ms",
)

STEP_CPU = Measurement(
    quantity="per step, scheduler CPU not overlapped",
    value_s=5.5e-3,
    low_s=2.5e-3,
    high_s=13e-3,
    setup="vLLM V1 engine core, Llama-2-7B, 256 requests per step: 5-6 ms between steps (band: 2.5 ms for the V0 "
    "scheduler alone on an A10, vllm-project/vllm PR 4261, to 13 ms of GPU bubble per V0 step, issue 6854)",
    url="https://github.com/vllm-project/vllm/issues/10634",
    quote="the gap between the two decodes at this time is about 5-6ms (token gap)",
)

STEP_CPU_OVERLAPPED = Measurement(
    quantity="per step, scheduler CPU overlapped with the previous step",
    value_s=0.16e-3,
    low_s=0.05e-3,
    high_s=0.17e-3,
    setup="vLLM V1 with asynchronous scheduling, 256 requests per step: the gap dropped to 150-170 us (50-70 us "
    "without CUDA graphs)",
    url="https://github.com/vllm-project/vllm/pull/11133",
    quote="dropped from the original 5-6ms to 150-170us",
)


@dataclass(frozen=True)
class Overheads:
    """The loop's fixed costs for one engine deployment, and the measurements they come from."""

    request_s: float
    step_s: float
    cpu_overlap: bool
    sources: tuple[Measurement, ...]

    def band(self) -> tuple[Overheads, Overheads]:
        """The same costs at the low and the high end of their sources' bands (no sources: itself twice)."""
        if not self.sources:
            return self, self
        req, step = self.sources
        return (
            Overheads(req.low_s, step.low_s, self.cpu_overlap, self.sources),
            Overheads(req.high_s, step.high_s, self.cpu_overlap, self.sources),
        )

    def condition(self) -> str:
        """The same in words, without figures (a memo's condition; the figures are in the JSON and docs)."""
        if not self.sources:
            return "no per-request or per-step costs (the idealised loop)"
        how = "overlapped with the GPU" if self.cpu_overlap else "not overlapped with the GPU"
        return (
            "the per-request and per-step scheduler costs (here " + how + ") are public measurements of other "
            'setups, not of this deployment (docs/cost-model.md, "Serving loop")'
        )

    def describe(self) -> str:
        """One line for a memo's conditions: the costs and their sources."""
        if not self.sources:
            return "no per-request or per-step costs (the idealised loop)"
        req, step = self.sources
        how = "overlapped with the previous step" if self.cpu_overlap else "not overlapped"
        return f"per-request {req.cite()}; per-step scheduler CPU ({how}) {step.cite()}"


def overheads(cpu_overlap: bool) -> Overheads:
    """The fixed costs when the engine overlaps its scheduler with the GPU (`cpu_overlap`) or not.
    The per-request figure was measured on SGLang; no public vLLM figure of the same round trip was
    found, so vLLM uses it too (its band says how far it may be off)."""
    step = STEP_CPU_OVERLAPPED if cpu_overlap else STEP_CPU
    return Overheads(REQUEST_ROUND_TRIP.value_s, step.value_s, cpu_overlap, (REQUEST_ROUND_TRIP, step))


NONE = Overheads(0.0, 0.0, True, ())
"""No fixed costs: the idealised loop (today's TTFT, for comparison)."""


def cost_lines() -> frozenset[str]:
    """Every line `Overheads.describe` writes into a loop's conditions (overlapped, not overlapped, none):
    what a printed list tells apart as the fixed costs priced, not as something the loop leaves out."""
    return frozenset(o.describe() for o in (overheads(True), overheads(False), NONE))


__all__ = [
    "NONE",
    "REQUEST_ROUND_TRIP",
    "STEP_CPU",
    "STEP_CPU_OVERLAPPED",
    "Measurement",
    "Overheads",
    "cost_lines",
    "overheads",
]
