"""tpplan: plan, audit, predict and prove tensor-parallel prefill communication for LLM serving."""

__version__ = "0.1.0"
