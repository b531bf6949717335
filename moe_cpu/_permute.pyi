import numpy as np
import numpy.typing as npt

STATUS_SLOTS: dict[str, int]

def permute(
    hidden: npt.NDArray[np.uint8] | None,
    scale: npt.NDArray[np.uint8] | None,
    routemap: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    probs: npt.NDArray[np.float32],
    capacity: npt.NDArray[np.int64] | None,
    out_hidden: npt.NDArray[np.uint8] | None,
    out_scale: npt.NDArray[np.uint8] | None,
    out_rowmap: npt.NDArray[np.int32],
    out_probs: npt.NDArray[np.float32],
    out_indices: npt.NDArray[np.int32] | None,
    out_offsets: npt.NDArray[np.int32] | None,
    status: npt.NDArray[np.int64],
    *,
    alignment: int,
    validate: bool,
) -> None: ...
