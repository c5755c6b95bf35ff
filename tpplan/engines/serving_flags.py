"""The launch flags that pin what a serving simulation assumed: the memory settings, the step budget and the
running-request cap of an engine instance, and the role of a P/D pool's server.

`memory_flags(engine, settings, chunk_tokens, max_running)` writes the engine's own flags for the KV pool's
memory share (`KVCapacity.settings`, derived as the engine derives it: `tpplan.engines.memory`), the step
budget and the running-request cap; `pd_flags(engine, role)` the flags that make a server a P/D prefill or
decode server. Each flag name is read from the engine's argument definitions (`SOURCES`).
"""

from __future__ import annotations

from typing import Literal

from tpplan.engines.schema import Source

Role = Literal["prefill", "decode"]

SGLANG_MEMORY = Source(
    "sgl-project/sglang",
    "python/sglang/srt/arg_groups/fields/schedule.py",
    "Schedule.mem_fraction_static / chunked_prefill_size / max_running_requests (CLI names from the field names: "
    "arg_groups/arg_utils.py _field_to_cli_name)",
    "0.5.23 (PyPI wheel)",
)
SGLANG_PD = Source(
    "sgl-project/sglang",
    "python/sglang/srt/arg_groups/fields/disagg.py",
    "Disagg.disaggregation_mode ('prefill' / 'decode'), disaggregation_transfer_backend (default 'mooncake')",
    "0.5.23 (PyPI wheel)",
)
VLLM_MEMORY = Source(
    "vllm-project/vllm",
    "vllm/engine/arg_utils.py",
    "EngineArgs.add_cli_args: --gpu-memory-utilization (CacheConfig), --max-num-batched-tokens, --max-num-seqs "
    "(SchedulerConfig)",
    "0.34.0 (PyPI wheel)",
)
VLLM_PD = Source(
    "vllm-project/vllm",
    "vllm/config/kv_transfer.py",
    "KVTransferConfig.kv_connector / kv_role ('kv_producer', 'kv_consumer', 'kv_both'), set by --kv-transfer-config "
    "(engine/arg_utils.py); NixlConnector registered in distributed/kv_transfer/kv_connector/factory.py; "
    "kv_role 'kv_both' deprecated for NixlConnector: kv_producer on prefill servers, kv_consumer on decode servers "
    "(distributed/kv_transfer/kv_connector/v1/nixl/connector.py NixlBaseConnector.__init__)",
    "0.34.0 (PyPI wheel)",
)
VLLM_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}  # NixlBaseConnector.__init__'s advice
SOURCES = {"sglang": (SGLANG_MEMORY, SGLANG_PD), "vllm": (VLLM_MEMORY, VLLM_PD)}


def _name(engine: str) -> str:
    """`sglang@0.5.23` / `SGLang` -> `sglang`."""
    return engine.split("@")[0].lower()


def memory_flags(
    engine: str, settings: dict[str, float], chunk_tokens: int, max_running: int | None
) -> tuple[str, ...]:
    """The engine's flags for its KV pool's memory share (from `settings`, `KVCapacity.settings`: SGLang's
    `mem_fraction_static`, vLLM's `gpu_memory_utilization`), the step budget `chunk_tokens` and, where given,
    the running-request cap."""
    if _name(engine) == "sglang":
        out = [f"--mem-fraction-static {settings['mem_fraction_static']:g}", f"--chunked-prefill-size {chunk_tokens}"]
        return (*out, *((f"--max-running-requests {max_running}",) if max_running is not None else ()))
    out = [
        f"--gpu-memory-utilization {settings['gpu_memory_utilization']:g}",
        f"--max-num-batched-tokens {chunk_tokens}",
    ]
    return (*out, *((f"--max-num-seqs {max_running}",) if max_running is not None else ()))


def pd_flags(engine: str, role: Role) -> tuple[str, ...]:
    """The flags that make an engine server one side of a P/D deployment (SGLang: its default transfer
    backend, mooncake; vLLM: the NIXL connector, which the P/D loop's pull hand-off models, with the role
    the connector asks for: kv_both is deprecated and refused under prefill CP)."""
    if _name(engine) == "sglang":
        return (f"--disaggregation-mode {role}",)
    return (f'--kv-transfer-config \'{{"kv_connector":"NixlConnector","kv_role":"{VLLM_KV_ROLE[role]}"}}\'',)


def sources(engine: str) -> tuple[Source, Source]:
    """(memory flags, P/D flags) sources of `engine`."""
    return SOURCES[_name(engine)]


__all__ = ["SOURCES", "Role", "memory_flags", "pd_flags", "sources"]
