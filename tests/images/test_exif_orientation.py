"""EXIF orientation: ignored by default, applied with ``exif_orientation=True``.

Ignored by default, as Pillow's ``Image.open`` and torchvision's readers
ignore it; with ``exif_orientation=True`` each image is turned as Pillow's
``ImageOps.exif_transpose`` turns it, by the compiled decoder in its one pass
and by the Pillow path alike.  Test images are regions of scikit-learn's
sample photos written as JPEGs with each of the 8 orientation values (Pillow's
``Image.Exif``); the oracle is ``exif_transpose(Image.open(p)).convert("RGB")``
with the same crop box, resize and flip under torchvision's rules on Pillow.
"""
import importlib.util
import io
import os
import struct
import tarfile

import numpy as np
import pytest

pytest.importorskip("PIL", reason="netcl_loader.images needs Pillow (the 'images' extra)")
if importlib.util.find_spec("sklearn") is None:
    # Found, not imported: its import pulls in SciPy, which fails where the sanitizer
    # run hides torch; images_util reads the photos without importing it.
    pytest.skip("test images are made from scikit-learn's sample photos",
                allow_module_level=True)

from PIL import Image, ImageOps  # noqa: E402

from images_util import encode_jpeg, encode_oriented_jpeg, photo_region  # noqa: E402
from netcl_loader import DataLoader  # noqa: E402
from netcl_loader.images import (DECODER_ENV, CenterCrop, ImageFiles,  # noqa: E402
                                 ImageFolder, RandomResizedCrop, TarImages)

try:
    from netcl_loader import _jpeg
except ImportError:  # built without libjpeg: the Pillow path is still tested
    _jpeg = None

needs_jpeg = pytest.mark.skipif(
    _jpeg is None, reason="the JPEG decoder was not built (libjpeg headers missing)")
pytestmark = [pytest.mark.filterwarnings("ignore:netcl_loader._jpeg is not built"),
              # Pillow warns of the count-2 orientation entry the reader test writes.
              pytest.mark.filterwarnings("ignore:Metadata Warning")]

#: The agreement asked with Pillow + torchvision's recipe, as everywhere (levels of 255).
MEAN_ABS_LEVELS = 2.0
MAX_LEVELS = 40
ORIENTATIONS = tuple(range(1, 9))
DECODERS = ("auto", "pillow")


def displayed(data):
    """The oracle: Pillow's image as displayed, uint8 HWC."""
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(ImageOps.exif_transpose(img).convert("RGB"))


def levels(a, b):
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return d.mean(), d.max()


@pytest.fixture(scope="module")
def oriented(tmp_path_factory):
    """Per orientation 1-8 one JPEG of a photo region (odd, oblong sizes), and the same
    pixels without EXIF: (tagged paths, untagged paths)."""
    root = tmp_path_factory.mktemp("oriented")
    rng = np.random.default_rng(31)
    tagged, plain = [], []
    for k in ORIENTATIONS:
        w, h = [(97, 61), (83, 120), (150, 101), (64, 91)][k % 4]
        img = photo_region(rng, (w, h))
        for folder, tag, out in (("tagged", k, tagged), ("plain", None, plain)):
            os.makedirs(root / folder, exist_ok=True)
            path = str(root / folder / f"o{k}.jpg")
            with open(path, "wb") as f:
                f.write(encode_oriented_jpeg(img, tag, subsampling=0))
            out.append(path)
    return tagged, plain


def read(path):
    with open(path, "rb") as f:
        return f.read()


# --------------------------------------------------------------------------
# The decoder's reader and its one pass


@needs_jpeg
def test_the_reader_reads_each_orientation(oriented):
    tagged, plain = oriented
    for k, path in zip(ORIENTATIONS, tagged):
        assert _jpeg.exif_orientation(read(path)) == k
    for path in plain:
        assert _jpeg.exif_orientation(read(path)) == 1
    assert _jpeg.exif_orientation(b"") == 1
    assert _jpeg.exif_orientation(b"not a jpeg") == 1


def with_app1(jpeg, payload):
    """``jpeg`` with an APP1 segment holding ``payload`` right after its SOI marker."""
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


