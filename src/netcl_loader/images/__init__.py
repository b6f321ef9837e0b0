"""Image files as finished batches: ImageFolder, ImageFiles, TarImages and their crops.

Each worker reads a file with one ``pread`` into a reused buffer, decodes it
(JPEG with the compiled libjpeg-turbo decoder, only the crop's rows and
columns, scaled in the DCT domain as far as the output size allows; other
formats, or every file when the decoder was not built, through Pillow), and
resizes, flips and normalises it in one pass straight into its row of the
batch in the ring slot.  The datasets hold their file names in one bytes
blob with int64 offsets and their labels in an int64 array: no Python object
per sample, so a million files cost a few tens of MB and forked workers
copy nothing on write.

Randomness (the crop box, the flip) is drawn from the batch's own seed (see
``netcl_loader.batch_context.batch_rng``), one vectorised draw per batch: the same
loader seed gives the same images for every ``num_workers``, with
``zero_copy`` either way, on the torch face, and after a resume.

``NETCL_LOADER_IMAGE_DECODER=pillow`` in the environment, read when a dataset
is constructed, makes that dataset decode every file through Pillow (the
fallback path) even where the compiled decoder is built.
"""
from __future__ import annotations

from ._buffers import MAX_OPEN_SHARDS, READ_BUFFER_BYTES, READ_BUFFER_KEEP, _here, _Process  # noqa: F401
from ._crops import (CROP_TRIES, IOU_CROP_ATTEMPTS, CenterCrop, Letterbox,  # noqa: F401
                     RandomIoUCrop, RandomResizedCrop, SquareCrop)
from ._datasets import (IMG_EXTENSIONS, ON_ERRORS, OUTPUTS, ImageFiles, ImageFolder,  # noqa: F401
                        TarImages)
from ._detection import DetectionFiles  # noqa: F401
from ._readers import CocoDetection, WiderFace  # noqa: F401
from ._decoders import (DECODER_ENV, MAX_PIXELS, ImageFileError, _compiled_module,  # noqa: F401
                        _pillow_rgb, _resize_kernel, _use_compiled, decoder_info)
from ._sources import MAX_FILE_BYTES, _pread_into, _read_file  # noqa: F401
from ._tarindex import _TAR_IMAGE_EXTS, _TAR_INDEX_VERSION, _TarIndex  # noqa: F401
from .._retry import ObjectChangedError, RemoteError, Retry  # noqa: F401

__all__ = ["ImageFolder", "ImageFiles", "TarImages", "RandomResizedCrop", "CenterCrop",
           "ImageFileError", "IMG_EXTENSIONS", "DECODER_ENV", "decoder_info", "Retry",
           "RemoteError", "ObjectChangedError", "DetectionFiles", "SquareCrop", "RandomIoUCrop",
           "Letterbox", "CocoDetection", "WiderFace"]
