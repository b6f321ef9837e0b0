"""The JPEG decoder fuzzed: mutated files and extreme geometry, a fixed budget.

A deterministic mutation fuzzer (the seed is fixed, so a run is reproducible)
takes several real JPEGs (baseline 4:2:0, 4:4:4 with restart markers,
progressive, grey, CMYK, odd sizes) and feeds ``Decoder.info`` and
``Decoder.decode_into`` thousands of variants: truncations, bit flips, byte
insertions and deletions, random markers, forged frame sizes, spliced
segments. Every input must either decode or raise ImageError; the output
array's neighbours must stay untouched, and a decode into a sub-rectangle of a
padded array (row and plane strides larger than the output's, as for a
letterboxed detection image) must give the same pixels and leave the padding
untouched. ``.ci/asan`` runs this file with
AddressSanitizer and UndefinedBehaviorSanitizer, which turn any read or
write outside a buffer (in our C or in libjpeg) into a failure.

The differential fuzz runs hundreds of mutated baseline and progressive JPEGs
through Pillow (the reference: torchvision's loader) and through the
datasets: every file Pillow refuses is refused with an ImageFileError naming
it, whatever the crop; every file both decode agrees; the one listed
difference is a file libjpeg decodes with a warning that its data is corrupt,
which Pillow passes on as an image and the loader refuses.

The resize kernel is fuzzed on geometry: boxes of every shape (1-pixel
strips, boxes at the edges, beyond them by the rounding tolerance, fractional
ones) to output sizes from 1 to several times the box, into contiguous and
padded outputs.
"""
import collections
import io
import os
import re
import shutil
import struct
import subprocess
import warnings

import numpy as np
import pytest

from images_util import encode_jpeg, photo_region

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from netcl_loader import _image  # noqa: E402
from netcl_loader.images import ImageFileError, ImageFiles, RandomResizedCrop  # noqa: E402

try:
    from netcl_loader import _jpeg
except ImportError:  # built without libjpeg: the resize fuzz still runs
    _jpeg = None

needs_jpeg = pytest.mark.skipif(
    _jpeg is None, reason="the JPEG decoder was not built (libjpeg headers missing)")

#: Mutated inputs per seed file (times 7 seed files): a fixed budget of
#: about 2,800 inputs, each through info() and two decodes.
MUTANTS_PER_SEED = 400

MARKERS = [0xC0, 0xC1, 0xC2, 0xC4, 0xC8, 0xCC, 0xD0, 0xD7, 0xD8, 0xD9, 0xDA, 0xDB, 0xDD,
           0xE0, 0xE1, 0xEE, 0xFE, 0x01, 0xFF, 0x00]


def seed_files():
    rng = np.random.default_rng(2026)
    small = photo_region(rng, (61, 47))
    mid = photo_region(rng, (130, 97))
    return [
        encode_jpeg(small, quality=90),
        encode_jpeg(mid, quality=92, subsampling=0, restart_marker_blocks=3),
        encode_jpeg(mid, quality=88, progressive=True),
        encode_jpeg(small, quality=93, mode="L"),
        encode_jpeg(small, quality=95, mode="CMYK", progressive=True),
        encode_jpeg(photo_region(rng, (17, 33)), quality=91, subsampling=1),
        encode_jpeg(photo_region(rng, (200, 150)), quality=89),
    ]


def frame_offsets(data):
    """Offsets of the height field of every SOFn segment."""
    out = []
    i = data.find(b"\xff\xc0")
    for marker in (b"\xff\xc0", b"\xff\xc1", b"\xff\xc2"):
        i = data.find(marker)
        while i != -1:
            out.append(i + 5)
            i = data.find(marker, i + 2)
    return out


