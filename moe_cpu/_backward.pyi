import numpy as np
import numpy.typing as npt

STATUS_SLOTS: dict[str, int]

def permute_backward_probs(
    grad_probs: npt.NDArray[np.float32],
    rowmap: npt.NDArray[np.int32],
    routemap: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    out_probs: npt.NDArray[np.float32],
    status: npt.NDArray[np.int64],
) -> None: ...
def unpermute_backward(
    grad_hidden: npt.NDArray[np.uint8] | None,
    grad_probs: npt.NDArray[np.float32] | None,
    rows: npt.NDArray[np.uint8] | None,
    rowmap: npt.NDArray[np.int32],
    routemap: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    probs: npt.NDArray[np.float32] | None,
    out_rows: npt.NDArray[np.uint8] | None,
    out_probs: npt.NDArray[np.float32] | None,
    status: npt.NDArray[np.int64],
    *,
    data_type: int,
    weighted: bool,
    num_rows: int,
) -> None: ...
