"""netcl_loader._jpeg (region JPEG decoder) and _image.resize_into against Pillow.

The reference is what torchvision does on PIL images: Pillow decodes the whole
file, converts it to RGB and resizes the box with BILINEAR (antialiased when
shrinking), then the flip and ToTensor/Normalize. Our decoder must agree
within a mean absolute difference of 2 levels of 255 (and a bound on the
largest one); unscaled decodes use Pillow's own arithmetic and agree exactly
where Pillow resizes horizontally first. A RandomResizedCrop box is cropped
out first and then resized, as torchvision does (``crop_first``); a
CenterCrop box is a region of the image resized whole (Pillow's
``resize(box=...)``). Test images are cut from the real photos scikit-learn
ships and re-encoded with Pillow (with simplejpeg for the chroma
subsamplings Pillow cannot write, 4:4:0 and 4:1:1).
"""
import io
import threading
import zlib

import numpy as np
import pytest

from images_util import encode_jpeg, photo_region, sample_photo

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from netcl_loader import DataLoader, _image  # noqa: E402
from netcl_loader.images import (DECODER_ENV, CenterCrop, ImageFileError,  # noqa: E402
                                 ImageFiles, RandomResizedCrop)

try:
    from netcl_loader import _jpeg
except ImportError:  # built without libjpeg: the resize tests still run
    _jpeg = None

#: For the tests of the decoder (the ``files`` fixture applies it too).
needs_jpeg = pytest.mark.skipif(
    _jpeg is None, reason="the JPEG decoder was not built (libjpeg headers missing)")

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
MEAN_TOL = 2.0   # mean absolute difference, levels of 255
MAX_TOL = 40     # largest absolute difference, levels of 255


# --------------------------------------------------------------------------
# Images and the reference
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files():
    """JPEG bytes of real photos in every layout the decoder handles."""
    if _jpeg is None:
        pytest.skip("the JPEG decoder was not built (libjpeg headers missing)")
    rng = np.random.default_rng(18)
    base = photo_region(rng, (410, 310))
    odd = photo_region(rng, (413, 311))
    # A large photo (an upscaled region: the detail of a real high-resolution
    # file) where the DCT scaling does most of the shrinking.
    big = np.asarray(Image.fromarray(np.ascontiguousarray(sample_photo(1)))
                     .resize((1283, 857), Image.BICUBIC))
    return {
        "rgb420": encode_jpeg(base, quality=90),
        "rgb444_odd": encode_jpeg(odd, quality=93, subsampling=0),
        "rgb422": encode_jpeg(odd, quality=88, subsampling=1),
        "progressive": encode_jpeg(base, quality=91, progressive=True),
        "grey": encode_jpeg(odd, quality=92, mode="L"),
        "grey_progressive": encode_jpeg(base, quality=90, mode="L", progressive=True),
        "cmyk": encode_jpeg(odd, quality=95, mode="CMYK"),
        "cmyk_progressive": encode_jpeg(base, quality=89, mode="CMYK", progressive=True),
        "big": encode_jpeg(big, quality=90),
        "big_progressive": encode_jpeg(big, quality=92, progressive=True),
        "tiny": encode_jpeg(photo_region(rng, (17, 9)), quality=95),
    }


def pillow_rgb(data):
    return Image.open(io.BytesIO(data)).convert("RGB")


def reference_u8(pil, box, out_hw, flip=False):
    """Pillow's resize of box = (top, left, height, width), as uint8 CHW."""
    top, left, height, width = box
    img = pil.resize((out_hw[1], out_hw[0]), Image.BILINEAR,
                     box=(left, top, left + width, top + height))
    arr = np.asarray(img)
    if flip:
        arr = arr[:, ::-1]
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def normalised(ref_u8, mean=MEAN, std=STD):
    """ToTensor then Normalize, in float32 as torchvision computes them."""
    x = ref_u8.astype(np.float32) / np.float32(255)
    m = np.asarray(mean, np.float32)[:, None, None]
    s = np.asarray(std, np.float32)[:, None, None]
    return (x - m) / s


def levels(a, b):
    return np.abs(a.astype(np.int64) - b.astype(np.int64))


def assert_close(got_u8, want_u8, what=""):
    d = levels(got_u8, want_u8)
    assert d.mean() <= MEAN_TOL and d.max() <= MAX_TOL, (
        f"{what}: mean |diff| {d.mean():.3f} levels (<= {MEAN_TOL}), max {d.max()} (<= {MAX_TOL})")


def pillow_horizontal_first(image_hw, out_hw):
    """Whether Pillow resizes horizontally first (always before Pillow 13; from
    13 on unless the image shrinks more than twice as much in height)."""
    dh, dw = image_hw[0] - out_hw[0], image_hw[1] - out_hw[1]
    return not (dh > 0 and dh > 2 * dw)


def decode(data, box, out_hw, dtype=np.uint8, flip=False, mean=None, std=None, dec=None):
    dec = dec or _jpeg.Decoder()
    out = np.full((3,) + tuple(out_hw), 77, dtype=dtype)
    denom = dec.decode_into(data, box, out, flip=flip, mean=mean, std=std)
    return out, denom


def random_box(rng, height, width, integer):
    h = rng.uniform(1, height)
    w = rng.uniform(1, width)
    t = rng.uniform(0, height - h)
    left = rng.uniform(0, width - w)
    if integer:
        t, left, h, w = int(t), int(left), max(1, int(h)), max(1, int(w))
    return (float(t), float(left), float(h), float(w))


# --------------------------------------------------------------------------
# Module surface
# --------------------------------------------------------------------------

def test_module_constants_and_is_jpeg(files):
    assert isinstance(_jpeg.HAVE_SCALE_CROP, bool)
    assert "JPEG_LIB_VERSION" in _jpeg.LIBJPEG_VERSION
    assert issubclass(_jpeg.ImageError, ValueError)
    assert _jpeg.resize_into is _image.resize_into
    data = files["rgb420"]
    assert _jpeg.is_jpeg(data)
    assert _jpeg.is_jpeg(bytearray(data))
    assert _jpeg.is_jpeg(memoryview(data)[:2])
    assert _jpeg.is_jpeg(np.frombuffer(data, np.uint8))
    assert not _jpeg.is_jpeg(b"")
    assert not _jpeg.is_jpeg(b"\xff")
    assert not _jpeg.is_jpeg(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize("name", ["rgb420", "rgb444_odd", "progressive", "grey", "cmyk",
                                  "big", "tiny"])
def test_info_is_the_image_size(files, name):
    data = files[name]
    assert _jpeg.Decoder().info(data) == pillow_rgb(data).size


# --------------------------------------------------------------------------
# Correctness against Pillow
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rgb420", "rgb444_odd", "rgb422", "progressive", "grey",
                                  "grey_progressive", "cmyk", "cmyk_progressive", "tiny"])
