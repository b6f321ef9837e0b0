from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

def crop_flip_normalize_u8(
    images: npt.NDArray[np.uint8],
    top: npt.NDArray[np.int64],
    left: npt.NDArray[np.int64],
    flip: npt.NDArray[np.uint8],
    mean: npt.NDArray[np.float32],
    std: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
) -> None: ...

def crop_flip_normalize_one(
    image: npt.NDArray[np.uint8],
    top: int,
    left: int,
    flip: bool,
    mean: npt.NDArray[np.float32],
    std: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
) -> None: ...

def resize_into(
    src: npt.NDArray[np.uint8],
    box: Sequence[float],
    out: npt.NDArray[np.float32] | npt.NDArray[np.uint8],
    flip: bool = False,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    crop_first: bool = False,
) -> None: ...

def _use_simd(allowed: bool) -> bool: ...
