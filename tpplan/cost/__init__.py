"""Cost model: topology, collective and GEMM time, workload schedule and TTFT. Imports no torch."""