def tiff(entries, big):
    """An Exif payload: a TIFF header of one byte order, IFD0 at offset 8 with
    ``entries`` (tag, type, count, value field of 4 bytes), then 8 spare bytes."""
    e = ">" if big else "<"
    body = (b"MM\x00*" if big else b"II*\x00") + struct.pack(e + "I", 8)
    body += struct.pack(e + "H", len(entries))
    for tag, typ, count, field in entries:
        body += struct.pack(e + "HHI", tag, typ, count) + field
    return b"Exif\x00\x00" + body + struct.pack(e + "I", 0) + bytes(8)


@needs_jpeg
@pytest.mark.parametrize("big", [False, True], ids=["II", "MM"])
def test_the_reader_follows_pillow_on_byte_orders_types_and_xmp(big):
    """Either byte order; SHORT, LONG and signed values; a tag whose value Pillow does not
    take for a number; XMP's tiff:Orientation when EXIF has none: each read as Pillow's
    exif_transpose reads it."""
    base = encode_jpeg(photo_region(np.random.default_rng(2), (40, 30)), quality=90)
    e = ">" if big else "<"
    short = lambda v: struct.pack(e + "HH", v, 0)  # noqa: E731
    xmp = b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta><tiff:Orientation>7</tiff:Orientation>"
    cases = [
        [(0x0112, 3, 1, short(6))],                                   # SHORT
        [(0x010F, 2, 4, b"Can\x00"), (0x0112, 3, 1, short(8))],       # after another tag
        [(0x0112, 4, 1, struct.pack(e + "I", 5))],                    # LONG
        [(0x0112, 8, 1, struct.pack(e + "hH", 3, 0))],                # SSHORT
        [(0x0112, 1, 1, b"\x06\x00\x00\x00")],                        # BYTE: bytes, no number
        [(0x0112, 3, 1, short(9))],                                   # out of range
        [(0x0112, 3, 1, short(2)), (0x0112, 3, 1, short(4))],         # the first one stands
        [(0x0112, 3, 2, struct.pack(e + "HH", 3, 6))],                # the first value
        [],                                                           # no tag: XMP below
    ]
    for entries in cases:
        data = with_app1(base, tiff(entries, big))
        if not entries:
            data = with_app1(data, xmp)
        with Image.open(io.BytesIO(data)) as img:
            want = {k: k for k in range(2, 9)}.get(img.getexif().get(0x0112, 1), 1)
        assert _jpeg.exif_orientation(data) == want, (entries, want)
        np.testing.assert_array_equal(displayed(data).shape[:2],
                                      (40, 30) if want >= 5 else (30, 40))


def pillow_resized(image, box, out_h, out_w, flip, crop_first):
    """torchvision's rules on Pillow: crop the box then resize (RandomResizedCrop), or
    resize with the box (Resize then CenterCrop); flipped; uint8 CHW."""
    top, left, h, w = box
    pil = Image.fromarray(image)
    if crop_first:
        pil = pil.crop((left, top, left + w, top + h)).resize((out_w, out_h), Image.BILINEAR)
    else:
        pil = pil.resize((out_w, out_h), Image.BILINEAR, box=(left, top, left + w, top + h))
    out = np.asarray(pil)
    if flip:
        out = out[:, ::-1]
    return out.transpose(2, 0, 1)


