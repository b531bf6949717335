"""The quickstart on PyTorch CUDA tensors: torch in, torch out, on the current stream.

Needs PyTorch with a CUDA GPU; ``python docs/examples/gpu_torch.py`` says so and skips
otherwise. Run on a GPU machine, it asserts that the GPU results equal the CPU backend's bits.
"""


def skip_reason():
    """Why this example cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "needs PyTorch"
    from numba import config

    if config.ENABLE_CUDASIM:
        return "needs a real GPU (NUMBA_ENABLE_CUDASIM=1 is set)"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    return None


def main():
    # [start]
    import torch

    from moe_numba import moe_permute, moe_unpermute

    num_tokens, hidden, topk, num_experts = 4096, 2048, 8, 64
    device = torch.device("cuda")
    hidden_states = torch.randn(num_tokens, hidden, device=device, dtype=torch.bfloat16)
    logits = torch.randn(num_tokens, num_experts, device=device)
    expert_prob_topk, expert_ids = torch.topk(logits.softmax(dim=1), topk, dim=1)
    expert_routemap_topk = expert_ids.to(torch.int32)

    # tokens_per_expert is a host list: a small device-to-host copy, made by the caller
    # (override_buffer_size avoids it, see the contract).
    tokens_per_expert = torch.bincount(expert_ids.flatten(), minlength=num_experts).tolist()

    rows, rowmap, row_probs, _ = moe_permute(
        hidden_states,
        None,
        expert_routemap_topk,
        expert_prob_topk,
        num_experts=num_experts,
        tokens_per_expert=tokens_per_expert,
        padding_alignment=128,
    )
    assert isinstance(rows, torch.Tensor) and rows.device == hidden_states.device  # torch out

    combined, prob_topk = moe_unpermute(
        rows,
        rowmap,
        expert_routemap_topk,
        row_probs,
        total_zipped_tokens=num_tokens,
        num_experts=num_experts,
        using_weighted_combine=True,
    )
    # [end]

    # [start-compare]
    # The CPU backend gives the same bits (bf16 crosses to NumPy through an int16 view).
    import ml_dtypes
    import numpy as np

    def to_numpy(t):
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
        return t.cpu().numpy()

    cpu_rows, cpu_rowmap, cpu_probs, _ = moe_permute(
        to_numpy(hidden_states),
        None,
        to_numpy(expert_routemap_topk),
        to_numpy(expert_prob_topk),
        num_experts,
        tokens_per_expert,
        128,
    )
    cpu_combined, _ = moe_unpermute(
        cpu_rows,
        cpu_rowmap,
        to_numpy(expert_routemap_topk),
        cpu_probs,
        num_tokens,
        num_experts,
        using_weighted_combine=True,
    )
    assert np.array_equal(to_numpy(rowmap), cpu_rowmap)
    assert np.array_equal(to_numpy(rows).view(np.uint16), cpu_rows.view(np.uint16))
    assert np.array_equal(to_numpy(combined).view(np.uint16), cpu_combined.view(np.uint16))
    assert np.array_equal(to_numpy(prob_topk), to_numpy(expert_prob_topk))
    # [end-compare]


if __name__ == "__main__":
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
    else:
        main()
