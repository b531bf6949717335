"""LayerTimer: the expert-parallel layer's stage times, forward and backward (issue 43 item 3).

A one-rank gloo group in this process. Between steps the caller does other work (a sleep):
none of it may be charged to a stage, whichever of the layer's inputs require a gradient (a
first MoE layer over frozen embeddings gets an ``x`` that needs none).
"""

import time

import pytest

torch = pytest.importorskip("torch", reason="the expert-parallel layer needs torch")
dist = pytest.importorskip("torch.distributed", reason="needs torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch build has no gloo backend", allow_module_level=True)

from moe_numba.torch.distributed import LayerTimer, expert_parallel_moe  # noqa: E402

# seconds of other work between steps: a stage that runs on until the next step gets at
# least two of them (2 * PAUSE); a few steps of this small layer take a fraction of one
PAUSE = 0.5
STEPS = 3


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "needs_grad", [("x", "probs"), ("probs",), ("x",), ()], ids=lambda n: "+".join(n) or "none"
)
def test_time_between_steps_is_charged_to_no_stage(one_rank, needs_grad):
    generator = torch.Generator().manual_seed(0)
    weights = torch.rand(4, requires_grad=True, generator=generator)

    def expert_fn(rows, tokens_per_expert, probs):
        w = torch.cat([weights[e : e + 1].expand(n) for e, n in enumerate(tokens_per_expert)])
        return rows * w.unsqueeze(1)

    timer = None  # (the first step is a warm-up: its forward loads what the ops need)
    for _ in range(STEPS + 1):
        x = torch.randn(16, 8, generator=generator).requires_grad_("x" in needs_grad)
        routemap = torch.rand(16, 4, generator=generator).argsort(1)[:, :2]
        probs = torch.rand(16, 2, generator=generator).requires_grad_("probs" in needs_grad)
        y = expert_parallel_moe(x, routemap, probs, expert_fn, 4, timer=timer)
        y.sum().backward()
        time.sleep(PAUSE)
        timer = LayerTimer() if timer is None else timer
    assert weights.grad is not None
    total = sum(timer.backward.values())
    assert total < PAUSE, f"{total:.3f} s of backward over {STEPS} steps: {timer.backward}"
    assert timer.backward["experts"] > 0, timer.backward
