"""The transformers experts backend (moe_numba.transformers) against transformers' own.

A grid of MoE families, each a tiny random-init model built from its own config class
(tests/_hf_families.py): float32 logits and every parameter's gradient against the ``eager``
experts implementation, and greedy ``generate`` equal to eager's. The default run takes a
diverse subset; ``MOE_TRANSFORMERS_ALL=1`` runs every family of the installed transformers
that has a causal LM and uses its experts interface. Then direct tests of the experts function:
duplicate experts in one token's top-k, expert-parallel sentinels, bfloat16, non-contiguous
inputs, the undefined rows of the grouped GEMM, and ``torch.compile(fullgraph=True)``.
"""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", minversion="5", reason="the experts backend needs transformers>=5"
)

import _hf_families  # noqa: E402
import moe_numba.transformers as mt  # noqa: E402

pytestmark = [
    # transformers and the families' modeling code warn about their own internals (deprecated
    # arguments, fallbacks to reference kernels): not what these tests check
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

RTOL = 5e-6  # float32: the backends sum the same products in other orders
# a parameter whose gradient is tiny next to the model's largest (a router in front of a
# saturated score) carries only the rounding noise of the large ones: its error is measured
# against this share of the largest gradient
GRAD_FLOOR = 1e-3
MAX_PARAMETERS = 10_000_000
CALLS = []  # one entry per call of the counted backend
# the experts function's own tests also run on a GPU where there is one
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _families():
    if os.environ.get("MOE_TRANSFORMERS_ALL") == "1":
        return _hf_families.families()
    installed = set(_hf_families.families())
    return [f for f in _hf_families.DEFAULT if f in installed]


@pytest.fixture(scope="module", autouse=True)
def _registered():
    from transformers.integrations.moe import ExpertsInterface

    mt.register()

    def counted(*args, **kwargs):
        CALLS.append(1)
        return mt.experts_forward(*args, **kwargs)

    ExpertsInterface.register("moe_numba_counted", counted)


def _model(family):
    from transformers import AutoModelForCausalLM

    if family in _hf_families.UNBUILDABLE:
        pytest.skip(f"{family}: {_hf_families.UNBUILDABLE[family]}")
    config = _hf_families.tiny_config(family)
    count = _hf_families.parameter_count(config)
    if count > MAX_PARAMETERS:
        pytest.skip(f"{family}: the shrunk config still has {count} parameters")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, experts_implementation="eager").eval()
    with torch.no_grad():  # experts initialised to zero or tiny values would test nothing
        for name, parameter in model.named_parameters():
            if ".experts." in name and parameter.dim() >= 2:
                parameter.normal_(0.0, 0.2)
    return model, config


def _run(model, ids, weight):
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits
    (logits * weight).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def _rel(a, b, floor=0.0):
    return ((a - b).abs().max() / max(b.abs().max().item(), floor, 1e-30)).item()


@pytest.mark.parametrize("family", _families())
def test_family(family):
    model, config = _model(family)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, config.vocab_size, (2, 9), generator=generator)
    weight = torch.randn(2, 9, config.vocab_size, generator=generator)
    logits, grads = _run(model, ids, weight)
    expected = model.generate(
        ids[:1, :5], max_new_tokens=4, do_sample=False, min_new_tokens=4, pad_token_id=0
    )

    model.set_experts_implementation("moe_numba_counted")
    CALLS.clear()
    got_logits, got_grads = _run(model, ids, weight)
    assert CALLS, f"{family}: the experts backend was never called"
    assert got_grads.keys() == grads.keys()
    assert _rel(got_logits, logits) <= RTOL
    largest = max(g.abs().max().item() for g in grads.values())
    worst = max(_rel(got_grads[n], g, GRAD_FLOOR * largest) for n, g in grads.items())
    assert worst <= RTOL, f"{family}: gradient relative error {worst:.2e}"
    got = model.generate(
        ids[:1, :5], max_new_tokens=4, do_sample=False, min_new_tokens=4, pad_token_id=0
    )
    assert torch.equal(got, expected)


def _experts_classes():
    everything = _hf_families.experts_classes()
    if os.environ.get("MOE_TRANSFORMERS_ALL") == "1":
        return everything
    # multimodal families (no causal LM above), a post-expert norm, biases
    wanted = {"muse_spark", "openai_privacy_filter", "qwen3_vl_moe", "ergo"}
    return [pair for pair in everything if pair[0] in wanted]


