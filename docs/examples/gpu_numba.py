"""numba device arrays in, numba device arrays out (bf16 travels as a uint16 view).

Needs a CUDA GPU; ``python docs/examples/gpu_numba.py`` says so and skips otherwise.
"""


def skip_reason():
    """Why this example cannot run here, or None."""
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        return "needs a real GPU (NUMBA_ENABLE_CUDASIM=1 is set)"
    if not cuda.is_available():
        return "needs a CUDA GPU"
    return None


def main():
    # [start]
    import ml_dtypes
    import numpy as np
    from numba import cuda

    from moe_numba import moe_permute

    hidden_states = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)
    hidden_states = hidden_states.astype(ml_dtypes.bfloat16)
    routemap = np.array([[0, 1], [1, -1], [2, 0], [-1, -1]], dtype=np.int32)
    probs = np.full((4, 2), 0.5, dtype=np.float32)

    # cuda.to_device rejects ml_dtypes arrays: copy the bits, then view them as bf16.
    d_hidden = cuda.to_device(hidden_states.view(np.uint16)).view(ml_dtypes.bfloat16)
    d_routemap = cuda.to_device(routemap)
    d_probs = cuda.to_device(probs)

    d_rows, d_rowmap, d_row_probs, _ = moe_permute(
        d_hidden, None, d_routemap, d_probs, 3, [2, 2, 1], padding_alignment=4
    )
    rowmap = d_rowmap.copy_to_host()
    rows = d_rows.view(np.uint16).copy_to_host().view(ml_dtypes.bfloat16)
    # [end]
    assert cuda.is_cuda_array(d_rows)
    assert rowmap.tolist() == [[0, 4, -1], [-1, 5, -1], [1, -1, 8], [-1, -1, -1]]
    assert rows.shape == (12, 64)
    assert np.array_equal(rows[[0, 4, 1]].view(np.uint16), hidden_states[[0, 0, 2]].view(np.uint16))


if __name__ == "__main__":
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
    else:
        main()
