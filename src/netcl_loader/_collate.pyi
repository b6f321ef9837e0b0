from typing import Any, Callable, Sequence

import numpy as np

def collate(
    samples: list[Any],
    indices: Sequence[Any] | None = ...,
    alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = ...,
) -> Any: ...

def gather_rows(src: np.ndarray, indices: np.ndarray, out: np.ndarray) -> np.ndarray: ...
