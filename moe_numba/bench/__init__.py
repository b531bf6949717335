"""``python -m moe_numba bench``: what each call costs, against a copy of the same bytes.

Per operation and shape it reports, each a median after warm-up, the GPU time per call
with the host running ahead, the latency of one call right after a host sync, and the host
time per call; on the CPU backend, the wall time per call. A copy of the same bytes, timed
in the same run in the same modes, is the roofline (:mod:`._bytes` counts the bytes).

Modules: ``_cases`` (shapes and inputs), ``_bytes`` (byte accounting), ``_target`` (the
array library: every per-library choice), ``_timers``, ``_workload`` (the timed calls),
``_cpu`` and ``_cuda`` (the bench per backend), ``_numpy`` (the CPU baseline), ``_results``
(results and their JSON), ``_report`` (table, comparison), ``_plot``, ``_run`` (one run),
``_peers`` and ``_peer_gradients`` (``--peers``: the same ops of Transformer Engine and vLLM
beside moe-numba's, and the gradients beside Transformer Engine's), ``_memory`` (the peak
memory of a training step). The command line and its checks are in
:mod:`moe_numba.__main__`. ``_distributed`` is a bench of its own, the expert-parallel
layer's time per stage (``python -m moe_numba.bench._distributed``).
"""

from ._run import Settings, run

__all__ = ["Settings", "run"]
