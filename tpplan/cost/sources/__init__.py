"""Kernel sources: the measured databases and fitted models a GPU model asks for op prices.

Each module here implements `tpplan.cost.kernel_source.KernelSource`. `aic` reads NVIDIA
AIConfigurator's per-engine silicon database (optional extra `tpplan[aic]`); `aic_fitted` prices the
shapes that database lacks from physical models fitted on its rows, shipped as a JSON preset so it
works without the extra; `aic_curves` reads its collective tables. Only adapters live here: the
offline fits, comparison reports and curve checks are scripts in the checkout's `tools/` folder.
"""