@needs_jpeg
def test_decode_into_turns_the_image_as_exif_transpose_does(oriented):
    """Every orientation, boxes drawn in the displayed image, shrinking (DCT-scaled) and
    enlarging, flipped or not, uint8 and float32, into packed and padded outputs (rows
    mirrored too): the pixels of Pillow's displayed image."""
    tagged, _ = oriented
    rng = np.random.default_rng(7)
    dec = _jpeg.Decoder()
    for k, path in zip(ORIENTATIONS, tagged):
        data = read(path)
        image = displayed(data)
        height, width = image.shape[:2]
        w_stored, h_stored = dec.info(data)
        assert (height, width) == ((w_stored, h_stored) if k >= 5 else (h_stored, w_stored))
        for trial in range(12):
            crop_first = bool(trial % 2)
            if trial < 2:
                box = (0, 0, height, width)
            else:
                h = int(rng.integers(height // 4, height + 1))
                w = int(rng.integers(width // 4, width + 1))
                box = (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)),
                       h, w)
            out_h, out_w = [(17, 23), (40, 32), (2 * height, width + 9)][trial % 3]
            flip = bool(rng.integers(2))
            want = pillow_resized(image, box, out_h, out_w, flip, crop_first)
            for dtype in (np.uint8, np.float32):
                big = np.full((3, out_h + 5, out_w + 3), 7, dtype)
                view = big[:, 2:2 + out_h, 1:1 + out_w]
                if trial % 4 == 3:
                    view = view[:, ::-1]    # rows mirrored: a negative row stride
                dec.decode_into(data, box, view, flip=flip, crop_first=crop_first,
                                orientation=k)
                got = view * np.float32(255) if dtype == np.float32 else view
                mean_abs, worst = levels(got, want)
                assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (
                    k, box, (out_h, out_w), flip, crop_first, dtype, mean_abs, worst)
                pad = np.ones(big.shape, bool)
                pad[:, 2:2 + out_h, 1:1 + out_w] = False
                assert (big[pad] == 7).all(), (k, "wrote outside the output")


@needs_jpeg
def test_orientation_1_is_the_plain_decode_and_bad_values_are_refused(oriented):
    tagged, _ = oriented
    data = read(tagged[5])   # orientation 6
    dec = _jpeg.Decoder()
    w, h = dec.info(data)
    a = np.empty((3, 20, 30), np.uint8)
    b = np.empty((3, 20, 30), np.uint8)
    dec.decode_into(data, (2, 3, h - 5, w - 7), a, flip=True)
    dec.decode_into(data, (2, 3, h - 5, w - 7), b, flip=True, orientation=1)
    np.testing.assert_array_equal(a, b)
    for bad in (0, 9, True, 2.0, "6"):
        with pytest.raises(ValueError, match=f"orientation must be an EXIF orientation.*{bad!r}"):
            dec.decode_into(data, (0, 0, h, w), a, orientation=bad)
    # The box is checked against the displayed image: width and height swapped.
    with pytest.raises(ValueError, match=rf"outside the {w}x{h} \(height x width\) image as "
                                         r"displayed \(EXIF orientation 6\)"):
        dec.decode_into(data, (0, 0, h, w), a, orientation=6)


# --------------------------------------------------------------------------
# The datasets: default off, on through both decoders


def replay_box(ds, i, seed, height, width):
    """Sample ``i`` drawn after ``np.random.seed(seed)``, and its crop box and flip
    replayed from the same numbers on a ``height`` x ``width`` image."""
    np.random.seed(seed)
    u = np.random.random((1, ds.crop.draws + 1))[0]
    np.random.seed(seed)
    image, _ = ds[i]
    return image, ds.crop.box(height, width, u[:-1]), bool(u[-1] < ds.flip)


@pytest.mark.parametrize("decoder", DECODERS)
def test_datasets_turn_each_image_and_draw_the_crop_on_it(oriented, monkeypatch, decoder):
    """RandomResizedCrop's box is drawn on the displayed image's size and cut from it, as
    torchvision's recipe on ImageOps.exif_transpose's image."""
    if decoder == "auto" and _jpeg is None:
        pytest.skip("the JPEG decoder was not built (libjpeg headers missing)")
    monkeypatch.setenv(DECODER_ENV, decoder)
    tagged, _ = oriented
    ds = ImageFiles(tagged, list(ORIENTATIONS), crop=RandomResizedCrop((36, 44), scale=(0.3, 1)),
                    flip=0.5, output="uint8", exif_orientation=True)
    assert ds.exif_orientation and ds._compiled == (decoder == "auto")
    assert "exif_orientation=True" in repr(ds)
    flips = 0
    for i, path in enumerate(tagged):
        image = displayed(read(path))
        for seed in range(3):
            x, box, flip = replay_box(ds, i, 100 * i + seed, *image.shape[:2])
            want = pillow_resized(image, box, 36, 44, flip, crop_first=True)
            mean_abs, worst = levels(x, want)
            assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (
                decoder, i + 1, box, flip, mean_abs, worst)
            flips += flip
    assert 0 < flips < 24


@pytest.mark.parametrize("decoder", DECODERS)
def test_by_default_the_tag_is_ignored(oriented, monkeypatch, decoder):
    """Without exif_orientation, a tagged file gives exactly what the same pixels without
    EXIF give (torchvision's loader); with it, a file without a tag is as stored."""
    if decoder == "auto" and _jpeg is None:
        pytest.skip("the JPEG decoder was not built (libjpeg headers missing)")
    monkeypatch.setenv(DECODER_ENV, decoder)
    tagged, plain = oriented
    labels = list(ORIENTATIONS)
    crop = RandomResizedCrop(32)
    ds = ImageFiles(tagged, labels, crop=crop, output="uint8")
    ref = ImageFiles(plain, labels, crop=crop, output="uint8")
    on = ImageFiles(plain, labels, crop=crop, output="uint8", exif_orientation=True)
    assert not ds.exif_orientation
    for i in range(len(tagged)):
        np.random.seed(i)
        a = ds[i][0]
        np.random.seed(i)
        b = ref[i][0]
        np.random.seed(i)
        c = on[i][0]
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)


def test_bad_exif_orientation_is_named(oriented, tmp_path):
    tagged, _ = oriented
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match=f"ImageFiles: exif_orientation must be True.*"
                                             f"{bad!r}"):
            ImageFiles(tagged, list(ORIENTATIONS), exif_orientation=bad)
    with pytest.raises(ValueError, match="ImageFolder: exif_orientation"):
        ImageFolder(os.path.dirname(os.path.dirname(tagged[0])), exif_orientation="no")