def test_unscaled_decode_is_pillows_arithmetic(files, name):
    """Random boxes (integer and fractional) to random odd and even sizes that
    need no DCT scaling: equal to Pillow where Pillow resizes horizontally
    first (within one level where it does not)."""
    data = files[name]
    pil = pillow_rgb(data)
    width, height = pil.size
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    dec = _jpeg.Decoder()
    seen = 0
    for trial in range(24):
        box = random_box(rng, height, width, integer=trial % 2 == 0)
        out_hw = (int(rng.integers(1, 2 * height)), int(rng.integers(1, 2 * width)))
        if box[2] / 2 >= 1.5 * out_hw[0] and box[3] / 2 >= 1.5 * out_hw[1]:
            out_hw = (int(box[2] / 3) + 1, out_hw[1])  # keep it unscaled
        flip = trial % 3 == 0
        got, denom = decode(data, box, out_hw, flip=flip, dec=dec)
        assert denom == 1
        want = reference_u8(pil, box, out_hw, flip)
        if pillow_horizontal_first((height, width), out_hw):
            np.testing.assert_array_equal(got, want, err_msg=f"{name} box {box} -> {out_hw}")
            seen += 1
        else:
            assert levels(got, want).max() <= 1, f"{name} box {box} -> {out_hw}"
    assert seen >= 8


def test_whole_image_and_identity(files):
    data = files["rgb444_odd"]
    pil = pillow_rgb(data)
    width, height = pil.size
    got, denom = decode(data, (0, 0, height, width), (height, width))
    assert denom == 1
    np.testing.assert_array_equal(got, np.asarray(pil).transpose(2, 0, 1))


@pytest.mark.parametrize("name", ["rgb420", "rgb444_odd", "grey", "cmyk", "tiny"])
def test_boxes_touching_every_edge(files, name):
    data = files[name]
    pil = pillow_rgb(data)
    W, H = pil.size
    h, w = max(1, H // 3), max(1, W // 3)
    boxes = [
        (0, 0, h, w), (0, W - w, h, w), (H - h, 0, h, w), (H - h, W - w, h, w),   # corners
        (0, 0, H, w), (0, W - w, H, w), (0, 0, h, W), (H - h, 0, h, W),           # strips
        (0.0, W - w - 0.5, h + 0.25, w + 0.5), (H - h - 0.75, 0.0, h + 0.75, w),  # fractional
        (0, 0, H, W),
    ]
    dec = _jpeg.Decoder()
    for box in boxes:
        sizes = [(7, 5), (h, w), (2 * h + 1, 2 * w - 1)]
        if H < 20:
            # Not the 3x5 of the 9x17 image: that decodes at 1/2 scale, a
            # handful of pixels each averaging whole 8x8 blocks.
            sizes = [(4, 9), (H, W), (2 * H + 1, 2 * W - 1)]
        for out_hw in sizes:
            for flip in (False, True):
                got, _ = decode(data, box, out_hw, flip=flip, dec=dec)
                want = reference_u8(pil, box, out_hw, flip)
                assert_close(got, want, f"{name} box {box} -> {out_hw} flip {flip}")


def test_box_edges_may_stick_out_by_rounding(files):
    """A centre crop computed in floating point may overshoot by far less than a pixel."""
    data = files["rgb420"]
    W, H = pillow_rgb(data).size
    eps = 1e-3
    got, _ = decode(data, (-eps, -eps, H + 2 * eps, W + 2 * eps), (31, 41))
    want, _ = decode(data, (0, 0, H, W), (31, 41))
    assert levels(got, want).max() <= 1


@pytest.mark.parametrize("name,box,out_hw,denom", [
    ("big", (0, 0, 857, 1283), (224, 224), 2),
    ("big", (0, 0, 857, 1283), (100, 150), 4),
    ("big", (0, 0, 857, 1283), (53, 61), 8),
    ("big", (100.5, 201.25, 700, 1000), (57, 113), 4),
    ("big", (857 - 600, 1283 - 900, 600, 900), (190, 190), 2),   # bottom-right corner
    ("big", (0, 0, 500, 500), (31, 29), 8),                      # top-left corner
    ("big_progressive", (20, 30, 800, 1200), (224, 224), 2),
    ("big_progressive", (0, 283, 857, 1000), (64, 64), 8),
    ("rgb420", (0, 0, 310, 410), (50, 60), 4),
    ("grey", (0, 0, 311, 413), (37, 51), 4),
    ("cmyk", (10, 12, 300, 400), (70, 90), 2),
    ("progressive", (0, 0, 310, 410), (25, 33), 8),
])
def test_scaled_decode_close_to_pillow(files, name, box, out_hw, denom):
    data = files[name]
    pil = pillow_rgb(data)
    for flip in (False, True):
        got, used = decode(data, box, out_hw, flip=flip)
        assert used == denom
        assert_close(got, reference_u8(pil, box, out_hw, flip), f"{name} {box} -> {out_hw}")


def test_scale_choice_keeps_the_box_at_least_1_5x_the_output(files):
    data = files["big"]
    for out_side, denom in [(600, 1), (286, 1), (285, 2), (143, 2), (142, 4), (72, 4),
                            (71, 8), (10, 8)]:
        # box height 857: denom d is used when 857 / d >= 1.5 * out (width is larger)
        _, used = decode(data, (0, 0, 857, 1283), (out_side, out_side))
        assert used == denom, (out_side, used, denom)


def test_random_boxes_like_random_resized_crop(files):
    """Boxes drawn as RandomResizedCrop draws them, to 224x224, float32
    normalised, on every layout; and the same with uint8 output."""
    rng = np.random.default_rng(7)
    dec = _jpeg.Decoder()
    for name in ["rgb420", "progressive", "grey", "cmyk", "big", "big_progressive"]:
        data = files[name]
        pil = pillow_rgb(data)
        W, H = pil.size
        for _ in range(6):
            area = H * W * rng.uniform(0.08, 1.0)
            ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
            w = int(round(np.sqrt(area * ratio)))
            h = int(round(np.sqrt(area / ratio)))
            if not (0 < w <= W and 0 < h <= H):
                continue
            box = (int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1)), h, w)
            flip = bool(rng.integers(2))
            want = reference_u8(pil, box, (224, 224), flip)
            got_f, _ = decode(data, box, (224, 224), np.float32, flip, MEAN, STD, dec)
            ref_f = normalised(want)
            # Compare in levels of 255: undo the normalisation.
            back = got_f * np.asarray(STD, np.float32)[:, None, None] * 255
            d = np.abs(back - (ref_f * np.asarray(STD, np.float32)[:, None, None] * 255))
            assert d.mean() <= MEAN_TOL and d.max() <= MAX_TOL + 0.01, (name, box)
            got_u, _ = decode(data, box, (224, 224), np.uint8, flip, dec=dec)
            assert_close(got_u, want, f"{name} {box}")