def mutate(data, rng):
    """One mutant of ``data``: one to three random edits."""
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(9))
        n = len(b)
        if n < 4:
            break
        pos = int(rng.integers(2, n))
        if kind == 0:  # truncate
            del b[pos:]
        elif kind == 1:  # flip bits
            for p in rng.integers(0, n, size=int(rng.integers(1, 9))):
                b[int(p)] ^= 1 << int(rng.integers(8))
        elif kind == 2:  # insert random bytes
            b[pos:pos] = rng.integers(0, 256, size=int(rng.integers(1, 17)), dtype=np.uint8).tobytes()
        elif kind == 3:  # delete bytes
            del b[pos:pos + int(rng.integers(1, 33))]
        elif kind == 4:  # insert a marker, maybe with a bogus length
            m = MARKERS[int(rng.integers(len(MARKERS)))]
            seg = bytes([0xFF, m]) + struct.pack(">H", int(rng.integers(0, 65536)))
            b[pos:pos] = seg[:int(rng.integers(2, 5))]
        elif kind == 5:  # overwrite a byte after an 0xFF (change a marker's type)
            ffs = [i for i in range(n - 1) if b[i] == 0xFF]
            if ffs:
                b[ffs[int(rng.integers(len(ffs)))] + 1] = MARKERS[int(rng.integers(len(MARKERS)))]
        elif kind == 6:  # forge the frame size (huge, zero, or off by a little)
            for off in frame_offsets(bytes(b)):
                if off + 4 <= n:
                    choice = int(rng.integers(4))
                    value = [0, 1, 65535, int(rng.integers(0, 65536))][choice]
                    field = off + 2 * int(rng.integers(2))
                    b[field:field + 2] = struct.pack(">H", value)
        elif kind == 7:  # splice: repeat a chunk of the file elsewhere
            a = int(rng.integers(0, n))
            chunk = bytes(b[a:a + int(rng.integers(1, 200))])
            b[pos:pos] = chunk
        else:  # overwrite a run with one value (0x00 or 0xFF runs are JPEG's edge cases)
            run = int(rng.integers(1, 64))
            b[pos:pos + run] = bytes([int(rng.choice([0, 0xFF, int(rng.integers(256))]))]) * min(
                run, n - pos)
    return bytes(b)


def padded(rng, out_h, out_w, dtype, fill):
    """A (3, out_h, out_w) view ``a[:, y0:y0+out_h, x0:x0+out_w]`` of a larger
    C-contiguous array ``a`` filled with ``fill`` (up to 7 rows and columns of
    padding, sometimes none, sometimes mirrored rows: negative strides), and
    the mask of ``a``'s padding.  The decoder must write the view and nothing
    else, as it does for a letterboxed image."""
    ph, pw = int(rng.integers(0, 8)), int(rng.integers(0, 8))
    y0, x0 = int(rng.integers(0, ph + 1)), int(rng.integers(0, pw + 1))
    a = np.full((3, out_h + ph, out_w + pw), fill, dtype=dtype)
    view = a[:, y0:y0 + out_h, x0:x0 + out_w]
    if rng.integers(4) == 0:
        view = view[:, ::-1]
    pad = np.ones(a.shape, bool)
    pad[:, y0:y0 + out_h, x0:x0 + out_w] = False
    return a, view, pad


def run_one(dec, data, rng, orientation=1):
    """info + two decodes of ``data`` (turned by the EXIF ``orientation``, the boxes in
    the displayed image); returns 'ok', 'error' (ImageError) or raises."""
    assert 1 <= _jpeg.exif_orientation(data) <= 8
    try:
        width, height = dec.info(data)
    except _jpeg.ImageError as exc:
        assert str(exc)
        return "error"
    if orientation >= 5:
        width, height = height, width
    outcome = "ok"
    boxes = [(0.0, 0.0, float(height), float(width))]
    if height > 0 and width > 0:
        h = rng.uniform(0.05, 1.0) * height
        w = rng.uniform(0.05, 1.0) * width
        boxes.append((rng.uniform(0, height - h), rng.uniform(0, width - w), h, w))
    for box in boxes:
        out_h, out_w = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        dtype = np.float32 if rng.integers(2) else np.uint8
        guard = np.full((5, out_h, out_w), 7, dtype=dtype)
        try:
            flip = bool(rng.integers(2))
            dec.decode_into(data, box, guard[1:4], flip=flip, orientation=orientation)
        except _jpeg.ImageError as exc:
            assert str(exc)
            outcome = "error"
        except ValueError as exc:
            # A frame of 0 rows or columns has no box inside it.
            assert "outside" in str(exc) and (width == 0 or height == 0), (exc, width, height)
            outcome = "error"
        assert (guard[0] == 7).all() and (guard[4] == 7).all()
        if outcome == "ok":
            # The same decode into a sub-rectangle of a padded array: the same
            # pixels, the padding untouched.
            a, view, pad = padded(rng, out_h, out_w, dtype, 7)
            dec.decode_into(data, box, view, flip=flip, orientation=orientation)
            assert (a[pad] == 7).all()
            np.testing.assert_array_equal(view, guard[1:4])
    return outcome