@pytest.mark.parametrize(("family", "name"), _experts_classes())
def test_experts_class(family, name):
    """Each decorated experts class alone (multimodal families too): output and every
    gradient against its eager forward, with a duplicate expert in one token's top-k."""
    import importlib
    import inspect

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if name in _hf_families.UNBUILDABLE_EXPERTS:
        pytest.skip(f"{name}: {_hf_families.UNBUILDABLE_EXPERTS[name]}")
    if family not in CONFIG_MAPPING:
        pytest.skip(f"{family} has no config class in transformers' auto mapping")
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config = _hf_families.tiny_text_config(family)
    torch.manual_seed(0)
    cls = getattr(module, name)
    extra = {"layer_idx": 0} if "layer_idx" in inspect.signature(cls).parameters else {}
    experts = cls(config, **extra)
    with torch.no_grad():
        for parameter in experts.parameters():
            parameter.normal_(0.0, 0.2)
    down = experts.down_proj
    width = down.shape[-1] if getattr(experts, "is_transposed", False) else down.shape[1]
    top_k = min(getattr(config, "num_experts_per_tok", 2) or 2, experts.num_experts)
    if name == "ErgoExpertProjections":
        # the per-pair inner layer of ErgoExperts: one slot, weight 1 (its eager forward
        # ignores the weights, which its caller sets to ones)
        top_k = 1
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(7, width, generator=generator, requires_grad=True)
    index = torch.rand(7, experts.num_experts, generator=generator).argsort(1)[:, :top_k]
    if top_k > 1:
        index[2, 1] = index[2, 0]
    weights = torch.rand(7, top_k, generator=generator)
    if name == "ErgoExpertProjections":
        weights = torch.ones_like(weights)
    weights.requires_grad_()
    grad = torch.randn(7, width, generator=generator)
    inputs = (x, weights, *experts.parameters())
    results = []
    for implementation in ("eager", "moe_numba"):
        config._experts_implementation = implementation
        out = experts(x, index, weights)
        grads = torch.autograd.grad((out * grad).sum(), inputs, allow_unused=True)
        results.append((out, *grads))
    expected, got = results
    assert _rel(got[0], expected[0]) <= RTOL
    largest = max(g.abs().max().item() for g in expected[1:] if g is not None)
    for g, e in zip(got[1:], expected[1:], strict=True):
        if e is not None:  # (None: a weight that eager never reads)
            assert _rel(g, e, GRAD_FLOOR * largest) <= RTOL


# --- the experts function on its own -------------------------------------------------------


def _experts(family="mixtral", dtype=torch.float32, device="cpu"):
    """The first experts module of a tiny model of ``family``, its weights random."""
    model, config = _model(family)
    module = next(
        m for m in model.modules() if isinstance(getattr(m, "down_proj", None), torch.nn.Parameter)
    )
    return module.to(device=device, dtype=dtype), config


def _reference(module, x, index, weights):
    """``sum_k weights[t, k] * expert_{index[t, k]}(x[t])``, slot by slot in float64; ids
    outside [0, E) add nothing."""
    x64 = x.double()
    out = torch.zeros_like(x64)
    for t in range(x.shape[0]):
        for k in range(index.shape[1]):
            e = int(index[t, k])
            if not 0 <= e < module.num_experts:
                continue
            up = module.gate_up_proj[e].double()
            h = module._apply_gate(x64[t] @ up.T)
            out[t] += float(weights[t, k]) * (h @ module.down_proj[e].double().T)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_duplicate_experts_are_summed_like_eager(device):
    module, _ = _experts(device=device)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(6, module.gate_up_proj.shape[-1], generator=generator).to(device)
    x.requires_grad_()
    index = torch.tensor([[1, 1], [0, 3], [2, 2], [5, 4], [3, 3], [0, 1]], device=device)
    weights = torch.rand(6, 2, generator=generator).to(device).requires_grad_()
    grad = torch.randn(6, x.shape[1], generator=generator).to(device)

    module.config._experts_implementation = "eager"
    expected = module(x, index, weights)
    expected_grads = torch.autograd.grad(
        (expected * grad).sum(), (x, weights, *module.parameters())
    )
    got = mt.experts_forward(module, x, index, weights)
    got_grads = torch.autograd.grad((got * grad).sum(), (x, weights, *module.parameters()))
    assert _rel(got, expected) <= RTOL
    for g, e in zip(got_grads, expected_grads, strict=True):
        assert _rel(g, e) <= RTOL
    # both slots of a duplicate get the expert's output as their weight's gradient
    assert torch.equal(got_grads[1][0, 0], got_grads[1][0, 1])