def test_float32_output_is_the_normalised_uint8_output(files):
    data = files["rgb420"]
    box, out_hw = (10.5, 20.25, 250, 330.5), (97, 131)
    u8, _ = decode(data, box, out_hw, np.uint8, flip=True)
    f32, _ = decode(data, box, out_hw, np.float32, flip=True, mean=MEAN, std=STD)
    np.testing.assert_array_equal(f32, normalised(u8))
    plain, _ = decode(data, box, out_hw, np.float32, flip=True)
    np.testing.assert_array_equal(plain, u8.astype(np.float32) / np.float32(255))
    only_mean, _ = decode(data, box, out_hw, np.float32, flip=True, mean=MEAN)
    np.testing.assert_array_equal(only_mean, normalised(u8, MEAN, (1, 1, 1)))


def test_flip_mirrors_the_output(files):
    data = files["cmyk"]
    box, out_hw = (3.5, 7.25, 280, 377), (45, 67)
    a, _ = decode(data, box, out_hw)
    b, _ = decode(data, box, out_hw, flip=True)
    np.testing.assert_array_equal(b, a[:, :, ::-1])


def test_grey_gives_equal_channels(files):
    got, _ = decode(files["grey"], (0, 0, 311, 413), (64, 80))
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])


def test_decoder_is_reused_across_sizes_and_errors(files):
    """One decoder through big, small, broken and layout-changing files gives
    what a fresh decoder gives for each."""
    dec = _jpeg.Decoder()
    seq = ["big", "tiny", "cmyk", None, "grey", "big_progressive", None, "rgb420"]
    for name in seq:
        if name is None:
            with pytest.raises(_jpeg.ImageError):
                dec.decode_into(files["rgb420"][:3000], (0, 0, 310, 410),
                                np.empty((3, 8, 8), np.uint8))
            continue
        W, H = pillow_rgb(files[name]).size
        box = (0.5, 0.25, H - 1, W - 0.5)
        got, _ = decode(files[name], box, (33, 47), dec=dec)
        fresh, _ = decode(files[name], box, (33, 47))
        np.testing.assert_array_equal(got, fresh)


def test_decoders_in_threads_are_independent(files):
    names = ["rgb420", "grey", "cmyk", "big"]
    want = {n: decode(files[n], (0, 0) + tuple(reversed(pillow_rgb(files[n]).size)),
                      (40, 40))[0] for n in names}
    errors = []

    def work(name):
        dec = _jpeg.Decoder()
        W, H = pillow_rgb(files[name]).size
        for _ in range(10):
            got, _ = decode(files[name], (0, 0, H, W), (40, 40), dec=dec)
            if not np.array_equal(got, want[name]):
                errors.append(name)

    threads = [threading.Thread(target=work, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_accepts_any_contiguous_buffer(files):
    data = files["rgb420"]
    ref, _ = decode(data, (0, 0, 310, 410), (20, 30))
    for buf in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8),
                memoryview(b"xx" + data)[2:]):
        got, _ = decode(buf, (0, 0, 310, 410), (20, 30))
        np.testing.assert_array_equal(got, ref)


# --------------------------------------------------------------------------
# resize_into (the same kernel on decoded arrays)
# --------------------------------------------------------------------------

def test_resize_into_is_pillows_resize():
    rng = np.random.default_rng(3)
    img = np.ascontiguousarray(sample_photo(0)[:301, :413])
    pil = Image.fromarray(img)
    H, W = img.shape[:2]
    for trial in range(60):
        box = random_box(rng, H, W, integer=trial % 2 == 0)
        out_hw = (int(rng.integers(1, 400)), int(rng.integers(1, 400)))
        flip = trial % 3 == 1
        out = np.empty((3,) + out_hw, np.uint8)
        _image.resize_into(img, box, out, flip=flip)
        want = reference_u8(pil, box, out_hw, flip)
        if pillow_horizontal_first((H, W), out_hw):
            np.testing.assert_array_equal(out, want, err_msg=f"{box} -> {out_hw}")
        else:
            assert levels(out, want).max() <= 1


def test_resize_into_any_strides_and_float32():
    img = np.ascontiguousarray(sample_photo(1)[:200, :300])
    views = [img[::-1], img[:, ::-2], img[10:150:3, 5:250]]
    planar = np.ascontiguousarray(img.transpose(2, 0, 1)).transpose(1, 2, 0)  # channel stride H*W
    views.append(planar)
    for v in views:
        H, W = v.shape[:2]
        box = (0.5, 1.25, H - 1.0, W - 2.0)
        out = np.empty((3, 50, 61), np.float32)
        _image.resize_into(v, box, out, flip=True, mean=MEAN, std=STD)
        want = reference_u8(Image.fromarray(np.ascontiguousarray(v)), box, (50, 61), True)
        ok = normalised(want)
        if pillow_horizontal_first((H, W), (50, 61)):
            np.testing.assert_array_equal(out, ok)
        else:
            assert np.abs(out - ok).max() <= 1.01 / 255 / min(STD)


