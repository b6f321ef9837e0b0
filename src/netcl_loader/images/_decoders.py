"""Which decoder reads a JPEG (the compiled one where built, Pillow otherwise), and Pillow's path."""
from __future__ import annotations

import io
import os
import warnings

import numpy as np

__all__ = ["ImageFileError", "DECODER_ENV", "MAX_PIXELS", "decoder_info"]

#: Environment variable choosing the decoder at dataset construction:
#: ``"pillow"`` forces the Pillow path, ``"auto"`` (or unset) uses the
#: compiled decoder for JPEGs where it is built.
DECODER_ENV = "NETCL_LOADER_IMAGE_DECODER"
#: Pixels above which a JPEG is refused before decoding: twice Pillow's default
#: ``Image.MAX_IMAGE_PIXELS`` (89,478,485), where Pillow raises
#: ``DecompressionBombError``; a header can claim 65500x65500 over a few bytes.
MAX_PIXELS = 2 * 89_478_485
#: Bytes shown of a file that is not an image, in its error message.
_SHOWN_BYTES = 8


class ImageFileError(ValueError):
    """A file that is empty, truncated or not an image (the message names the file)."""

    __module__ = "netcl_loader.images"  # its public name, in tracebacks and pickles


def _compiled_module():
    try:
        from .. import _jpeg
    except ImportError:
        return None
    return _jpeg


def _resize_kernel():
    """The one resize/flip/normalise kernel for images decoded by Pillow: the same
    arithmetic as the compiled decoder's last pass (``_image.resize_into``)."""
    from .._image import resize_into
    return resize_into


def decoder_info():
    """Which decoder JPEG files go through here, as ``(name, compiled)``.

    Returns
    -------
    tuple of (str, bool)
        ``("libjpeg-turbo ...", True)`` with the compiled decoder, else
        ``("Pillow fallback (...why...)", False)``.
    """
    forced = _forced_pillow()
    jpeg = _compiled_module()
    if forced:
        return f"Pillow fallback ({DECODER_ENV}=pillow)", False
    if jpeg is None:
        return ("Pillow fallback (netcl_loader._jpeg is not built: libjpeg-turbo was not "
                "found when the package was built)"), False
    return str(jpeg.LIBJPEG_VERSION), True


def _forced_pillow():
    value = os.environ.get(DECODER_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "pillow"):
        raise ValueError(f"{DECODER_ENV}={value!r} is not a decoder choice; expected 'auto' "
                         f"(the compiled decoder where built) or 'pillow'")
    return value == "pillow"


_warned_missing = False


def _use_compiled():
    """Whether a dataset constructed now decodes JPEGs with the compiled decoder."""
    global _warned_missing
    if _forced_pillow():
        return False
    if _compiled_module() is None:
        if not _warned_missing:
            _warned_missing = True
            warnings.warn(
                "netcl_loader._jpeg is not built (the libjpeg-turbo headers were not found "
                "when the package was built): JPEG files decode through Pillow, several "
                "times slower. Remedy: install them (apt-get install libjpeg62-turbo-dev, or "
                "libjpeg-dev; brew install jpeg-turbo) and rebuild the package.",
                RuntimeWarning, stacklevel=4)
        return False
    return True


def _exif_transposed(img):
    """``img`` as displayed: Pillow's ``ImageOps.exif_transpose``.  An EXIF block it
    raises on (a header that is not TIFF's, a short one) leaves the image as
    stored, orientation 1, as the compiled decoder's reader reads it: a damaged
    tag never costs the sample."""
    from PIL import ImageOps
    try:
        return ImageOps.exif_transpose(img)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - Pillow's EXIF parser fails in many ways on bad bytes
        return img


def _pillow_rgb(data, exif_orientation=False):
    """Decode ``data`` with Pillow into an (H, W, 3) uint8 RGB array (ImageFileError
    with the reason, which the caller prefixes with the file's name); turned as
    displayed by its EXIF orientation when ``exif_orientation``."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as exc:
        raise ImportError(f"decoding image files needs Pillow ({exc}); remedy: pip install "
                          f"pillow, or pip install 'netcl-loader[images]'") from exc
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            if exif_orientation:
                img = _exif_transposed(img)
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            return np.asarray(rgb)
    except UnidentifiedImageError:
        head = bytes(data[:_SHOWN_BYTES])
        raise ImageFileError(f"not an image (its {len(data)} bytes start with {head!r}, "
                             f"which no decoder recognises)") from None
    except Image.DecompressionBombError as exc:
        # Pillow's (and so torchvision's) limit, Image.MAX_IMAGE_PIXELS.
        raise ImageFileError(f"too large for Pillow ({exc})") from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file breaks Pillow's plugins in many ways
        raise ImageFileError(f"truncated or corrupt image data ({type(exc).__name__}: "
                             f"{exc})") from None