def test_merged_routing():
    index = torch.tensor([[3, 3, 1], [0, 2, 0], [7, -1, 2], [1, 1, 1]])
    weights = torch.tensor(
        [[0.25, 0.5, 0.125], [0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.1, 0.2, 0.3]],
        dtype=torch.bfloat16,
    )
    routes, probs = mt.merged_routing(index, weights, 4)
    assert routes.dtype == index.dtype and probs.dtype == torch.float32
    # (7 and -1 name no expert: the permute treats them as -1)
    assert routes.tolist() == [[3, -1, 1], [0, 2, -1], [7, -1, 2], [1, -1, -1]]
    w = weights.float()
    assert probs[0, 0] == w[0, 0] + w[0, 1] and probs[1, 0] == w[1, 0] + w[1, 2]
    assert probs[3, 0] == w[3, 0] + w[3, 1] + w[3, 2]
    # slots that merge nothing keep their weight bit for bit
    assert torch.equal(probs[[0, 1, 2], [2, 1, 2]], w[[0, 1, 2], [2, 1, 2]])


def test_sentinel_and_empty_slots_add_nothing():
    module, _ = _experts()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, module.gate_up_proj.shape[-1], generator=generator)
    index = torch.tensor([[6, 1], [-1, 2], [9, -1], [0, 6]])  # E = 6: 6 and 9 are sentinels
    weights = torch.rand(4, 2, generator=generator)
    with torch.no_grad():
        got = mt.experts_forward(module, x, index, weights)
        expected = _reference(module, x, index, weights)
    assert _rel(got.double(), expected) <= 1e-6
    assert torch.equal(got[2], torch.zeros_like(got[2]))


def test_bfloat16_weights_and_routing():
    module, _ = _experts(dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(16, module.gate_up_proj.shape[-1], generator=generator).bfloat16()
    index = torch.randint(0, module.num_experts, (16, 2), generator=generator)
    weights = torch.rand(16, 2, generator=generator).bfloat16()
    module.config._experts_implementation = "eager"
    with torch.no_grad():
        got = mt.experts_forward(module, x, index, weights)
        eager = module(x, index, weights)
        exact = _reference(module, x, index, weights)
    assert got.dtype == torch.bfloat16
    # one bfloat16 rounding of the combined row, against eager's rounding of every product
    assert _rel(got.double(), exact) <= 2e-2
    assert _rel(got.double(), exact) <= 2 * _rel(eager.double(), exact) + 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    module, _ = _experts(device=device)
    generator = torch.Generator().manual_seed(5)
    width = module.gate_up_proj.shape[-1]
    x = torch.randn(8, 2 * width, generator=generator).to(device)[:, ::2]
    index = torch.randint(0, module.num_experts, (2, 8), generator=generator).to(device).T
    weights = torch.rand(2, 8, generator=generator).to(device).T
    assert not (x.is_contiguous() or index.is_contiguous() or weights.is_contiguous())
    with torch.no_grad():
        got = mt.experts_forward(module, x, index, weights)
        expected = mt.experts_forward(
            module, x.contiguous(), index.contiguous(), weights.contiguous()
        )
    assert torch.equal(got, expected)


def test_no_tokens():
    module, _ = _experts()
    x = torch.randn(0, module.gate_up_proj.shape[-1])
    out = mt.experts_forward(module, x, torch.zeros(0, 2, dtype=torch.int64), torch.ones(0, 2))
    assert out.shape == x.shape


@pytest.mark.parametrize(
    "hidden, intermediate",
    [(12, 13), (12, 1), (1, 12), (1, 1)],
    ids=["intermediate 13", "intermediate 1", "hidden 1", "both 1"],
)
def test_widths_that_grouped_mm_refuses_run_expert_by_expert(hidden, intermediate):
    """A width of 13 float32 values breaks torch._grouped_mm's 16-byte strides, and so does a
    width of one element (a [R, 1] matrix's strides are both 1, which passes a check of "1 or
    a multiple of 16 bytes" and fails torch's): the experts are multiplied one by one
    instead, with the same results."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    config = MixtralConfig(hidden_size=hidden, intermediate_size=intermediate, num_local_experts=3)
    config._experts_implementation = "eager"
    module = MixtralExperts(config)
    generator = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    x = torch.randn(6, hidden, generator=generator, requires_grad=True)
    index = torch.randint(0, 3, (6, 2), generator=generator)
    weights = torch.rand(6, 2, generator=generator)
    assert not mt._grouped_mm_runs(x, module.gate_up_proj.transpose(-2, -1))
    inputs = (x, *module.parameters())
    expected = module(x, index, weights)
    expected_grads = torch.autograd.grad(expected.sum(), inputs)
    got = mt.experts_forward(module, x, index, weights)
    assert _rel(got, expected) <= RTOL
    for g, e in zip(torch.autograd.grad(got.sum(), inputs), expected_grads, strict=True):
        assert _rel(g, e) <= RTOL


def test_a_model_with_experts_one_element_wide():
    """``moe_intermediate_size=1`` in a whole model (Qwen3-MoE): logits and every gradient
    as with transformers' eager experts."""
    from transformers import AutoModelForCausalLM

    config = _hf_families.tiny_config("qwen3_moe")
    config.moe_intermediate_size = 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, experts_implementation="eager").eval()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, config.vocab_size, (2, 9), generator=generator)
    weight = torch.randn(2, 9, config.vocab_size, generator=generator)
    logits, grads = _run(model, ids, weight)
    model.set_experts_implementation("moe_numba")
    got_logits, got_grads = _run(model, ids, weight)
    assert _rel(got_logits, logits) <= RTOL
    largest = max(g.abs().max().item() for g in grads.values())
    for name, g in grads.items():
        assert _rel(got_grads[name], g, GRAD_FLOOR * largest) <= RTOL, name