def test_resize_into_checks_its_arguments():
    img = np.zeros((20, 30, 3), np.uint8)
    out = np.empty((3, 8, 8), np.float32)
    with pytest.raises(ValueError, match=r"src must have shape \(H, W, 3\)"):
        _image.resize_into(np.zeros((20, 30, 4), np.uint8), (0, 0, 20, 30), out)
    with pytest.raises(ValueError, match="outside the 20x30 image"):
        _image.resize_into(img, (0, 0, 21, 30), out)
    with pytest.raises(ValueError, match="outside"):
        _image.resize_into(img, (0, 25, 5, 5.1), out)
    _image.resize_into(img, (0, 25, 5, 5.005), out)  # within the rounding tolerance


# --------------------------------------------------------------------------
# Argument checks (shared by decode_into and resize_into)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("out,match", [
    (np.empty((3, 8, 8), np.float64), "float32 or uint8"),
    (np.empty((8, 8, 3), np.float32), r"shape \(3, H, W\)"),
    (np.empty((3, 8), np.float32), r"shape \(3, H, W\)"),
    (np.empty((3, 0, 8), np.float32), "H and W must be"),
    (np.empty((3, 8, 16), np.float32)[:, :, ::2], "C-contiguous"),
    ([[[0.0]]], "numpy.ndarray"),
])
def test_bad_out_is_refused(files, out, match):
    with pytest.raises((TypeError, ValueError), match=match):
        _jpeg.Decoder().decode_into(files["rgb420"], (0, 0, 10, 10), out)
    with pytest.raises((TypeError, ValueError), match=match):
        _image.resize_into(np.zeros((10, 10, 3), np.uint8), (0, 0, 10, 10), out)


def test_read_only_out_is_refused(files):
    out = np.empty((3, 8, 8), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _jpeg.Decoder().decode_into(files["rgb420"], (0, 0, 10, 10), out)


@pytest.mark.parametrize("box,err,match", [
    ((0, 0, 10), TypeError, "4 numbers"),
    ("abcd", TypeError, "4 numbers"),
    ((0, 0, float("nan"), 10), ValueError, "finite"),
    ((0, float("inf"), 10, 10), ValueError, "finite"),
    ((0, 0, 0, 10), ValueError, "height > 0"),
    ((0, 0, 10, -1), ValueError, "width > 0"),
    ((-1, 0, 10, 10), ValueError, "outside the 310x410"),
    ((0, 0, 311, 410), ValueError, "outside the 310x410"),
    ((300, 400, 10, 10.5), ValueError, "outside the 310x410"),
])
def test_bad_box_is_refused(files, box, err, match):
    out = np.empty((3, 8, 8), np.float32)
    with pytest.raises(err, match=match):
        _jpeg.Decoder().decode_into(files["rgb420"], box, out)


@pytest.mark.parametrize("kw,match", [
    (dict(mean=(0.5, 0.5)), "mean must be 3 numbers"),
    (dict(std=(1, 0, 1)), "std must be non-zero"),
    (dict(std=(1, float("nan"), 1)), "std must be finite"),
    (dict(mean="abc"), "mean must be 3 numbers"),
])
def test_bad_mean_std_is_refused(files, kw, match):
    with pytest.raises(ValueError, match=match):
        _jpeg.Decoder().decode_into(files["rgb420"], (0, 0, 10, 10),
                                    np.empty((3, 8, 8), np.float32), **kw)


def test_mean_std_with_uint8_output_is_refused(files):
    with pytest.raises(ValueError, match="float32 output only"):
        _jpeg.Decoder().decode_into(files["rgb420"], (0, 0, 10, 10),
                                    np.empty((3, 8, 8), np.uint8), mean=MEAN, std=STD)


# --------------------------------------------------------------------------
# Bad files: a clear ImageError, never a crash
# --------------------------------------------------------------------------

def png_bytes():
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(sample_photo(0)[:40, :50])).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("data,match", [
    (b"", r"empty file \(0 bytes\)"),
    (b"\xff", "not a JPEG file"),
    (png_bytes(), r"not a JPEG file \(starts with b'\\x89PNG"),
    (np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
     "not a JPEG file"),
    (b"\xff\xd8" + np.random.default_rng(2).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
     "(corrupt|truncated) JPEG data"),
    (b"\xff\xd8\xff\xd9", "corrupt JPEG data"),
], ids=["empty", "one-byte", "png", "random", "soi-random", "soi-eoi"])
@needs_jpeg
def test_not_a_jpeg(data, match):
    dec = _jpeg.Decoder()
    with pytest.raises(_jpeg.ImageError, match=match):
        dec.info(data)
    with pytest.raises(_jpeg.ImageError, match=match):
        dec.decode_into(data, (0, 0, 1, 1), np.empty((3, 4, 4), np.float32))


@pytest.mark.parametrize("name", ["rgb420", "progressive", "grey", "cmyk"])
def test_truncated_files(files, name):
    """Cut anywhere, the full-image decode says the data is truncated (the
    missing part is not decoded as grey); cut in the header, info says so."""
    data = files[name]
    W, H = pillow_rgb(data).size
    dec = _jpeg.Decoder()
    for frac in (0.001, 0.01, 0.05, 0.2, 0.5, 0.8, 0.95, 0.999):
        cut = data[:max(2, int(len(data) * frac))]
        with pytest.raises(_jpeg.ImageError, match="truncated JPEG data"):
            dec.decode_into(cut, (0, 0, H, W), np.empty((3, 24, 32), np.float32))
    with pytest.raises(_jpeg.ImageError, match="truncated JPEG data"):
        dec.info(data[:60])
    # Two bytes short (the end-of-image marker gone): Pillow calls it truncated too.
    with pytest.raises(_jpeg.ImageError, match="truncated"):
        dec.decode_into(data[:-2], (0, 0, H, W), np.empty((3, 24, 32), np.float32))
    # The decoder still works afterwards.
    got, _ = decode(data, (0, 0, H, W), (24, 32), dec=dec)
    np.testing.assert_array_equal(got, decode(data, (0, 0, H, W), (24, 32))[0])