@needs_jpeg
def test_mutated_jpegs_decode_or_raise_image_error():
    rng = np.random.default_rng(18)
    dec = _jpeg.Decoder()
    counts = {"ok": 0, "error": 0}
    for seed in seed_files():
        assert run_one(dec, seed, rng) == "ok"
        for k in range(MUTANTS_PER_SEED):
            counts[run_one(dec, mutate(seed, rng), rng, orientation=1 + k % 8)] += 1
        # After all that, the same decoder still decodes the seed exactly.
        width, height = dec.info(seed)
        a = np.empty((3, 13, 17), np.uint8)
        b = np.empty((3, 13, 17), np.uint8)
        dec.decode_into(seed, (0, 0, height, width), a)
        _jpeg.Decoder().decode_into(seed, (0, 0, height, width), b)
        np.testing.assert_array_equal(a, b)
    # Both outcomes are exercised (the fuzzer is not stuck on one path); most
    # mutants are refused, since libjpeg's corrupt-data warnings are errors.
    assert counts["ok"] > 100 and counts["error"] > 1000, counts


@needs_jpeg
def test_forged_huge_progressive_frame_is_refused_quickly():
    """A progressive file claiming 65500 x 65500 pixels would need ~12 GB of
    coefficient buffers: refused by the decoder's memory cap, not allocated."""
    data = encode_jpeg(photo_region(np.random.default_rng(0), (64, 48)), progressive=True)
    b = bytearray(data)
    for off in frame_offsets(data):
        b[off:off + 4] = struct.pack(">HH", 65500, 65500)
    dec = _jpeg.Decoder()
    assert dec.info(bytes(b)) == (65500, 65500)
    with pytest.raises(_jpeg.ImageError, match="too large|memory|truncated|corrupt"):
        dec.decode_into(bytes(b), (0, 0, 65500, 65500), np.empty((3, 8, 8), np.uint8))


def test_resize_geometry_fuzz():
    """Every box shape and output size, fractional and at the edges, any strides."""
    rng = np.random.default_rng(5)
    base = photo_region(rng, (97, 61))
    sources = [base, base[::-1], base[:, ::-3], np.ascontiguousarray(base[:1]),
               np.ascontiguousarray(base[:, :1]), np.ascontiguousarray(base[:1, :1])]
    for trial in range(600):
        src = sources[trial % len(sources)]
        H, W = src.shape[:2]
        kind = trial % 5
        if kind == 0:    # 1-pixel strips
            box = (float(rng.integers(H)), 0.0, 1.0, float(W))
        elif kind == 1:  # beyond the edges by up to the tolerance
            box = (-0.009, -0.009, H + 0.018, W + 0.018)
        elif kind == 2:  # tiny fractional boxes
            h, w = rng.uniform(1e-3, 1.0), rng.uniform(1e-3, 1.0)
            box = (rng.uniform(0, H - h), rng.uniform(0, W - w), h, w)
        else:
            h, w = rng.uniform(0.01, H), rng.uniform(0.01, W)
            box = (rng.uniform(0, H - h), rng.uniform(0, W - w), h, w)
        out_h = int(rng.integers(1, 3 * H + 3))
        out_w = int(rng.integers(1, 3 * W + 3))
        dtype = np.float32 if trial % 2 else np.uint8
        guard = np.full((5, out_h, out_w), 9, dtype=dtype)
        _image.resize_into(src, box, guard[1:4], flip=bool(trial % 3))
        assert (guard[0] == 9).all() and (guard[4] == 9).all()
        if dtype == np.float32:
            assert np.isfinite(guard[1:4]).all()
            assert guard[1:4].min() >= 0 and guard[1:4].max() <= 1
        # Into a sub-rectangle of a padded array: the same values, nothing else written.
        a, view, pad = padded(rng, out_h, out_w, dtype, 9)
        _image.resize_into(src, box, view, flip=bool(trial % 3))
        assert (a[pad] == 9).all()
        np.testing.assert_array_equal(view, guard[1:4])


