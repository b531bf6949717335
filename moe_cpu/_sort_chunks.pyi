import numpy as np
import numpy.typing as npt

STATUS_SLOTS: dict[str, int]

def sort_chunks(
    x: npt.NDArray[np.uint8],
    sizes: npt.NDArray[np.int64],
    order: npt.NDArray[np.int64],
    probs: npt.NDArray[np.float32] | None,
    y: npt.NDArray[np.uint8],
    probs_y: npt.NDArray[np.float32] | None,
    lengths: npt.NDArray[np.int64],
    status: npt.NDArray[np.int64],
) -> None: ...
