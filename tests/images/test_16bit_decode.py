"""Images whose samples are not 8-bit decode as Pillow's ``convert("RGB")`` does.

An adversarial run once saw a 16-bit grayscale PNG 17 levels away from
Pillow; these checks (files and tar shards, uint8 and float32 output, 16-bit
grayscale and 16-bit RGB) did not reproduce it: the loader hands every
non-JPEG file to Pillow's own ``convert("RGB")``."""
from __future__ import annotations

import io
import struct
import tarfile
import zlib

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from netcl_loader import DataLoader  # noqa: E402
from netcl_loader.images import CenterCrop, DetectionFiles, Letterbox, TarImages  # noqa: E402


def _png16(path, rgb):
    """A 16-bit RGB PNG, written by hand (Pillow writes no 48-bit PNG)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\0" + rgb[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    with open(path, "wb") as f:
        head = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)   # 16 bits, colour type RGB
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(raw))
                + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    d = tmp_path_factory.mktemp("png16")
    rng = np.random.default_rng(7)
    gray = (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)
    gray[:8] = rng.integers(0, 65536, (8, 64), dtype=np.uint16)
    Image.fromarray(gray).save(d / "gray16.png")
    _png16(d / "rgb16.png", rng.integers(0, 65536, (64, 64, 3)).astype(np.uint16))
    return [str(d / "gray16.png"), str(d / "rgb16.png")]


@pytest.mark.parametrize("output", ["uint8", "float32"])
def test_16_bit_pngs_decode_as_pillows_convert_rgb(pngs, output):
    for path in pngs:
        ref = np.asarray(Image.open(path).convert("RGB")).astype(np.float64)
        ds = DetectionFiles([path], [np.zeros((0, 4), np.float32)], [np.zeros(0, np.int64)],
                            size=(64, 64), crop=Letterbox(), flip=0.0, output=output)
        x, _ = next(iter(DataLoader(ds, batch_size=1)))
        got = np.asarray(x)[0].transpose(1, 2, 0).astype(np.float64)
        if output == "float32":
            got = got * 255.0
        assert np.abs(got - ref).max() <= 0.01, path


def test_16_bit_pngs_in_a_tar_shard_decode_as_pillow(pngs, tmp_path):
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        for k, path in enumerate(pngs):
            for name, data in ((f"{k:03d}.png", open(path, "rb").read()), (f"{k:03d}.cls", b"0")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    # 64 x 64 images, shorter side resized to 64, centre 64: the whole image.
    ds = TarImages(str(shard), crop=CenterCrop(64, resize=64), flip=0.0, output="uint8")
    for k, path in enumerate(pngs):
        img, _ = ds[k]
        ref = np.asarray(Image.open(path).convert("RGB"))
        got = np.asarray(img)
        got = got.transpose(1, 2, 0) if got.shape[0] == 3 else got
        np.testing.assert_array_equal(got, ref)