def write_shard(paths, out):
    """A WebDataset-layout shard of ``paths`` (KEY.jpg and KEY.cls, the label its index)."""
    with tarfile.open(out, "w") as tf:
        for i, p in enumerate(paths):
            for name, data in ((f"s{i:03d}.jpg", read(p)), (f"s{i:03d}.cls", str(i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return str(out)


def copies(loader):
    return [(np.array(x), np.array(y)) for x, y in loader]


def test_every_num_workers_and_tar_shards_give_the_same_turned_batches(oriented, tmp_path):
    tagged, _ = oriented
    crop = RandomResizedCrop(40, scale=(0.5, 1))
    files = ImageFiles(tagged, list(range(8)), crop=crop, exif_orientation=True)
    shard = TarImages(write_shard(tagged, tmp_path / "s.tar"), crop=crop, exif_orientation=True)
    runs = {}
    for name, ds, nw in (("files0", files, 0), ("files2", files, 2), ("tar2", shard, 2)):
        with DataLoader(ds, batch_size=3, shuffle=True, seed=5, num_workers=nw) as dl:
            runs[name] = copies(dl)
    for other in ("files2", "tar2"):
        assert len(runs[other]) == len(runs["files0"])
        for (xa, ya), (xb, yb) in zip(runs["files0"], runs[other]):
            np.testing.assert_array_equal(ya, yb)
            np.testing.assert_array_equal(xa, xb)
    # Turned, not as stored: the centre crop of a transposed file is the displayed one's.
    eval_ds = ImageFiles(tagged[4:5], [0], crop=CenterCrop(24, resize=24), flip=0,
                         output="uint8", exif_orientation=True)
    image = displayed(read(tagged[4]))
    h, w = image.shape[:2]
    # torchvision's Resize(24): the shorter side to 24, the longer int(24 * long / short).
    short, long = (w, h) if w <= h else (h, w)
    nw, nh = (24, int(24 * long / short)) if w <= h else (int(24 * long / short), 24)
    pil = Image.fromarray(image).resize((nw, nh), Image.BILINEAR)
    t, left = int(round((nh - 24) / 2)), int(round((nw - 24) / 2))
    want = np.asarray(pil.crop((left, t, left + 24, t + 24))).transpose(2, 0, 1)
    mean_abs, worst = levels(eval_ds[0][0], want)
    assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (mean_abs, worst)