@needs_jpeg
def test_decode_geometry_fuzz():
    """Valid files, every box shape and output size (scaled and unscaled)."""
    rng = np.random.default_rng(9)
    files = seed_files()
    dec = _jpeg.Decoder()
    for trial in range(300):
        data = files[trial % len(files)]
        W, H = dec.info(data)
        orientation = 1 + trial % 8   # the box in the image as displayed
        if orientation >= 5:
            W, H = H, W
        kind = trial % 4
        if kind == 0:
            box = (float(rng.integers(H)), 0.0, 1.0, float(W))
        elif kind == 1:
            box = (-0.009, -0.009, H + 0.018, W + 0.018)
        else:
            h, w = rng.uniform(0.01, H), rng.uniform(0.01, W)
            box = (rng.uniform(0, H - h), rng.uniform(0, W - w), h, w)
        out_h = int(rng.integers(1, 2 * H + 2))
        out_w = int(rng.integers(1, 2 * W + 2))
        guard = np.full((5, out_h, out_w), 3, dtype=np.uint8)
        denom = dec.decode_into(data, box, guard[1:4], flip=bool(trial % 2),
                                orientation=orientation)
        assert denom in (1, 2, 4, 8)
        assert (guard[0] == 3).all() and (guard[4] == 3).all()
        dtype = np.float32 if trial % 3 == 0 else np.uint8
        a, view, pad = padded(rng, out_h, out_w, dtype, 3)
        assert dec.decode_into(data, box, view, flip=bool(trial % 2),
                               orientation=orientation) == denom
        assert (a[pad] == 3).all()
        if dtype == np.uint8:
            np.testing.assert_array_equal(view, guard[1:4])
        else:
            np.testing.assert_array_equal(view, guard[1:4] / np.float32(255))


# --------------------------------------------------------------------------
# Differential fuzz against Pillow

#: Mutants per seed file of the differential fuzz (5 seeds: 3 baseline, 2
#: progressive), a third of them with a marker written into the scan.
DIFF_MUTANTS_PER_SEED = 120

#: The difference from Pillow that the loader keeps, and why. libjpeg reports
#: some damage only as a warning (emit_message at level -1) and decodes on,
#: inventing what it could not read (grey or shifted blocks after a stray
#: marker, a missing restart marker or cut data; garbage after bad Huffman
#: codes; a file that ends before its end-of-image marker). Pillow ignores
#: those warnings and returns the image (a file cut short only where its
#: scans were complete included); the loader refuses it, as a strict
#: libjpeg-turbo decode does (simplejpeg with strict=True), because such an
#: image is not what the file held.
STRICTER_THAN_PILLOW = re.compile(
    r"(corrupt JPEG data: (premature end of data segment|bad Huffman code|bad arithmetic code"
    r"|\d+ extraneous bytes before marker 0x[0-9a-f]{2}"
    r"|found marker 0x[0-9a-f]{2} instead of RST\d|Invalid SOS parameters for sequential JPEG"
    r"|Inconsistent progression sequence for component \d+ coefficient \d+)"
    r"|truncated JPEG data \(Premature end of JPEG file\))"
    # The fix the error names (on_error="skip"), after the reason.
    r"(; to replace unreadable files with the next readable one, .*)?$")

#: Where both decode, the agreement asked (levels of 255): as everywhere.
DIFF_MEAN_TOL = 2.0
DIFF_MAX_TOL = 40


def differential_seeds():
    rng = np.random.default_rng(21)
    return {
        "baseline420": encode_jpeg(photo_region(rng, (96, 72)), quality=90),
        "baseline444_restarts": encode_jpeg(photo_region(rng, (80, 64)), quality=92,
                                            subsampling=0, restart_marker_blocks=2),
        "baseline422": encode_jpeg(photo_region(rng, (88, 56)), quality=89, subsampling=1),
        "progressive420": encode_jpeg(photo_region(rng, (96, 72)), quality=90, progressive=True),
        "progressive444": encode_jpeg(photo_region(rng, (72, 80)), quality=93, subsampling=0,
                                      progressive=True),
    }