class _PoisonedTail(torch.autograd.Function):
    """torch._grouped_mm with the rows it leaves undefined set to NaN, forward and back."""

    @staticmethod
    def forward(ctx, rows, weight, offsets):
        ctx.save_for_backward(rows, weight, offsets)
        out = torch._grouped_mm(rows, weight, offs=offsets)
        out[int(offsets[-1]) :] = float("nan")
        return out

    @staticmethod
    def backward(ctx, grad):
        rows, weight, offsets = ctx.saved_tensors
        end = int(offsets[-1])
        grad_rows = torch._grouped_mm(grad, weight.transpose(-2, -1), offs=offsets)
        grad_rows[end:] = float("nan")
        grad_weight = torch.zeros_like(weight)
        start = 0
        for e, stop in enumerate(offsets.tolist()):
            grad_weight[e] = rows[start:stop].T @ grad[start:stop]
            start = stop
        return grad_rows, grad_weight, None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["gpt_oss", "mixtral", "nemotron_h"])
@pytest.mark.parametrize("post_norm", [False, True])
def test_undefined_rows_reach_nothing(family, post_norm, device, monkeypatch):
    """The grouped GEMM leaves its rows past the last offset (and their gradients) undefined:
    with them NaN, the output and every gradient are unchanged (biases, gates, norms)."""
    if family not in _hf_families.families():
        pytest.skip(f"{family} is not in this transformers")
    module, _ = _experts(family, device=device)
    module.has_post_expert_norm = post_norm
    width = module.down_proj.shape[2] if module.is_transposed else module.down_proj.shape[1]
    if post_norm:
        module.post_expert_norm = torch.nn.RMSNorm(width, device=device)
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(5, width, generator=generator).to(device).requires_grad_()
    index = torch.tensor([[0, 1], [1, 2], [-1, 0], [2, 0], [1, -1]], device=device)
    index = index[:, : module.config.num_experts_per_tok]
    weights = torch.rand(index.shape, generator=generator).to(device).requires_grad_()

    def run():
        out = mt.experts_forward(module, x, index, weights)
        inputs = (x, weights, *module.parameters())
        return out, torch.autograd.grad(out.sum(), inputs)

    expected, expected_grads = run()
    monkeypatch.setattr(mt, "grouped_mm", _PoisonedTail.apply)
    got, got_grads = run()
    assert torch.equal(got, expected)
    for g, e in zip(got_grads, expected_grads, strict=True):
        assert not g.isnan().any()
        assert _rel(g, e) <= RTOL


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph(dtype, device):
    """No graph break (so no host sync) and the eager results, forward and backward."""
    torch._dynamo.reset()
    module, _ = _experts("gpt_oss" if dtype == torch.float32 else "mixtral", dtype, device)
    generator = torch.Generator().manual_seed(7)
    width = module.down_proj.shape[-1] if module.is_transposed else module.down_proj.shape[1]
    x = torch.randn(12, width, generator=generator).to(device, dtype).requires_grad_()
    index = torch.randint(0, module.num_experts, (12, 2), generator=generator).to(device)
    index[3, 1] = index[3, 0]  # a duplicate
    weights = torch.rand(12, 2, generator=generator).to(device).requires_grad_()

    def layer(x, index, weights):
        return mt.experts_forward(module, x, index, weights)

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    results = []
    for function in (layer, compiled):
        out = function(x, index, weights)
        results.append((out, *torch.autograd.grad(out.float().sum(), (x, weights))))
    for got, expected in zip(results[1], results[0], strict=True):
        assert torch.equal(got, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_cuda_graph_captures_a_decode_step(family):
    """A decode step's experts layer (four tokens, bfloat16) captured into one CUDA graph
    and replayed on new routing gives the eager bits: no host sync, no host-side value."""
    module, _ = _experts(family, torch.bfloat16, "cuda")
    width = module.down_proj.shape[-1] if module.is_transposed else module.down_proj.shape[1]
    generator = torch.Generator().manual_seed(11)

    def inputs():
        x = torch.randn(4, width, generator=generator).to("cuda", torch.bfloat16)
        index = torch.randint(0, module.num_experts, (4, 2), generator=generator).to("cuda")
        weights = torch.rand(4, 2, generator=generator).to("cuda", torch.bfloat16)
        return x, index, weights

    static = inputs()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):  # (warm-up on the side stream, as torch's graph docs ask)
            mt.experts_forward(module, *static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        captured = mt.experts_forward(module, *static)
    for _ in range(3):
        new = inputs()
        for buffer, value in zip(static, new, strict=True):
            buffer.copy_(value)
        graph.replay()
        with torch.no_grad():
            expected = mt.experts_forward(module, *new)
        assert torch.equal(captured, expected)


def test_register_is_idempotent_and_checks_its_name():
    from transformers.integrations.moe import ExpertsInterface

    assert mt.register() == "moe_numba" == mt.register()
    assert ExpertsInterface._global_mapping["moe_numba"] is mt.experts_forward
    with pytest.raises(TypeError, match="name: expected a non-empty str, got ''"):
        mt.register("")


def test_argument_errors():
    module, _ = _experts()
    x = torch.randn(3, module.gate_up_proj.shape[-1])
    index = torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"top_k_weights: expected the shape"):
        mt.experts_forward(module, x, index, torch.ones(3, 3))
    with pytest.raises(TypeError, match="top_k_index: expected an integer dtype"):
        mt.experts_forward(module, x, index.float(), torch.ones(3, 2))
    with pytest.raises(TypeError, match="hidden_states: expected a torch.Tensor"):
        mt.experts_forward(module, x.numpy(), index, torch.ones(3, 2))


