"""Server flags that realise a plan in SGLang and vLLM, and the engines' own static conditions.

A plan that tpplan calls legal and fast is worth nothing if the engine silently ignores the flag
that should turn it on. SGLang's input-scattered path is the seed's example: its gate only logs an
info line when a condition fails and runs the ordinary all-reduce path. This module writes the
flags per plan and checks the conditions it can decide from the model and the plan; conditions
that depend on other server settings are listed as "keep" conditions.

Facts come from the engines' sources (paths relative to each repository's root). Versions read:
SGLang `adapters/attention.py` at commit 7665ff96 (the conditions below were re-checked against it
on 2026-12-01); vLLM `sequence_parallelism.py` in two revisions: the threshold tables below are the
later one (sm100 at 32 MiB per GPU; an earlier revision had 64, the oldest, commit 7d7e95dc, had no
thresholds at all). The other paths were read from the engines' main branches without a recorded
commit; they can drift with releases.
- SGLang `python/sglang/srt/layers/communicator/adapters/attention.py`: `AttnTpContext.init_context`
  allows input-scattered only with `--enable-attn-tp-input-scattered`, CUDA or NPU, `q_lora_rank`
  set, not DSA (unless MHC), tp_size > 1, no DP attention, `moe_a2a_backend` none, no MoE-dense
  full DP, no piecewise CUDA graph for prefill, speculative algorithm not EAGLE3; otherwise it
  only logs "attn_tp_input_scattered is not enabled while other conditions are not met".
  `use_input_scattered` applies it to extend (prefill) batches only, not target-verify, not
  two-batch-overlap batches. `AttentionInputs.fetch_hidden_states` all-gathers the scattered hidden
  for any consumer that needs it (how a gated MLA still runs, paying the hidden all-gather).
- SGLang `python/sglang/srt/server_args.py` `_handle_a2a_moe`: `--moe-a2a-backend deepep` (and
  mooncake) sets ep_size = tp_size; `--deepep-mode normal` disables CUDA graphs.
- SGLang `python/sglang/srt/layers/communicator/__init__.py` (`sparse_mlp_scatter_mode`): with an
  a2a backend the MoE runs on the rank's own (scattered) tokens; `LayerCommunicator` builds the
  input-scattered steps only when `_input_can_be_scattered` (tp > 1, attention DP 1, no a2a backend).
- SGLang `python/sglang/srt/layers/layernorm_sp.py`: `--enable-layernorm-sp` takes effect only for
  `SP_SUPPORTED_ARCHITECTURES` = {Qwen3ForCausalLM} (Qwen3 dense; "other models reject
  --enable-layernorm-sp at construction"), prefill (EXTEND) only, tp_size > 1; server_args'
  validation also rejects DP attention with it. Earlier revisions only left SP off for other
  architectures; the memo follows the later, refusing one.
- SGLang `docs/advanced_features/server_arguments.md`: `--tp-size/--tp`, `--ep-size/--ep`,
  `--moe-a2a-backend {none, deepep, mooncake, ...}`, `--moe-runner-backend ... flashinfer_mxfp4`,
  `--pp-size`, `--chunked-prefill-size`, `--enable-dp-attention`, `--dp`.
- vLLM `vllm/config/parallel.py` (`ParallelConfig`): `--tensor-parallel-size`,
  `--pipeline-parallel-size`, `--data-parallel-size`, `--enable-expert-parallel` (EP over the
  TP x DP ranks; no separate EP size), `--all2all-backend` (default `allgather_reducescatter`;
  `deepep_high_throughput` for prefill, `deepep_low_latency`, `pplx`, `naive`, ...).
- vLLM `vllm/compilation/passes/fusion/sequence_parallelism.py` (earlier
  `vllm/compilation/sequence_parallelism.py`), `SequenceParallelismPass`: a torch.compile pattern
  pass that rewrites all-reduce + RMSNorm into reduce-scatter + norm + all-gather, switched on by
  the compilation config's `pass_config.enable_sp` (`enable_sequence_parallelism` in earlier
  releases; `vllm/config/vllm.py` also turns it on for `fuse_gemm_comms`, async TP); where the
  pattern does not match, nothing changes and nothing is logged as an error. The pass applies only
  on CUDA GPUs with an entry in its tables (sm90: hidden >= 8192, 8 MiB per GPU; sm100 family:
  hidden >= 8192, 32 MiB per GPU; anything else, e.g. sm120, gets no SP) and to batches of at least
  min_per_gpu_MiB x tp / (hidden x element size) tokens (`get_sequence_parallelism_threshold`).
- SGLang `python/sglang/srt/layers/communicator/construction.py` (read through the code search, no
  commit recorded): `_input_can_be_scattered` builds the input-scattered steps only with tp > 1,
  attention DP 1, no a2a backend, no dense-MLP full DP, and not while prefill context parallelism
  shards tokens (`_generic_prefill_cp_shards_tokens`: attn_cp_size > 1 and enable_prefill_cp).
- SGLang `python/sglang/srt/arg_groups/linear_attn_cp_hook.py` (`resolve_linear_attn_cp`), the
  linear-attention prefill CP case: with --enable-prefill-cp and attention CP > 1 on a model with
  linear attention it raises for architectures outside its list, requires --cp-strategy zigzag,
  refuses speculative decoding, DCP, mixed chunks, DP attention, moe-dp > 1, PD disaggregation, needs
  the linear heads divisible by tp, and disables prefill CUDA graphs. The list differs by revision:
  commit 129e0056 admits only Qwen4-Exp; another revision (read without a commit) admits Qwen3-Next,
  Kimi-Linear and Kimi-K3 and, for Kimi-K3, refuses --enable-attn-tp-input-scattered, EP > 1, PP > 1,
  an a2a backend other than none and waterfill, and needs fa3/fa4 prefill attention. The memo
  models the refusal for K3 and the generic skip for every model.
  A helper module whose path the search did not give (`sp_cp_static_enabled`) keeps a
  sequence-sharded residual only for collocated CP (attn_cp == tp), no DP attention, no a2a, PP 1.
- SGLang `python/sglang/srt/layers/k3_sp_collective.py` at commit 10e1be0e (`_init_state`): K3's
  SP-MoE reduce-scatter/all-gather use fused multicast kernels on CustomAllReduceV2's push workspace
  only on SM103 (B300/GB300), with the attention-TP group at 4 or 8 ranks, --moe-a2a-backend
  megamoe or deepep, CustomAllReduceV2 enabled with multicast, a checked-in tuning table for the
  device at hidden 7168 and SGLANG_K3_SP_COLLECTIVE not set to 0; per call the tensor must be bf16,
  contiguous, hidden 7168, tokens divisible by the group, the shard within `max_push_size`, and the
  table's bucket may itself keep NCCL. Otherwise it logs "... using NCCL" and runs NCCL's RS/AG (the
  model calls it from `python/sglang/srt/models/kimi_k3.py`, `_sp_all_gather_rows`). Not found:
  which GPUs have tuning tables besides GB300/B300, and `max_push_size`'s value.
- vLLM `vllm/config/parallel.py` at commit 840e7972, `ParallelConfig.use_sequence_parallel_moe`:
  all2all backend in {allgather_reducescatter, naive, deepep_high_throughput, deepep_low_latency,
  mori} (not pplx), --enable-expert-parallel, tp > 1 and dp > 1. Other revisions list
  mori_high_throughput/mori_low_latency, nixl_ep or flashinfer_nvlink_one_sided instead.
- vLLM `vllm/model_executor/models/nemotron_h.py` (no commit recorded; DeepSeek-V2 and the Qwen MoE
  models read the same `is_sequence_parallel = parallel_config.use_sequence_parallel_moe`): the MoE
  block takes its TP rank's chunk of the replicated hidden (`sequence_parallel_chunk`), runs shared
  experts and latent projections unsharded, and all-gathers the MoE output over TP instead of the
  all-reduce; attention still ends in an all-reduce.
"""

from __future__ import annotations

from typing import Any

from tpplan.layout.plan import Plan
from tpplan.models.spec import ModelSpec
from tpplan.report.engines.base import Condition, EngineRecipe, family, gpu_capability
from tpplan.report.engines.sglang import sglang_recipe
from tpplan.report.engines.vllm import vllm_recipe


def recipes(plan: Plan, spec: ModelSpec, *, prefill_cp: int = 1, dp: int = 1, **deployment: Any) -> list[EngineRecipe]:
    """Both engines' recipes for one plan at one `deployment` (tp, pp, nodes, chunk, gpu: see
    `sglang_recipe`); `prefill_cp` is SGLang's prefill context parallelism, `dp` vLLM's data-parallel
    size (each engine's gates read the one it has)."""
    return [sglang_recipe(plan, spec, cp=prefill_cp, **deployment), vllm_recipe(plan, spec, dp=dp, **deployment)]


__all__ = ["Condition", "EngineRecipe", "family", "gpu_capability", "recipes", "sglang_recipe", "vllm_recipe"]