def test_bit_flips_never_crash(files):
    """Flipped bits give an ImageError or some image, and never write outside out."""
    data = files["rgb420"]
    rng = np.random.default_rng(11)
    dec = _jpeg.Decoder()
    outcomes = {"ok": 0, "error": 0}
    for _ in range(150):
        b = bytearray(data)
        for pos in rng.integers(0, len(b), size=int(rng.integers(1, 4))):
            b[pos] ^= 1 << int(rng.integers(8))
        guard = np.full((5, 20, 24), 123, np.uint8)
        try:
            W, H = dec.info(bytes(b))
            dec.decode_into(bytes(b), (0, 0, H, W), guard[1:4])
            outcomes["ok"] += 1
        except _jpeg.ImageError as exc:
            assert str(exc)
            outcomes["error"] += 1
        assert (guard[0] == 123).all() and (guard[4] == 123).all()
    assert outcomes["ok"] and outcomes["error"]


def test_busy_decoder_is_refused_from_another_thread(files):
    """The same Decoder in two threads at once: the second call is refused
    (RuntimeError) or runs after the first; results stay correct."""
    data = files["big_progressive"]
    dec = _jpeg.Decoder()
    want, _ = decode(data, (0, 0, 857, 1283), (224, 224))
    results = []

    def work():
        for _ in range(4):
            out = np.empty((3, 224, 224), np.uint8)
            try:
                dec.decode_into(data, (0, 0, 857, 1283), out)
            except RuntimeError as exc:
                assert "in use by another thread" in str(exc)
                results.append("busy")
            else:
                results.append(np.array_equal(out, want))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert False not in results and len(results) == 12


def test_vector_and_scalar_code_give_the_same_bytes(files):
    """The AVX2 resize (where the CPU has it) and the portable scalar code are
    the same integer arithmetic: identical output, every layout and size."""
    rng = np.random.default_rng(4)
    img = np.ascontiguousarray(sample_photo(0)[:211, :333])
    cases = []
    for trial in range(40):
        box = random_box(rng, 211, 333, integer=trial % 2 == 0)
        cases.append((box, (int(rng.integers(1, 300)), int(rng.integers(1, 300))), trial % 3 == 0))
    results = {}
    try:
        for simd in (True, False):
            _image._use_simd(simd)
            _jpeg._use_simd(simd)
            got = []
            for box, out_hw, flip in cases:
                out = np.empty((3,) + out_hw, np.float32)
                _image.resize_into(img[:, ::-1], box, out, flip=flip, mean=MEAN, std=STD)
                got.append(out)
            for name in ["rgb420", "grey", "cmyk", "big_progressive"]:
                W, H = pillow_rgb(files[name]).size
                for box, out_hw, flip in cases[:10]:
                    box = (box[0] * H / 211, box[1] * W / 333, box[2] * H / 211, box[3] * W / 333)
                    got.append(decode(files[name], box, out_hw, np.uint8, flip)[0])
            results[simd] = got
    finally:
        _image._use_simd(True)
        _jpeg._use_simd(True)
    for a, b in zip(results[True], results[False]):
        np.testing.assert_array_equal(a, b)



def test_vector_and_scalar_code_agree_for_every_width_and_output_kind():
    """Enlargements (at most two taps a pixel, the vector code's pair layout),
    shrinks by under 1.5x and by 3x, every output width from 1 to 40 and some
    wider ones (each tail of the 16-, 8- and 1-sample loops), flipped or not,
    into uint8, float32 on the 0-1 scale and normalised float32: the vector
    code writes the scalar code's bytes."""
    rng = np.random.default_rng(21)
    img = np.ascontiguousarray(sample_photo(0)[:97, :131])
    cases = []
    for out_w in list(range(1, 41)) + [63, 64, 65, 97, 130]:
        for factor in (0.55, 1.3, 3.0):
            bw = min(131.0, max(1.0, out_w * factor))
            out_h = int(rng.integers(1, 40))
            bh = min(97.0, max(1.0, out_h * factor))
            box = (float(rng.uniform(0, 97 - bh)), float(rng.uniform(0, 131 - bw)), bh, bw)
            cases.append((box, (out_h, out_w), len(cases) % 2 == 0))
    kinds = [(np.uint8, {}), (np.float32, {}), (np.float32, dict(mean=MEAN, std=STD))]
    results = {}
    try:
        for simd in (True, False):
            _image._use_simd(simd)
            got = []
            for box, out_hw, flip in cases:
                for dtype, norm in kinds:
                    out = np.empty((3,) + out_hw, dtype)
                    _image.resize_into(img, box, out, flip=flip, **norm)
                    got.append(out)
            results[simd] = got
    finally:
        _image._use_simd(True)
    for a, b in zip(results[True], results[False]):
        np.testing.assert_array_equal(a, b)


def test_float32_output_is_exact_for_every_level_and_any_mean_std():
    """Every level 0..255 of every channel, through the identity resize, comes
    out as NumPy's float32 ``(v / 255 - mean) / std``, bit for bit, whatever
    the mean and std (the vector code computes it rather than reading the
    table), through the vector and the scalar code."""
    rng = np.random.default_rng(22)
    levels_img = np.stack([rng.permutation(256).reshape(16, 16) for _ in range(3)], axis=-1)
    img = np.ascontiguousarray(np.tile(levels_img, (1, 3, 1)).astype(np.uint8))  # 16 x 48
    settings = [dict(), dict(mean=(0, 0, 0), std=(1, 1, 1)), dict(mean=MEAN, std=STD),
                dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))]
    settings += [dict(mean=tuple(rng.uniform(-1, 1, 3)), std=tuple(rng.uniform(0.01, 3, 3)))
                 for _ in range(6)]
    try:
        for simd in (True, False):
            _image._use_simd(simd)
            for norm in settings:
                for flip in (False, True):
                    out = np.empty((3, 16, 48), np.float32)
                    _image.resize_into(img, (0, 0, 16, 48), out, flip=flip, **norm)
                    want = normalised(img.transpose(2, 0, 1), norm.get("mean", (0, 0, 0)),
                                      norm.get("std", (1, 1, 1)))
                    if flip:
                        want = want[:, :, ::-1]
                    np.testing.assert_array_equal(out, want, err_msg=f"{norm} simd={simd}")
    finally:
        _image._use_simd(True)