def test_import_moe_numba_imports_neither_torch_nor_transformers():
    code = "import sys, moe_numba; print('torch' in sys.modules, 'transformers' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "False"]


def test_compile_first_in_a_fresh_process():
    """The first moe_numba call of a process may be a traced one."""
    code = """if True:
        import torch
        import moe_numba.transformers as mt
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        config = MixtralConfig(hidden_size=16, intermediate_size=16, num_local_experts=4)
        module = MixtralExperts(config)
        torch.nn.init.normal_(module.gate_up_proj)
        torch.nn.init.normal_(module.down_proj)
        x = torch.randn(5, 16)
        index = torch.randint(0, 4, (5, 2))
        weights = torch.rand(5, 2)

        def layer(x, index, weights):
            return mt.experts_forward(module, x, index, weights)

        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(x, index, weights), layer(x, index, weights))
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_compute_capability_is_asked_once_per_device(monkeypatch):
    """torch._grouped_mm needs compute capability 8.0: the layer asks torch once per device
    (not twice per call), and asks it afresh while dynamo traces (nothing cached then)."""
    asked = []

    def capability(index):
        asked.append(index)
        return {0: (9, 0), 1: (7, 5)}[index]

    monkeypatch.setattr(mt.torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(mt, "_AMPERE_OR_NEWER", {})
    assert [mt._ampere_or_newer(i) for i in (0, 1, 0, 1, 0)] == [True, False, True, False, True]
    assert asked == [0, 1]
    monkeypatch.setattr(mt.torch.compiler, "is_compiling", lambda: True)
    assert mt._ampere_or_newer(1) is False and mt._ampere_or_newer(0) is True
    assert asked == [0, 1, 1, 0] and mt._AMPERE_OR_NEWER == {0: True, 1: False}
