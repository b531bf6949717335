import numpy as np
import numpy.typing as npt

STATUS_SLOTS: dict[str, int]
DATA_TYPES: dict[str, int]

def unpermute(
    rows: npt.NDArray[np.float32] | npt.NDArray[np.uint16],
    rowmap: npt.NDArray[np.int32],
    routemap: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    probs: npt.NDArray[np.float32],
    out_hidden: npt.NDArray[np.float32] | npt.NDArray[np.uint16],
    out_probs: npt.NDArray[np.float32],
    status: npt.NDArray[np.int64],
    *,
    data_type: int,
    weighted: bool,
    mix_precision: bool,
) -> None: ...
def _widen(src: npt.NDArray[np.uint16], dst: npt.NDArray[np.float32], data_type: int) -> None: ...
def _narrow(src: npt.NDArray[np.float32], dst: npt.NDArray[np.uint16], data_type: int) -> None: ...