def scan_start(data):
    """Offset of the first byte of entropy-coded data (after the first SOS segment)."""
    i = data.find(b"\xff\xda")
    return i + 2 + ((data[i + 2] << 8) | data[i + 3])


def with_marker_in_scan(data, pos, marker=0xC0):
    """``data`` with the two bytes at ``pos`` (inside a scan) replaced by FF ``marker``."""
    b = bytearray(data)
    b[pos:pos + 2] = bytes([0xFF, marker])
    return bytes(b)


def mutate_scan(data, rng):
    """A marker written over two bytes of the first scan's entropy-coded data."""
    start = scan_start(data)
    pos = int(rng.integers(start, len(data) - 2))
    return with_marker_in_scan(data, pos, MARKERS[int(rng.integers(len(MARKERS)))])


def pillow_decode(data):
    """torchvision's loader: Image.open, load, convert("RGB"); (array, None) or
    (None, why Pillow refused)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # DecompressionBombWarning for forged sizes
            with Image.open(io.BytesIO(data)) as img:
                img.load()
                return np.asarray(img.convert("RGB")), None
    except Exception as exc:  # noqa: BLE001 - Pillow fails in many ways on damaged files
        return None, f"{type(exc).__name__}: {exc}"


def whole_image(height, width):
    """A crop whose box is the whole image (scale 1, any ratio), resized to (height, width)."""
    return RandomResizedCrop((height, width), scale=(1, 1), ratio=(1e-3, 1e3))


@needs_jpeg
def test_differential_fuzz_against_pillow(tmp_path, capsys):
    """Mutated baseline and progressive JPEGs through Pillow and through ImageFiles.

    - Pillow refuses: refused here too, an ImageFileError naming the file,
      with the whole image and with a small DCT-scaled crop alike.
    - Both decode: within the tolerance (the same libjpeg arithmetic: equal).
    - Pillow decodes, refused here: only with one of libjpeg's corrupt-data
      warnings (STRICTER_THAN_PILLOW), and a strict libjpeg-turbo decode
      (simplejpeg, where installed) refuses the same file.
    """
    try:
        import simplejpeg
    except ImportError:
        simplejpeg = None
    rng = np.random.default_rng(2027)
    np.random.seed(2027)   # the crop's draws outside a loader (NumPy's global RNG)
    seeds = differential_seeds()
    dec = _jpeg.Decoder()
    counts = collections.Counter()
    reasons = collections.Counter()
    worst = 0.0
    for name, seed in seeds.items():
        width, height = Image.open(io.BytesIO(seed)).size
        paths, mutants = [], []
        for k in range(DIFF_MUTANTS_PER_SEED):
            data = mutate_scan(seed, rng) if k % 3 == 0 else mutate(seed, rng)
            path = str(tmp_path / f"{name}-{k:03d}.jpg")
            with open(path, "wb") as f:
                f.write(data)
            paths.append(path)
            mutants.append(data)
        ds = ImageFiles(paths, [0] * len(paths), crop=whole_image(height, width), flip=0,
                        output="uint8")
        for i, (path, data) in enumerate(zip(paths, mutants)):
            counts["files"] += 1
            ref, why = pillow_decode(data)
            try:
                got, error = ds[i][0], None
            except ImageFileError as exc:
                got, error = None, str(exc)
                assert error.startswith(path + ": "), error
            if ref is None:
                counts["refused by Pillow"] += 1
                assert error is not None, f"{path}: Pillow refuses it ({why}), decoded here"
                counts["refused here"] += 1
                if _jpeg.is_jpeg(data):
                    # Refused whatever the crop: a corner of it, DCT-scaled.
                    with pytest.raises(_jpeg.ImageError):
                        w, h = dec.info(data)
                        dec.decode_into(data, (0, 0, max(1, h // 3), max(1, w // 3)),
                                        np.empty((3, 2, 2), np.uint8), crop_first=True)
                continue
            if error is not None:
                counts["refused here"] += 1
                counts["decoded by Pillow, refused here"] += 1
                reason = error[len(path) + 2:]
                assert STRICTER_THAN_PILLOW.match(reason), (
                    f"{path}: Pillow decodes it, refused here for a reason not listed: {reason}")
                reasons[re.sub(r"0x[0-9a-f]{2}|\d+", "N", reason)] += 1
                if simplejpeg is not None:
                    with pytest.raises(ValueError):
                        simplejpeg.decode_jpeg(data, strict=True)
                continue
            counts["decoded by both"] += 1
            pil = Image.fromarray(ref)
            if pil.size != (width, height):   # a forged frame size: both resize it alike
                pil = pil.resize((width, height), Image.BILINEAR)
            d = np.abs(got.astype(np.int64) - np.asarray(pil).transpose(2, 0, 1))
            assert d.mean() <= DIFF_MEAN_TOL and d.max() <= DIFF_MAX_TOL, (path, d.mean())
            worst = max(worst, float(d.mean()))
            # A scaled crop of a file decoded whole decodes too.
            w, h = dec.info(data)
            dec.decode_into(data, (0, 0, max(1, h // 3), max(1, w // 3)),
                            np.empty((3, 2, 2), np.uint8), crop_first=True)
    with capsys.disabled():
        print(f"\ndifferential fuzz: {dict(counts)}, worst mean difference where both decode "
              f"{worst:.3f} levels; refused here, decoded by Pillow: {dict(reasons)}")
    # Each outcome is reached (the mutants are not all of one kind).
    assert counts["refused by Pillow"] > 100 and counts["decoded by both"] > 10, counts
    assert counts["decoded by Pillow, refused here"] > 10, counts


@needs_jpeg
@pytest.mark.parametrize("progressive", [False, True])
def test_a_marker_written_into_the_scan_is_refused_for_every_crop(tmp_path, progressive):
    """FF C0 in the entropy-coded data (near its start, middle or end): Pillow
    says "broken data stream"; here an ImageFileError naming the file and
    libjpeg's reason, for crops above and below the marker, scaled or not."""
    data = encode_jpeg(photo_region(np.random.default_rng(4), (200, 150)), quality=90,
                       progressive=progressive)
    start, end = scan_start(data), data.rfind(b"\xff\xd9")
    dec = _jpeg.Decoder()
    boxes = [(0, 0, 20, 30), (130, 170, 20, 30), (0, 0, 150, 200), (60, 0, 30, 200)]
    for frac in (0.05, 0.5, 0.95):
        bad = with_marker_in_scan(data, start + int((end - start) * frac))
        assert pillow_decode(bad)[0] is None
        path = str(tmp_path / f"bad{frac}.jpg")
        with open(path, "wb") as f:
            f.write(bad)
        for box in boxes:
            for out_hw in [(8, 8), (64, 64)]:
                with pytest.raises(_jpeg.ImageError, match="corrupt JPEG data"):
                    dec.decode_into(bad, box, np.empty((3,) + out_hw, np.uint8))
        ds = ImageFiles([path], [0], crop=RandomResizedCrop(16, scale=(0.01, 0.02)))
        for _ in range(5):   # small boxes anywhere
            with pytest.raises(ImageFileError, match=r"corrupt JPEG data: .+") as e:
                ds[0]
            assert path in str(e.value)


