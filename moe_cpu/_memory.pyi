from typing import Any

import numpy as np

MIN_CACHED_BYTES: int
GRANULE: int

def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray: ...
def empty_cache() -> int: ...
def cache_info() -> dict[str, int]: ...