def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_the_vector_paths_are_taken_where_the_cpu_has_avx2():
    """Both modules resize with AVX2 where the CPU has it: the run-time check
    must see the CPU as it is whatever compiler and runtime built the module
    (with __builtin_cpu_supports, the wheel's clang-built modules read "no
    AVX2" on CPUs that have it), or the comparison above passes without any
    vector code."""
    if "avx2" not in cpu_flags():
        pytest.skip("this CPU has no AVX2 (or /proc/cpuinfo is not readable): only the "
                    "scalar paths exist here")
    try:
        assert _image._use_simd(True) is True
        assert _jpeg._use_simd(True) is True
    finally:
        _image._use_simd(True)
        _jpeg._use_simd(True)


def test_a_view_into_a_padded_array_gets_the_same_pixels(files):
    """A sub-rectangle ``a[:, y0:y0+h, x0:x0+w]`` of a larger C-contiguous
    array (how a letterboxed image lands in its slot row) receives exactly the
    values a contiguous ``out`` receives, through the vector and the scalar
    code, float32 (normalised) and uint8, flipped or not, and nothing outside
    it is written."""
    rng = np.random.default_rng(11)
    img = np.ascontiguousarray(sample_photo(1)[:190, :260])
    try:
        for simd in (True, False):
            _image._use_simd(simd)
            _jpeg._use_simd(simd)
            for trial in range(24):
                out_hw = (int(rng.integers(1, 90)), int(rng.integers(1, 90)))
                y0, x0 = int(rng.integers(0, 20)), int(rng.integers(0, 20))
                dtype = np.float32 if trial % 2 else np.uint8
                norm = dict(mean=MEAN, std=STD) if dtype == np.float32 else {}
                flip = trial % 3 == 0
                big = np.full((3, out_hw[0] + y0 + 5, out_hw[1] + x0 + 7), 123, dtype)
                view = big[:, y0:y0 + out_hw[0], x0:x0 + out_hw[1]]
                want = np.empty((3,) + out_hw, dtype)
                if trial % 4 < 2:
                    box = random_box(rng, 190, 260, integer=trial % 8 < 4)
                    _image.resize_into(img, box, want, flip=flip, **norm)
                    _image.resize_into(img, box, view, flip=flip, **norm)
                else:
                    name = ["rgb420", "grey", "cmyk", "big_progressive"][trial % 4]
                    W, H = pillow_rgb(files[name]).size
                    box = random_box(rng, H, W, integer=False)
                    _jpeg.Decoder().decode_into(files[name], box, want, flip=flip, **norm)
                    _jpeg.Decoder().decode_into(files[name], box, view, flip=flip, **norm)
                np.testing.assert_array_equal(view, want)
                pad = np.ones(big.shape, bool)
                pad[:, y0:y0 + out_hw[0], x0:x0 + out_hw[1]] = False
                assert (big[pad] == 123).all()
    finally:
        _image._use_simd(True)
        _jpeg._use_simd(True)


def test_an_out_with_a_strided_last_axis_is_refused():
    img = np.zeros((8, 8, 3), np.uint8)
    big = np.zeros((3, 8, 16), np.float32)
    with pytest.raises(ValueError, match="last axis must be contiguous"):
        _image.resize_into(img, (0, 0, 8, 8), big[:, :, ::2])
    with pytest.raises(ValueError, match="last axis must be contiguous"):
        _image.resize_into(img, (0, 0, 8, 8), np.zeros((8, 8, 3), np.float32).transpose(2, 0, 1))


# --------------------------------------------------------------------------
# Chroma subsampling and the DCT scale

#: Each subsampling: how Pillow writes it (its ``subsampling`` value), or None
#: where it cannot (then simplejpeg, libjpeg-turbo's encoder, does), the
#: sampling factors (h, v) of the luma (the chroma's are 1, 1), and how many
#: times fewer samples the chroma holds than the DCT-scaled luma at every
#: scale 1/2 .. 1/8 (libjpeg's IDCT scaling makes up the rest).
SUBSAMPLINGS = {
    "4:4:4": (0, "444", (1, 1), (1, 1)),
    "4:2:2": (1, "422", (2, 1), (2, 1)),
    "4:2:0": (2, "420", (2, 2), (1, 1)),
    "4:4:0": (None, "440", (1, 2), (1, 2)),
    "4:1:1": (None, "411", (4, 1), (4, 1)),
}
OUT_SIDES = (32, 48, 64, 96, 112, 128, 160, 192, 224)


def sampling_factors(data):
    """(h, v) sampling factors of each component, from the frame header."""
    i = data.find(b"\xff\xc0")
    if i < 0:
        i = data.find(b"\xff\xc2")
    n = data[i + 9]
    return [(data[i + 11 + 3 * c] >> 4, data[i + 11 + 3 * c] & 15) for c in range(n)]


def subsampled_jpeg(image, name, quality=90):
    pillow_value, simplejpeg_value, luma, _ = SUBSAMPLINGS[name]
    if pillow_value is not None:
        data = encode_jpeg(image, quality=quality, subsampling=pillow_value)
    else:
        simplejpeg = pytest.importorskip(
            "simplejpeg", reason=f"Pillow cannot write {name}; simplejpeg makes the file")
        data = simplejpeg.encode_jpeg(np.ascontiguousarray(image), quality=quality,
                                      colorsubsampling=simplejpeg_value)
    assert sampling_factors(data) == [luma, (1, 1), (1, 1)], name
    return data


def torchvision_center_crop(pil, cc):
    """torchvision on PIL: Resize(cc.resize) of the whole image, then CenterCrop(cc.size)."""
    w, h = pil.size
    short, long = min(w, h), max(w, h)
    new_short, new_long = cc.resize, int(cc.resize * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    img = pil.resize((new_w, new_h), Image.BILINEAR)
    ch, cw = cc.size
    top, left = int(round((new_h - ch) / 2.0)), int(round((new_w - cw) / 2.0))
    return np.asarray(img.crop((left, top, left + cw, top + ch))).transpose(2, 0, 1)


def crop_then_resize(pil, box, out_hw):
    """torchvision's RandomResizedCrop on PIL: crop the (integer) box, resize it."""
    top, left, h, w = (int(v) for v in box)
    img = pil.crop((left, top, left + w, top + h)).resize((out_hw[1], out_hw[0]),
                                                          Image.BILINEAR)
    return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))


