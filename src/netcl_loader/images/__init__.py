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

from ._crops import CenterCrop, Letterbox, RandomIoUCrop, RandomResizedCrop, SquareCrop
from ._datasets import IMG_EXTENSIONS, ImageFiles, ImageFolder, TarImages
from ._decoders import DECODER_ENV, ImageFileError, decoder_info
from ._detection import DetectionFiles
from ._readers import CocoDetection, WiderFace
from ..remote import ObjectChangedError, RemoteError, Retry

__all__ = ["ImageFolder", "ImageFiles", "TarImages", "RandomResizedCrop", "CenterCrop",
           "ImageFileError", "IMG_EXTENSIONS", "DECODER_ENV", "decoder_info", "Retry",
           "RemoteError", "ObjectChangedError", "DetectionFiles", "SquareCrop", "RandomIoUCrop",
           "Letterbox", "CocoDetection", "WiderFace"]