@needs_jpeg
@pytest.mark.skipif(shutil.which("jpegtran") is None,
                    reason="jpegtran (libjpeg-turbo's tools) makes the arithmetic-coded files")
def test_arithmetic_coded_jpegs_decode_as_pillow_decodes_them():
    """libjpeg-turbo decodes arithmetic-coded JPEGs (SOF9, SOF10) and so do the
    loader and Pillow (its own libjpeg-turbo): the rule is the library's, the
    same pixels as the Huffman-coded original; damaged ones are refused where
    Pillow refuses them, or libjpeg warns (a bad arithmetic code)."""
    rng = np.random.default_rng(6)
    original = encode_jpeg(photo_region(rng, (96, 72)), quality=90)
    want = np.asarray(Image.open(io.BytesIO(original)).convert("RGB")).transpose(2, 0, 1)
    dec = _jpeg.Decoder()
    for opts in (["-arithmetic"], ["-arithmetic", "-progressive"]):
        arith = subprocess.run(["jpegtran"] + opts, input=original, capture_output=True,
                               check=True).stdout
        assert (b"\xff\xca" if "-progressive" in opts else b"\xff\xc9") in arith
        ref, why = pillow_decode(arith)
        assert why is None
        got = np.empty((3, 72, 96), np.uint8)
        dec.decode_into(arith, (0, 0, 72, 96), got)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, ref.transpose(2, 0, 1))
        for _ in range(60):
            bad = mutate_scan(arith, rng) if rng.integers(2) else mutate(arith, rng)
            ref, why = pillow_decode(bad)
            try:
                w, h = dec.info(bad)
                dec.decode_into(bad, (0, 0, h, w), np.empty((3, 72, 96), np.uint8))
                error = None
            except _jpeg.ImageError as exc:
                error = str(exc)
            if ref is None:
                assert error is not None, why
            elif error is not None:
                assert STRICTER_THAN_PILLOW.match(error), error


