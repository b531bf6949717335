"""The peak-memory script: what one forward keeps for its backward, measured on CUDA."""

import pytest

from _torch_cases import CUDA
from benchmarks import memory as _memory_bench

KIB = 1024


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_forward_keeps_what_the_backward_needs_and_no_more(device, weighted):
    num_tokens, hidden, topk, num_experts, alignment = 512, 256, 4, 16, 16
    figures = _memory_bench.report(num_tokens, hidden, topk, num_experts, alignment, weighted)
    rows = figures["shape"]["num_rows"]
    out = num_tokens * hidden * 2  # the layer's bf16 output
    rowmap = num_tokens * num_experts * 4
    row_probs = rows * 4
    hidden_rows = rows * hidden * 2
    if weighted:
        # the unpermute keeps the rows (the probabilities require a gradient) and their
        # probabilities
        expected = out + rowmap + row_probs + hidden_rows
    else:
        # the expert's product keeps its two factors: the rows and their bf16 probabilities
        # (the float32 probabilities are then kept by nothing)
        expected = out + rowmap + hidden_rows + rows * 2
    # the caching allocator rounds every block up to 512 bytes
    assert expected <= figures["forward_held_bytes"] <= expected + 8 * KIB
    assert figures["step_peak_bytes"] >= figures["forward_held_bytes"]


@pytest.mark.parametrize("device", [CUDA])
def test_main_writes_the_figures(tmp_path, monkeypatch, device):
    calls = []
    monkeypatch.setattr(_memory_bench, "report", lambda *args: calls.append(args) or {"a": 1})
    path = tmp_path / "memory.json"
    _memory_bench.main(["--tokens", "8", "--hidden", "4", "--json", str(path)])
    assert calls == [(8, 4, 8, 64, 128, False), (8, 4, 8, 64, 128, True)]
    assert path.read_text() == '[\n  {\n    "a": 1\n  },\n  {\n    "a": 1\n  }\n]\n'