@needs_jpeg
@pytest.mark.parametrize("name", list(SUBSAMPLINGS))
def test_dct_scaling_holds_the_tolerance_for_every_subsampling(name):
    """640x427 photos in each subsampling, CenterCrop and RandomResizedCrop to
    32 .. 224: within the tolerance of Pillow + torchvision's recipe at every
    size (4:2:2, 4:4:0 and 4:1:1 scaled by the luma alone were off by up to
    3.8 levels at 32)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    dec = _jpeg.Decoder()
    for photo in (0, 1):
        data = subsampled_jpeg(sample_photo(photo), name)
        pil = pillow_rgb(data)
        width, height = pil.size
        for side in OUT_SIDES:
            cc = CenterCrop(side)
            got, denom = decode(data, cc.box(height, width), (side, side), dec=dec)
            assert_close(got, torchvision_center_crop(pil, cc),
                         f"{name} photo {photo} CenterCrop({side}) at 1/{denom}")
            rrc = RandomResizedCrop(side)
            for _ in range(2):
                box = rrc.get_params(height, width, rng)
                out = np.empty((3, side, side), np.uint8)
                denom = dec.decode_into(data, box, out, crop_first=True)
                assert_close(out, crop_then_resize(pil, box, (side, side)),
                             f"{name} photo {photo} box {box} -> {side} at 1/{denom}")


@needs_jpeg
@pytest.mark.parametrize("name", list(SUBSAMPLINGS))
def test_scale_choice_keeps_the_chroma_samples_at_least_1_5x_the_output(name):
    """The scale 1/d is the largest with at least 1.5x the output in the
    luma's samples (box / d) and in the chroma's (box / (d * fewer)), per axis."""
    _, _, _, (fx, fy) = SUBSAMPLINGS[name]
    data = subsampled_jpeg(sample_photo(1), name)
    width, height = pillow_rgb(data).size
    dec = _jpeg.Decoder()
    seen = set()
    for side in (12, 20, 27, 34, 40, 54, 68, 80, 107, 136, 171, 200, 214, 260, 342):
        want = 1
        for d in (8, 4, 2):
            if (width / d >= 1.5 * side and height / d >= 1.5 * side
                    and -(-width // (d * fx)) >= 1.5 * side
                    and -(-height // (d * fy)) >= 1.5 * side):
                want = d
                break
        got, denom = decode(data, (0, 0, height, width), (side, side), dec=dec)
        assert denom == want, (name, side, denom, want)
        seen.add(denom)
    assert seen == {1, 2, 4, 8}


# --------------------------------------------------------------------------
# RandomResizedCrop crops first; CenterCrop reads the neighbours

def tiny_jpegs(tmp_path):
    rng = np.random.default_rng(12)
    paths = []
    for k, (w, h) in enumerate([(8, 8), (9, 12), (13, 10), (16, 16), (11, 15), (16, 9)]):
        path = str(tmp_path / f"tiny{k}.jpg")
        with open(path, "wb") as f:
            f.write(encode_jpeg(photo_region(rng, (w, h)), quality=95))
        paths.append(path)
    return paths


class RecordedCrop(RandomResizedCrop):
    """RandomResizedCrop that keeps the boxes it draws (in this process)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.boxes = []

    def box(self, height, width, u):
        b = super().box(height, width, u)
        self.boxes.append(b)
        return b


@needs_jpeg
def test_a_box_is_interpolated_within_itself_when_cropped_first(files):
    """crop_first: equal to Pillow's crop then resize (enlarging and shrinking,
    whole-pixel boxes); without it, Pillow's resize(box=) of the whole image,
    which reads the pixels around the box."""
    data = files["rgb444_odd"]
    pil = pillow_rgb(data)
    W, H = pil.size
    rng = np.random.default_rng(8)
    dec = _jpeg.Decoder()
    apart = 0
    for trial in range(30):
        box = random_box(rng, H, W, integer=True)
        if trial % 3 == 0:
            box = (box[0], box[1], min(box[2], 12.0), min(box[3], 9.0))  # tiny: enlarged
        out_hw = (int(rng.integers(4, 60)), int(rng.integers(4, 60)))
        if box[2] / 2 >= 1.5 * out_hw[0] and box[3] / 2 >= 1.5 * out_hw[1]:
            out_hw = (int(box[2] / 3) + 1, out_hw[1])  # keep it unscaled: Pillow's arithmetic
        flip = trial % 2 == 1
        within = np.empty((3,) + out_hw, np.uint8)
        assert dec.decode_into(data, box, within, flip=flip, crop_first=True) == 1
        want = crop_then_resize(pil, box, out_hw)
        want = want[:, :, ::-1] if flip else want
        assert levels(within, want).max() <= 1, (box, out_hw)
        around, _ = decode(data, box, out_hw, flip=flip, dec=dec)
        assert levels(around, reference_u8(pil, box, out_hw, flip)).max() <= 1, (box, out_hw)
        apart += levels(within, around).mean() > 0.5
    assert apart >= 5   # the two rules differ: this test tells them apart
    # resize_into (the Pillow path's last pass) follows the same rule.
    src = np.asarray(pil)
    box, out_hw = (3, 5, 10, 7), (33, 29)
    out = np.empty((3,) + out_hw, np.uint8)
    _image.resize_into(src, box, out, crop_first=True)
    assert levels(out, crop_then_resize(pil, box, out_hw)).max() <= 1