# --------------------------------------------------------------------------
# Damaged EXIF segments: the orientation reader against Pillow's

#: Mutants of each EXIF seed (6 seeds): bytes of the APP1 segments only, so the
#: image itself stays whole and decodes.
EXIF_MUTANTS_PER_SEED = 500
#: Pillow's orientation values that exif_transpose turns by (others: as stored).
TURNED = {k: k for k in range(2, 9)}


def with_app1(jpeg, payload):
    """``jpeg`` with an APP1 segment of ``payload`` right after its SOI marker."""
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


def exif_payload(entries, big, extra=b""):
    """"Exif\\0\\0", a TIFF header (either byte order), IFD0 at 8 with ``entries`` (tag,
    type, count, 4-byte field), a next-IFD offset, then ``extra`` (out-of-line values)."""
    e = ">" if big else "<"
    body = (b"MM\x00*" if big else b"II*\x00") + struct.pack(e + "I", 8)
    body += struct.pack(e + "H", len(entries))
    for tag, typ, count, field in entries:
        body += struct.pack(e + "HHI", tag, typ, count) + field
    return b"Exif\x00\x00" + body + struct.pack(e + "I", 0) + extra


def exif_seeds():
    """JPEGs whose EXIF covers the reader's paths: Pillow's own writing, both byte orders,
    out-of-line values before the orientation, rational and float orientations, a count
    of 3, an XMP packet as the fallback."""
    rng = np.random.default_rng(44)
    base = encode_jpeg(photo_region(rng, (24, 16)), quality=90)
    pillow = Image.Exif()
    pillow[0x010F] = "Camera maker"
    pillow[0x0112] = 6
    pillow[0x011A] = 72.0
    buf = io.BytesIO()
    Image.open(io.BytesIO(base)).save(buf, "JPEG", quality=90, exif=pillow)
    seeds = [buf.getvalue()]
    for big in (False, True):
        e = ">" if big else "<"
        # IFD0 (2 + 4 * 12 + 4 bytes) ends at 62: the out-of-line values follow.
        seeds.append(with_app1(base, exif_payload(
            [(0x010F, 2, 12, struct.pack(e + "I", 62)), (0x0112, 3, 1, struct.pack(e + "HH", 8, 0)),
             (0x011A, 5, 1, struct.pack(e + "I", 74)), (0x0131, 2, 4, b"abc\x00")],
            big, b"Maker name\x00\x00" + struct.pack(e + "II", 72, 1))))
        seeds.append(with_app1(base, exif_payload(
            [(0x0112, 5, 1, struct.pack(e + "I", 38)), (0x0112, 3, 3, struct.pack(e + "I", 46))],
            big, struct.pack(e + "II", 15, 3) + struct.pack(e + "HHH", 7, 1, 1))))
    xmp = (b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta xmlns:tiff='t'><rdf:Description "
           b"tiff:Orientation=\"5\"/></x:xmpmeta>")
    seeds.append(with_app1(with_app1(base, xmp), exif_payload(
        [(0x010F, 2, 4, b"abc\x00")], False)))
    return seeds


