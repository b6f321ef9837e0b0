from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

from netcl_loader._image import resize_into as resize_into

HAVE_SCALE_CROP: bool
LIBJPEG_VERSION: str

class ImageError(ValueError): ...

def is_jpeg(data: Buffer) -> bool: ...
def exif_orientation(data: Buffer) -> int: ...

class Decoder:
    def __init__(self) -> None: ...
    def info(self, data: Buffer) -> tuple[int, int]: ...
    def decode_into(
        self,
        data: Buffer,
        box: Sequence[float],
        out: npt.NDArray[np.float32] | npt.NDArray[np.uint8],
        flip: bool = False,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        crop_first: bool = False,
        orientation: int = 1,
    ) -> int: ...

def _use_simd(allowed: bool) -> bool: ...
