"""The benchmarks of moe-numba: run from a checkout (``python -m benchmarks --help``), never
installed with the package.

``bench`` times moe_permute and the weighted moe_unpermute per shape, each a median after
warm-up: on a GPU the GPU time per call with the host running ahead, the latency of one call
right after a host sync, and the host time per call; on the CPU backend, the wall time per
call. A copy of the same bytes, timed in the same run in the same modes, is the roofline
(:mod:`.bytes` counts the bytes). ``--peers`` times the same ops of Transformer Engine and
vLLM beside moe-numba's, ``--gradients`` the gradient ops beside Transformer Engine's.

Modules: ``bench`` (its command line and checks), ``cases`` (shapes and inputs), ``bytes``
(byte accounting), ``target`` (the array library: every per-library choice), ``timers``,
``hold`` (the stream hold the GPU timer launches), ``workload`` (the timed calls), ``cpu``
and ``cuda`` (the bench per backend), ``numpy_baseline`` (the CPU baseline), ``report``
(the printed table), ``plot``, ``run`` (one run),
``peers`` and ``peer_gradients`` (``--peers``), ``footprint`` (the memory a shape needs),
``options`` (the options the command lines share and their checks). Benches of their own:
``gradients`` (the gradient ops against a copy), ``memory`` (the peak memory of a training
step), ``layer`` (the transformers experts layer of real models, and its decode steps in a
CUDA graph), ``distributed`` (the expert-parallel layer's time per stage).

Every GPU run writes a record (``records``: figures with their min, median and max;
``environment``: the commit, the device and its clocks, the versions) under ``results/``;
``compare`` compares two records of one card, ``tables`` renders the README's and the docs'
tables from records and checks them.
"""