def app1_spans(data):
    """(start, end) of every APP1 segment's payload before the first scan."""
    spans, i = [], 2
    while i + 4 <= len(data) and data[i] == 0xFF and data[i + 1] not in (0xDA, 0xD9):
        n = (data[i + 2] << 8) | data[i + 3]
        if data[i + 1] == 0xE1:
            spans.append((i + 4, i + 2 + n))
        i += 2 + n
    return spans


def mutate_exif(data, rng):
    """One to three edits inside the APP1 segments: bit flips, bytes set to 0, 0xFF or
    anything, a field of an IFD entry (type, count, offset) rewritten, the payload cut
    short or grown (its length field kept right), the IFD pointer or byte order changed."""
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        spans = app1_spans(bytes(b))
        start, end = spans[int(rng.integers(len(spans)))]
        n = end - start
        kind = int(rng.integers(7))
        if n < 16:
            kind = 5
        if kind == 0:
            for p in rng.integers(start, end, size=int(rng.integers(1, 9))):
                b[int(p)] ^= 1 << int(rng.integers(8))
        elif kind == 1:
            p = int(rng.integers(start, end))
            b[p] = int(rng.choice([0, 0xFF, int(rng.integers(256))]))
        elif kind == 2:   # an IFD0 entry's type, count or value field
            k = int(rng.integers(0, 5))
            field = start + 6 + 10 + 12 * k + int(rng.choice([2, 4, 8]))
            if field + 4 <= end:
                value = int(rng.choice([0, 1, 2, 3, 5, 12, 0xFFFF, 0xFFFFFFFF,
                                        int(rng.integers(0, 2 * n))]))
                width = 2 if (field - start - 16) % 12 == 2 else 4
                b[field:field + width] = value.to_bytes(8, "little")[:width]
        elif kind == 3:   # IFD0's offset
            b[start + 10:start + 14] = int(rng.integers(0, 2 * n)).to_bytes(4, "little")
        elif kind == 4:   # the byte order mark and magic
            b[start + 6:start + 10] = [b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+", b"MM*\x00",
                                       b"II\x00*", b"XX*\x00"][int(rng.integers(7))]
        else:             # cut short or grown; the segment's length follows
            if rng.integers(2) and n > 1:
                cut = int(rng.integers(0, n))
                del b[start + cut:end]
                n = cut
            else:
                extra = rng.integers(0, 256, size=int(rng.integers(1, 40)), dtype=np.uint8)
                b[end:end] = extra.tobytes()
                n += len(extra)
            b[start - 2:start] = struct.pack(">H", n + 2)
    return bytes(b)


def pillow_orientation(data):
    """The orientation ImageOps.exif_transpose turns ``data`` by; 1 where Pillow raises
    on the EXIF (the loader reads such a block as orientation 1)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with Image.open(io.BytesIO(data)) as img:
                return TURNED.get(img.getexif().get(0x0112, 1), 1)
        except Exception:  # noqa: BLE001 - Pillow's EXIF parser fails in many ways
            return 1


@needs_jpeg
def test_damaged_exif_reads_as_pillow_reads_it():
    """Thousands of damaged EXIF segments (the image intact): the reader never fails,
    gives 1-8, and gives Pillow's orientation for every one; each file then decodes
    turned by it, nothing written outside its output."""
    rng = np.random.default_rng(45)
    dec = _jpeg.Decoder()
    seen = collections.Counter()
    wrong = []
    for seed in exif_seeds():
        assert _jpeg.exif_orientation(seed) == pillow_orientation(seed) != 1
        for _ in range(EXIF_MUTANTS_PER_SEED):
            data = mutate_exif(seed, rng)
            got = _jpeg.exif_orientation(data)
            want = pillow_orientation(data)
            seen[got] += 1
            if got != want:
                wrong.append((got, want, data[:200]))
                continue
            width, height = dec.info(data)
            if got >= 5:
                width, height = height, width
            guard = np.full((5, 9, 11), 3, np.uint8)
            dec.decode_into(data, (0, 0, height, width), guard[1:4], orientation=got)
            assert (guard[0] == 3).all() and (guard[4] == 3).all()
    assert not wrong, (len(wrong), wrong[:3])
    # Damage both keeps orientations and loses them (the fuzz is not stuck on one path).
    assert seen[1] > 300 and sum(seen[k] for k in range(2, 9)) > 600, seen