@needs_jpeg
@pytest.mark.parametrize("decoder", ["auto", "pillow"])
def test_random_resized_crop_of_tiny_images_is_torchvisions_crop_then_resize(
        tmp_path, monkeypatch, decoder):
    """Images of 8x8 to 16x16 pixels (CIFAR-sized and below) through
    ImageFiles with RandomResizedCrop, enlarging (32) and shrinking (5): equal
    to torchvision v2's crop then resize of the same boxes, bilinear with
    antialiasing, on the tensor of the file that Pillow decodes: within a
    level where the box is decoded unscaled, within the tolerance where a box
    of 15 pixels or more is shrunk to 5 at 1/2 scale."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv(DECODER_ENV, decoder)
    np.random.seed(31)   # the crops' draws outside a loader come from NumPy's global RNG
    paths = tiny_jpegs(tmp_path)
    for side in (32, 5):
        crop = RecordedCrop(side)
        ds = ImageFiles(paths * 4, list(range(len(paths))) * 4, crop=crop, flip=0,
                        output="uint8")
        assert ds._compiled == (decoder == "auto")
        images, _ = ds.gather_batch(np.arange(len(ds)), np.empty)
        assert len(crop.boxes) == len(ds)
        for k, (img, box) in enumerate(zip(images, crop.boxes)):
            top, left, h, w = box
            src = np.asarray(Image.open(paths[k % len(paths)]).convert("RGB"))
            x = torch.from_numpy(np.ascontiguousarray(
                src[top:top + h, left:left + w].transpose(2, 0, 1)))[None]
            want = torch.nn.functional.interpolate(x, size=(side, side), mode="bilinear",
                                                   antialias=True, align_corners=False)
            d = levels(img, want[0].numpy())
            what = (paths[k % len(paths)], box, side)
            if decoder == "pillow" or min(h, w) < 2 * 1.5 * side:
                # Unscaled; torch's uint8 kernel rounds its passes its own way.
                assert d.max() <= 1 and d.mean() <= 0.5, what
            else:
                assert d.mean() <= MEAN_TOL and d.max() <= MAX_TOL, what


@needs_jpeg
def test_center_crop_of_tiny_images_reads_the_neighbours(tmp_path):
    """CenterCrop stays Resize-then-CenterCrop: the crop's edge pixels were
    interpolated from the pixels next to them."""
    paths = tiny_jpegs(tmp_path)
    cc = CenterCrop(12, resize=14)
    ds = ImageFiles(paths, list(range(len(paths))), crop=cc, flip=0, output="uint8")
    images, _ = ds.gather_batch(np.arange(len(ds)), np.empty)
    for path, img in zip(paths, images):
        want = torchvision_center_crop(Image.open(path).convert("RGB"), cc)
        assert levels(img, want).mean() <= 0.5, path


# --------------------------------------------------------------------------
# Corrupt-data warnings are errors; metadata warnings are not

@needs_jpeg
def test_bytes_after_the_scan_are_an_error_pillow_ignores(files, tmp_path):
    """Sixteen stray bytes before the end-of-image marker: libjpeg warns
    ("extraneous bytes before marker 0xd9"; the few its bit buffer read ahead
    are not counted), Pillow decodes; the loader refuses, naming the file and
    libjpeg's message, for every crop, and on_error="skip" replaces and
    counts it."""
    good = files["rgb420"]
    bad = good[:-2] + bytes(range(1, 17)) + b"\xff\xd9"
    assert pillow_rgb(bad).size == (410, 310)
    dec = _jpeg.Decoder()
    for box in [(0, 0, 10, 10), (300, 400, 10, 10), (0, 0, 310, 410)]:
        with pytest.raises(_jpeg.ImageError,
                           match=r"corrupt JPEG data: \d+ extraneous bytes before marker 0xd9"):
            dec.decode_into(bad, box, np.empty((3, 8, 8), np.uint8))
    paths = [str(tmp_path / "bad.jpg"), str(tmp_path / "good.jpg")]
    for path, data in zip(paths, [bad, good]):
        with open(path, "wb") as f:
            f.write(data)
    with pytest.raises(ImageFileError, match="extraneous bytes") as e:
        ImageFiles(paths, [0, 1], crop=CenterCrop(16))[0]
    assert paths[0] in str(e.value)
    ds = ImageFiles(paths, [0, 1], crop=CenterCrop(16), flip=0, on_error="skip",
                    output="uint8")
    with DataLoader(ds, batch_size=2, shuffle=False, num_workers=0) as dl:
        (x, y), = [(np.array(a), np.array(b)) for a, b in dl]
        assert y.tolist() == [1, 1] and dl.stats.skipped == 1
        np.testing.assert_array_equal(x[0], x[1])


@needs_jpeg
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stray_marker_in_the_scan_is_skipped_and_counted(tmp_path, num_workers):
    """The issue's file: FF C0 written into the entropy-coded data, below
    every crop of the batch. on_error="raise" names it; "skip" replaces it by
    the next file and counts it, the same for every num_workers."""
    rng = np.random.default_rng(3)
    paths = []
    for k in range(4):
        data = encode_jpeg(photo_region(rng, (160, 120)), quality=90)
        if k == 1:
            b = bytearray(data)
            b[len(b) - 40:len(b) - 38] = b"\xff\xc0"   # in the scan's last rows
            data = bytes(b)
        paths.append(str(tmp_path / f"{k}.jpg"))
        with open(paths[-1], "wb") as f:
            f.write(data)
    top = RandomResizedCrop(16, scale=(0.02, 0.05))
    ds = ImageFiles(paths, [0, 1, 2, 3], crop=top, output="uint8")
    with DataLoader(ds, batch_size=4, shuffle=False, num_workers=num_workers) as dl:
        with pytest.raises(ImageFileError, match="corrupt JPEG data") as e:
            list(dl)
        assert paths[1] in str(e.value)
    ds = ImageFiles(paths, [0, 1, 2, 3], crop=top, output="uint8", on_error="skip")
    with DataLoader(ds, batch_size=4, sampler=[0, 1, 2, 3, 1, 1], num_workers=num_workers,
                    seed=5) as dl:
        labels = np.concatenate([np.array(y) for _, y in dl])
        assert labels.tolist() == [0, 2, 2, 3, 2, 2] and dl.stats.skipped == 3


@needs_jpeg
def test_metadata_warnings_leave_the_image_as_pillow_decodes_it(files):
    """An unknown JFIF revision and an unknown Adobe colour transform code are
    warnings about metadata, not damage: the image decodes, equal to Pillow's."""
    jfif = bytearray(files["rgb444_odd"])
    at = jfif.find(b"JFIF\x00")
    jfif[at + 5] = 2                      # JFIF major version 2
    adobe = bytearray(files["cmyk"])
    at = adobe.find(b"Adobe")
    adobe[at + 11] = 7                    # transform code 7 (0, 1, 2 are defined)
    for data in (bytes(jfif), bytes(adobe)):
        pil = pillow_rgb(data)
        W, H = pil.size
        got, _ = decode(data, (0, 0, H, W), (H, W))
        np.testing.assert_array_equal(got, np.asarray(pil).transpose(2, 0, 1))
