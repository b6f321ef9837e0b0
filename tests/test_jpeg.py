"""netcl_loader._jpeg (region JPEG decoder) and _image.resize_into against Pillow.

The reference is what torchvision does on PIL images: Pillow decodes the whole
file, converts it to RGB and resizes the box with BILINEAR (antialiased when
shrinking), then the flip and ToTensor/Normalize. Our decoder must agree
within a mean absolute difference of 2 levels of 255 (and a bound on the
largest one); unscaled decodes use Pillow's own arithmetic and agree exactly
where Pillow resizes horizontally first. Test images are cut from the real
photos scikit-learn ships and re-encoded with Pillow.
"""
import io
import threading
import zlib

import numpy as np
import pytest

from images_util import encode_jpeg, photo_region, sample_photo

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from netcl_loader import _image  # noqa: E402

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
        if box[2] / 2 >= 1.25 * out_hw[0] and box[3] / 2 >= 1.25 * out_hw[1]:
            out_hw = (int(box[2] / 2.5) + 1, out_hw[1])  # keep it unscaled
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
    ("big", (857 - 600, 1283 - 900, 600, 900), (224, 224), 2),   # bottom-right corner
    ("big", (0, 0, 500, 500), (31, 29), 8),                      # top-left corner
    ("big_progressive", (20, 30, 800, 1200), (224, 224), 2),
    ("big_progressive", (0, 283, 857, 1000), (64, 64), 8),
    ("rgb420", (0, 0, 310, 410), (50, 70), 4),
    ("grey", (0, 0, 311, 413), (37, 51), 4),
    ("cmyk", (10, 12, 300, 400), (70, 90), 2),
    ("progressive", (0, 0, 310, 410), (31, 41), 8),
])
def test_scaled_decode_close_to_pillow(files, name, box, out_hw, denom):
    data = files[name]
    pil = pillow_rgb(data)
    for flip in (False, True):
        got, used = decode(data, box, out_hw, flip=flip)
        assert used == denom
        assert_close(got, reference_u8(pil, box, out_hw, flip), f"{name} {box} -> {out_hw}")


def test_scale_choice_keeps_the_box_at_least_1_25x_the_output(files):
    data = files["big"]
    for out_side, denom in [(600, 1), (343, 1), (342, 2), (172, 2), (171, 4), (86, 4),
                            (85, 8), (10, 8)]:
        # box height 857: denom d is used when 857 / d >= 1.25 * out (width is larger)
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
