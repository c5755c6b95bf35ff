"""Offline tooling, outside the importable package: fits, comparison reports and benchmarks that
write presets or docs (run from a checkout: `python -m tools.NAME`). Tested by the suite; the
library never imports them."""
