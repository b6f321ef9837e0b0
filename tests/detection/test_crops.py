"""netcl_loader.images.DetectionFiles and its crops: boxes that follow the fused decode.

Test images are regions of the real photos scikit-learn ships, with boxes
painted in as solid rectangles, each in its own colour (its label is the
colour's index), and encoded as JPEG.  After any crop, resize, padding and
flip, every delivered box must frame its colour in the delivered image, and a
box that was dropped leaves at most a sliver of it (or, under a crop's centre
rule, a part cut by the crop's edge).  Samples taken outside a loader draw
from NumPy's global RNG, so a test replays the crop from the same numbers and
compares pixels with Pillow (decode the whole file, crop the window, resize,
pad, flip) and boxes with torchvision v2's rules written out here.
"""
import json
import os

import numpy as np
import pytest

from images_util import encode_jpeg, encode_oriented_jpeg, photo_region, stored_for_display

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageOps  # noqa: E402

from netcl_loader import DataLoader  # noqa: E402
from netcl_loader.images import (DetectionFiles, ImageFileError, Letterbox,  # noqa: E402
                                 RandomIoUCrop, RandomResizedCrop, SquareCrop)
from netcl_loader.images._boxes import (box_iou, centre_inside, clamp,  # noqa: E402
                                        inside_fraction, to_xyxy)

pytestmark = pytest.mark.filterwarnings("ignore:netcl_loader._jpeg is not built")

#: Solid colours painted into the photos, one per label.
PALETTE = np.array([(20, 200, 20), (20, 20, 230), (220, 20, 220), (20, 220, 220)], np.uint8)
#: A pixel "has" a colour when no channel is further from it than this (JPEG, resize).
COLOUR_LEVELS = 60
#: The agreement asked with Pillow + torchvision's recipe (levels of 255), as for
#: classification: mean absolute difference, and a bound on the largest one.
MEAN_ABS_LEVELS = 2.0
MAX_LEVELS = 40
IMAGENET_MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
#: Image sizes (width, height) of the painted set: landscape, portrait, square.
SIZES = [(360, 270), (300, 400), (420, 300), (256, 256), (330, 250), (280, 380)]


def paint(rng, width, height, count):
    """``count`` non-overlapping integer boxes (XYXY) at least 10 px apart, 36-140 px a side."""
    boxes = []
    for _ in range(200):
        if len(boxes) == count:
            break
        w, h = int(rng.integers(36, 141)), int(rng.integers(36, 141))
        if w >= width or h >= height:
            continue
        x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
        b = (x, y, x + w, y + h)
        if all(b[0] >= o[2] + 10 or o[0] >= b[2] + 10 or b[1] >= o[3] + 10 or o[1] >= b[3] + 10
               for o in boxes):
            boxes.append(b)
    return np.array(boxes, np.float64).reshape(-1, 4)


@pytest.fixture(scope="module")
def painted(tmp_path_factory):
    """12 painted JPEGs (0 to 4 boxes each; two without any): (paths, boxes, labels)."""
    root = tmp_path_factory.mktemp("painted")
    rng = np.random.default_rng(24)
    paths, boxes, labels = [], [], []
    for k in range(12):
        width, height = SIZES[k % len(SIZES)]
        img = np.array(photo_region(rng, (width, height)))
        b = paint(rng, width, height, 0 if k in (3, 8) else int(rng.integers(1, 6)))
        # Colours the photo itself nearly has (red lanterns, pink petals) are not used.
        free = [c for c in rng.permutation(len(PALETTE)) if not has_colour(
            img.transpose(2, 0, 1), PALETTE[c], COLOUR_LEVELS + 20).any()]
        b = b[:len(free)]
        lab = np.array(free[:len(b)], np.int64)
        for (x1, y1, x2, y2), c in zip(b.astype(int), lab):
            img[y1:y2, x1:x2] = PALETTE[c]
        path = os.path.join(root, f"img{k:02d}.jpg")
        with open(path, "wb") as f:
            f.write(encode_jpeg(img, quality=95, subsampling=0))
        paths.append(path)
        boxes.append(b)
        labels.append(lab)
    return paths, boxes, labels


def pillow_rgb(path):
    with Image.open(path) as img:
        return img.convert("RGB")


def replay(ds, i, seed):
    """Sample ``i`` drawn after ``np.random.seed(seed)``, and the crop replayed from the
    same numbers: (image, target, window, place, keep, flip, given boxes clamped)."""
    np.random.seed(seed)
    u = np.random.random((1, ds.crop.draws + 1))[0]
    np.random.seed(seed)
    image, target = ds[i]
    width, height = pillow_rgb(ds.path(i)).size
    given, _ = ds.boxes_of(i)
    given = clamp(given, height, width)
    window, place, keep = ds.crop.detect(height, width, given, u[:-1], *ds.size)
    return image, target, window, place, keep, bool(u[-1] < ds.flip), given


def reference_boxes(given, window, place, out_w, flip, keep, min_size=1.0, min_area=1.0):
    """torchvision v2's rules written out: crop (subtract, clamp), resize, pad, flip,
    then the crop's centre rule and SanitizeBoundingBoxes; (boxes, kept indices)."""
    top, left, h, w = window
    y0, x0, ph, pw = place
    b = given.astype(np.float64).copy()
    b[:, 0::2] = np.clip(b[:, 0::2] - left, 0, w) * (pw / w) + x0
    b[:, 1::2] = np.clip(b[:, 1::2] - top, 0, h) * (ph / h) + y0
    if flip:
        b = np.stack([out_w - b[:, 2], b[:, 1], out_w - b[:, 0], b[:, 3]], axis=1)
    ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    ok = (ws >= min_size) & (hs >= min_size) & (ws * hs >= min_area)
    if keep is not None:
        ok &= keep
    return b[ok], np.flatnonzero(ok)


def reference_pixels(path, window, place, size, flip, fill):
    """Pillow: the whole file decoded, the window cropped out and resized (BILINEAR,
    antialiased), placed on a canvas of the fill colour, flipped: uint8 CHW."""
    top, left, h, w = window
    y0, x0, ph, pw = place
    img = pillow_rgb(path).crop((left, top, left + w, top + h)).resize((pw, ph), Image.BILINEAR)
    canvas = np.empty(size + (3,), np.uint8)
    canvas[:] = np.round(np.asarray(fill) * 255).astype(np.uint8)
    canvas[y0:y0 + ph, x0:x0 + pw] = np.asarray(img)
    if flip:
        canvas = canvas[:, ::-1]
    return canvas.transpose(2, 0, 1)


def has_colour(image_u8, colour, levels=COLOUR_LEVELS):
    """(H, W) mask of the pixels of ``colour`` in a uint8 CHW image."""
    d = np.abs(image_u8.astype(np.int16) - np.asarray(colour, np.int16)[:, None, None])
    return d.max(axis=0) <= levels


def assert_frames(image_u8, box, colour, margin, what):
    """The colour fills ``box`` (inside it, ``margin`` px from its edges) and stops at its
    edges (``margin`` px outside them, where that is inside the image)."""
    mask = has_colour(image_u8, colour)
    out_h, out_w = mask.shape
    x1, y1, x2, y2 = (float(v) for v in box)
    m = margin
    inner = mask[int(np.ceil(y1 + m)):int(np.floor(y2 - m)),
                 int(np.ceil(x1 + m)):int(np.floor(x2 - m))]
    if inner.size:
        assert inner.mean() >= 0.9, (what, box, inner.mean())
    ys = slice(int(np.ceil(y1 + m)), max(int(np.floor(y2 - m)), int(np.ceil(y1 + m)) + 1))
    xs = slice(int(np.ceil(x1 + m)), max(int(np.floor(x2 - m)), int(np.ceil(x1 + m)) + 1))
    # Lines just outside each edge: mostly not the colour (the box is not too small).
    for line in (int(np.floor(x1 - m - 1)), int(np.ceil(x2 + m))):
        if 0 <= line < out_w:
            assert mask[ys, line].mean() < 0.5, (what, box, "x", line)
    for line in (int(np.floor(y1 - m - 1)), int(np.ceil(y2 + m))):
        if 0 <= line < out_h:
            assert mask[line, xs].mean() < 0.5, (what, box, "y", line)
    # Lines just inside each edge: mostly the colour (the box is not too large).
    if x2 - x1 > 2 * m + 2 and y2 - y1 > 2 * m + 2:
        for line in (int(np.ceil(x1 + m)), int(np.floor(x2 - m)) - 1):
            assert mask[ys, line].mean() >= 0.8, (what, box, "x in", line)
        for line in (int(np.ceil(y1 + m)), int(np.floor(y2 - m)) - 1):
            assert mask[line, xs].mean() >= 0.8, (what, box, "y in", line)


def margin_for(window, place):
    """Blur allowance in output pixels: JPEG and the resize smear an edge by about a
    source pixel and an output pixel."""
    scale = max(place[2] / window[2], place[3] / window[3])
    return 1.5 + 1.5 * scale


CROPS = {
    "square": lambda size: SquareCrop(),
    "iou": lambda size: RandomIoUCrop(),
    "letterbox": lambda size: Letterbox(),
    "letterbox_centre": lambda size: Letterbox("center"),
    "resized": lambda size: RandomResizedCrop(size, scale=(0.25, 1.0)),
}


# --------------------------------------------------------------------------
# Painted rectangles, Pillow and torchvision's box rules, sample by sample


@pytest.mark.parametrize("crop", sorted(CROPS))
def test_boxes_frame_their_colour_and_pixels_agree_with_pillow(painted, crop):
    paths, boxes, labels = painted
    size = (160, 160) if crop != "resized" else (144, 176)
    ds = DetectionFiles(paths, boxes, labels, size=size, crop=CROPS[crop](size), flip=0.5,
                        output="uint8")
    seen = dict(kept=0, dropped=0, flipped=0, fallback=0)
    for i in range(len(paths)):
        for seed in range(3):
            image, t, window, place, keep, flip, given = replay(ds, i, 1000 * i + seed)
            assert image.shape == (3,) + size and image.dtype == np.uint8
            assert t["boxes"].dtype == np.float32 and t["labels"].dtype == np.int64
            assert t["image_id"] == i
            want, rows = reference_boxes(given, window, place, size[1], flip, keep)
            np.testing.assert_allclose(t["boxes"], want, atol=1e-3)
            np.testing.assert_array_equal(t["labels"], labels[i][rows])
            ref = reference_pixels(paths[i], window, place, size, flip, IMAGENET_MEAN)
            d = np.abs(image.astype(np.float64) - ref)
            assert d.mean() <= MEAN_ABS_LEVELS and d.max() <= MAX_LEVELS, (crop, i, d.mean())
            m = margin_for(window, place)
            for b, lab in zip(t["boxes"], t["labels"]):
                assert_frames(image, b, PALETTE[lab], m, (crop, i, seed))
            for j in np.setdiff1d(np.arange(len(given)), rows):
                # Dropped: by the centre rule (its centre outside the window), or
                # a sliver once cropped (SanitizeBoundingBoxes).
                if keep is not None and not keep[j]:
                    assert not centre_inside(given[j:j + 1], window)[0]
                    continue
                area = has_colour(image, PALETTE[labels[i][j]]).sum()
                assert area <= (2 * m + 1) * max(size), (crop, i, j, area)
            seen["kept"] += len(rows)
            seen["dropped"] += len(given) - len(rows)
            seen["flipped"] += flip
            seen["fallback"] += place[:2] == (0, 0) and place[2:] != size
    assert seen["kept"] > 20 and seen["flipped"] > 5, seen
    if crop in ("square", "iou", "resized"):
        assert seen["dropped"] > 0, seen


def test_float_output_is_in_0_1_and_the_padding_is_the_mean_colour(painted):
    paths, boxes, labels = painted
    ds = DetectionFiles(paths, boxes, labels, size=128, crop=Letterbox(), flip=0.0)
    u8 = DetectionFiles(paths, boxes, labels, size=128, crop=Letterbox(), flip=0.0,
                        output="uint8")
    for i in (0, 1):
        image, _ = ds[i]
        assert image.dtype == np.float32 and image.min() >= 0.0 and image.max() <= 1.0
        width, height = pillow_rgb(paths[i]).size
        _, (y0, x0, ph, pw), _ = ds.crop.detect(height, width, boxes[i], (), 128, 128)
        pad = np.ones((128, 128), bool)
        pad[y0:y0 + ph, x0:x0 + pw] = False
        assert pad.any()
        # The image: ToTensor of the uint8 output (the same decode); the padding:
        # the colour itself (in uint8, rounded to a level).
        np.testing.assert_array_equal(image[:, ~pad], u8[i][0][:, ~pad] / np.float32(255))
        np.testing.assert_array_equal(u8[i][0][:, pad], np.broadcast_to(
            np.array([124, 116, 104], np.uint8)[:, None], (3, pad.sum())))
        np.testing.assert_array_equal(image[:, pad],
                                      np.broadcast_to(np.float32(IMAGENET_MEAN)[:, None],
                                                      (3, pad.sum())))
    # With mean and std the padding (the mean colour by default) normalises to 0.
    norm = DetectionFiles(paths, boxes, labels, size=128, crop=Letterbox(), flip=0.0,
                          mean=IMAGENET_MEAN, std=STD)
    image, _ = norm[1]
    assert (image[:, pad] == 0).all()
    # A fill of one's own.
    grey = DetectionFiles(paths, boxes, labels, size=128, crop=Letterbox(fill=(0.5, 0.5, 0.5)),
                          output="uint8")
    assert (grey[1][0][:, pad] == 128).all()


@pytest.mark.parametrize("crop", [Letterbox(), SquareCrop()])
def test_the_pillow_path_places_and_pads_as_the_decoder_does(painted, monkeypatch, crop):
    """Every file through Pillow (the fallback decoder, and every non-JPEG): the same
    windows, places and boxes, pixels within the tolerance."""
    from netcl_loader.images import DECODER_ENV
    paths, boxes, labels = painted
    fast = DetectionFiles(paths, boxes, labels, size=100, crop=crop, output="uint8")
    monkeypatch.setenv(DECODER_ENV, "pillow")
    slow = DetectionFiles(paths, boxes, labels, size=100, crop=crop, output="uint8")
    for i in range(0, len(paths), 2):
        np.random.seed(i)
        a, ta = fast[i]
        np.random.seed(i)
        b, tb = slow[i]
        np.testing.assert_array_equal(ta["boxes"], tb["boxes"])
        d = np.abs(a.astype(np.float64) - b)
        assert d.mean() <= MEAN_ABS_LEVELS and d.max() <= MAX_LEVELS, (i, d.mean(), d.max())


def test_letterbox_places_the_image_and_keeps_every_box(painted):
    paths, boxes, labels = painted
    for position in ("top-left", "center"):
        crop = Letterbox(position)
        ds = DetectionFiles(paths, boxes, labels, size=(120, 200), crop=crop, flip=0.0)
        for i in range(len(paths)):
            width, height = pillow_rgb(paths[i]).size
            window, (y0, x0, ph, pw), keep = crop.detect(height, width, boxes[i], (), 120, 200)
            assert window == (0, 0, height, width) and keep is None
            scale = min(120 / height, 200 / width)
            assert (ph, pw) == (round(height * scale), round(width * scale))
            assert 120 in (ph,) or 200 in (pw,)
            if position == "top-left":
                assert (y0, x0) == (0, 0)
            else:
                assert (y0, x0) == ((120 - ph) // 2, (200 - pw) // 2)
            _, t = ds[i]
            assert len(t["boxes"]) == len(boxes[i])


# --------------------------------------------------------------------------
# The crops' own rules (their draws replayed)


def random_boxes(rng, height, width, n):
    x1, y1 = rng.uniform(0, width - 2, n), rng.uniform(0, height - 2, n)
    w, h = rng.uniform(1, width / 3, n), rng.uniform(1, height / 3, n)
    return clamp(np.stack([x1, y1, x1 + w, y1 + h], axis=1), height, width)


def retinaface_crop(height, width, boxes, u, scales=(0.3, 0.45, 0.6, 0.8, 1.0), tries=250):
    """RetinaFace's ``data_augment._crop`` written out, one try after another, its
    ``random.choice`` and ``random.randrange`` read from the table ``u`` in the order
    SquareCrop documents: (window or None, kept mask)."""
    for k in range(tries):
        scale = scales[min(int(u[3 * k] * len(scales)), len(scales) - 1)]
        w = h = int(scale * min(width, height))
        left = 0 if width == w else min(int(u[3 * k + 1] * (width - w)), width - w - 1)
        top = 0 if height == h else min(int(u[3 * k + 2] * (height - h)), height - h - 1)
        roi = np.array((left, top, left + w, top + h), np.float64)
        lt = np.maximum(boxes[:, :2], roi[:2])
        rb = np.minimum(boxes[:, 2:], roi[2:])
        area_i = np.prod(rb - lt, axis=1) * (lt < rb).all(axis=1)
        area_a = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
        iof = area_i / np.maximum(area_a, 1)
        if not (iof >= 1).any():
            continue
        centers = (boxes[:, :2] + boxes[:, 2:]) / 2
        mask = np.logical_and(roi[:2] < centers, centers < roi[2:]).all(axis=1)
        if not mask.any():
            continue
        return (top, left, h, w), mask
    return None, None


def torchvision_iou_crop(height, width, boxes, u, attempts, trials=40,
                         options=(0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)):
    """torchvision v2's ``RandomIoUCrop.make_params`` written out, its draws read from
    ``u`` in the order RandomIoUCrop documents: (window or None, kept mask)."""
    per = 1 + 4 * trials
    for a in range(attempts):
        threshold = options[min(int(u[a * per] * len(options)), len(options) - 1)]
        if threshold >= 1.0:
            return None, None
        for t in range(trials):
            r = u[a * per + 1 + 4 * t:a * per + 5 + 4 * t]
            new_w, new_h = int(width * (0.3 + 0.7 * r[0])), int(height * (0.3 + 0.7 * r[1]))
            if new_h == 0 or not 0.5 <= new_w / new_h <= 2.0:
                continue
            left, top = int((width - new_w) * r[2]), int((height - new_h) * r[3])
            right, bottom = left + new_w, top + new_h
            if left == right or top == bottom:
                continue
            cx = 0.5 * (boxes[:, 0] + boxes[:, 2])
            cy = 0.5 * (boxes[:, 1] + boxes[:, 3])
            within = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
            if not within.any():
                continue
            if box_iou(boxes[within], (top, left, new_h, new_w)).max() < threshold:
                continue
            return (top, left, new_h, new_w), within
    return None, None


def test_the_crops_replay_the_reference_algorithms():
    """From the same numbers, SquareCrop gives RetinaFace's window and kept boxes and
    RandomIoUCrop torchvision's (the engine evaluates tries in vectorised groups)."""
    rng = np.random.default_rng(12)
    square, iou = SquareCrop(), RandomIoUCrop()
    outcomes = set()
    for trial in range(300):
        height, width = int(rng.integers(30, 900)), int(rng.integers(30, 900))
        boxes = random_boxes(rng, height, width, int(rng.integers(0, 15)))
        if trial % 7 == 0 and len(boxes):
            boxes[0, 2] = boxes[0, 0]  # a box of zero width: never "wholly inside"
        if trial % 5 == 0 and len(boxes):
            boxes[-1, 2:] = boxes[-1, :2] + 0.7  # under 1 px^2: never "wholly inside" either
        for crop, ref in ((square, lambda u: retinaface_crop(height, width, boxes, u)),
                          (iou, lambda u: torchvision_iou_crop(height, width, boxes, u,
                                                               iou.attempts))):
            u = rng.random(crop.draws)
            window, place, keep = crop.detect(height, width, boxes, u, 50, 50)
            want, want_keep = ref(u)
            if want is None:
                assert keep is None and window == (0, 0, height, width)
            else:
                assert window == want
                np.testing.assert_array_equal(keep, want_keep)
            outcomes.add((type(crop).__name__, want is None))
    assert len(outcomes) == 4, outcomes


def test_square_crop_invariants():
    rng = np.random.default_rng(7)
    crop = SquareCrop()
    accepted = fallbacks = 0
    for trial in range(300):
        height, width = int(rng.integers(40, 900)), int(rng.integers(40, 900))
        boxes = random_boxes(rng, height, width, int(rng.integers(0, 12)))
        u = rng.random(crop.draws)
        window, place, keep = crop.detect(height, width, boxes, u, 64, 64)
        top, left, h, w = window
        if keep is None:
            fallbacks += 1
            # The whole image, padded to a square of its longer side at the top-left.
            assert window == (0, 0, height, width)
            longer = max(height, width)
            assert place == (0, 0, round(height * 64 / longer), round(width * 64 / longer))
            # Only after every try failed: none put a box wholly inside with a centre inside.
            for k in range(crop.tries):
                side = int(crop.scales[min(int(u[3 * k] * 5), 4)] * min(height, width))
                if side < 1:
                    continue
                lft = 0 if side == width else min(int(u[3 * k + 1] * (width - side)),
                                                  width - side - 1)
                tp = 0 if side == height else min(int(u[3 * k + 2] * (height - side)),
                                                  height - side - 1)
                win = (tp, lft, side, side)
                assert not ((inside_fraction(boxes, win) >= 1).any()
                            and centre_inside(boxes, win).any())
            continue
        accepted += 1
        assert place == (0, 0, 64, 64)
        assert h == w and h in [int(s * min(height, width)) for s in crop.scales]
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
        # RetinaFace's randrange: a square smaller than the image never touches its far edge.
        assert w == width or left + w < width
        assert h == height or top + h < height
        # At least one box wholly inside; kept = centre strictly inside.
        b = boxes
        wholly = (b[:, 0] >= left) & (b[:, 2] <= left + w) & (b[:, 1] >= top) & (b[:, 3] <= top + h)
        assert (wholly & ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) >= 1)).any()
        np.testing.assert_array_equal(keep, centre_inside(boxes, window))
    assert accepted > 100 and fallbacks > 10, (accepted, fallbacks)


def test_square_crop_falls_back_when_no_face_fits():
    crop = SquareCrop(tries=30)
    # One box as large as a landscape image: no square holds it.
    window, place, keep = crop.detect(300, 500, np.array([[0., 0, 500, 300]]),
                                      np.random.default_rng(0).random(crop.draws), 640, 640)
    assert (window, place, keep) == ((0, 0, 300, 500), (0, 0, 384, 640), None)
    # No box at all: the same, at once.
    assert crop.detect(500, 300, np.zeros((0, 4)), np.zeros(crop.draws), 640, 640) == (
        (0, 0, 500, 300), (0, 0, 640, 384), None)


def test_random_iou_crop_invariants():
    rng = np.random.default_rng(8)
    crop = RandomIoUCrop()
    per = 1 + 4 * crop.trials
    counts = dict(crop=0, whole=0)
    for trial in range(400):
        height, width = int(rng.integers(50, 700)), int(rng.integers(50, 700))
        boxes = random_boxes(rng, height, width, int(rng.integers(1, 8)))
        u = rng.random(crop.draws)
        window, place, keep = crop.detect(height, width, boxes, u, 96, 96)
        assert place == (0, 0, 96, 96)
        if keep is None:
            counts["whole"] += 1
            assert window == (0, 0, height, width)
            continue
        counts["crop"] += 1
        top, left, h, w = window
        assert 0.5 <= w / h <= 2.0
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
        np.testing.assert_array_equal(keep, centre_inside(boxes, window))
        # The attempt that gave it: the first whose threshold is below 1 and met.
        for a in range(crop.attempts):
            threshold = crop.thresholds[min(int(u[a * per] * 7), 6)]
            assert threshold < 1.0
            r = u[a * per + 1:(a + 1) * per].reshape(crop.trials, 4)
            sizes = [(int(width * (0.3 + 0.7 * q[0])), int(height * (0.3 + 0.7 * q[1])))
                     for q in r]
            if (w, h) in sizes:
                t = sizes.index((w, h))
                assert left == int((width - w) * r[t, 2]) and top == int((height - h) * r[t, 3])
                assert box_iou(boxes[keep], window).max() >= threshold
                break
        else:
            pytest.fail(f"no attempt of the draws gives the window {window}")
    assert counts["crop"] > 150 and counts["whole"] > 30, counts


def test_random_iou_crop_without_boxes_or_with_threshold_1_does_not_crop():
    one = RandomIoUCrop(thresholds=(1.0,))
    assert one.detect(200, 300, np.array([[10., 10, 50, 50]]),
                      np.random.default_rng(1).random(one.draws), 64, 64) == (
        (0, 0, 200, 300), (0, 0, 64, 64), None)
    crop = RandomIoUCrop(attempts=3, thresholds=(0.5,))
    assert crop.draws == 3 * 161
    assert crop.detect(200, 300, np.zeros((0, 4)), np.zeros(crop.draws), 64, 64)[2] is None


def test_random_resized_crop_boxes_follow_it(painted):
    paths, boxes, labels = painted
    crop = RandomResizedCrop(96, scale=(0.05, 0.3))
    ds = DetectionFiles(paths, boxes, labels, size=96, crop=crop, flip=1.0)
    emptied = 0
    for i in range(len(paths)):
        image, t, window, place, keep, flip, given = replay(ds, i, i)
        assert keep is None and flip and place == (0, 0, 96, 96)
        want, _ = reference_boxes(given, window, place, 96, True, None)
        np.testing.assert_allclose(t["boxes"], want, atol=1e-3)
        emptied += len(given) > 0 and len(t["boxes"]) == 0
    # Small crops miss every box of some images: those are still delivered, empty.
    assert emptied > 0


# --------------------------------------------------------------------------
# Construction: formats and bad input


def test_box_formats_give_the_same_boxes(painted):
    paths, boxes, labels = painted
    xywh = [np.concatenate([b[:, :2], b[:, 2:] - b[:, :2]], axis=1) for b in boxes]
    cxcywh = [np.concatenate([(b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]], axis=1)
              for b in boxes]
    ref = DetectionFiles(paths, boxes, labels, size=64, crop=SquareCrop())
    for fmt, given in (("xywh", xywh), ("cxcywh", cxcywh)):
        ds = DetectionFiles(paths, given, labels, size=64, crop=SquareCrop(), box_format=fmt)
        for i in range(len(paths)):
            np.testing.assert_allclose(ds.boxes_of(i)[0], ref.boxes_of(i)[0], atol=1e-4)
        np.random.seed(5)
        a = ds[4][1]["boxes"]
        np.random.seed(5)
        np.testing.assert_allclose(a, ref[4][1]["boxes"], atol=1e-3)
    np.testing.assert_allclose(to_xyxy([[1, 2, 4, 6]], "cxcywh"), [[-1, -1, 3, 5]])


def test_given_boxes_outside_the_image_are_clamped(painted):
    paths, boxes, labels = painted
    width, height = pillow_rgb(paths[0]).size
    outside = [np.array([[-50.0, -20, 40, 60], [width - 30, height - 30, width + 99, height + 5]])]
    ds = DetectionFiles(paths[:1], outside, [[0, 1]], size=(height, width), crop=Letterbox(),
                        flip=0.0)
    _, t = ds[0]
    np.testing.assert_allclose(t["boxes"], [[0, 0, 40, 60], [width - 30, height - 30, width,
                                                              height]], atol=1e-3)


@pytest.mark.parametrize("bad, match", [
    ([[1.0, 2, np.nan, 4]], r"image '.*img01\.jpg' \(index 1\), box 0 .*not finite"),
    ([[0.0, 0, 5, 5], [1.0, 2, 0.5, 4]], r"img01\.jpg' \(index 1\), box 1 .*negative"),
    ([[1.0, 2, 3]], r"boxes\[1\] \(image .*img01\.jpg'\) must have shape \(n, 4\)"),
    ([[1.0, 2, np.inf, 4]], r"box 0 \[1\.0, 2\.0, inf, 4\.0\]"),
])
def test_bad_boxes_name_the_image_and_the_box(painted, bad, match):
    paths, boxes, labels = painted
    given = [boxes[0], np.array(bad)]
    with pytest.raises(ValueError, match=match):
        DetectionFiles(paths[:2], given, [labels[0], np.zeros(len(bad), np.int64)])


def test_bad_arguments_name_them(painted):
    paths, boxes, labels = painted
    with pytest.raises(ValueError, match=r"labels\[2\] .* must be 1 integers"):
        DetectionFiles(paths[:3], [boxes[0], boxes[1], np.zeros((1, 4))],
                       [labels[0], labels[1], [0, 1]])
    with pytest.raises(ValueError, match="3 paths, 2 box arrays and 3 label arrays"):
        DetectionFiles(paths[:3], boxes[:2], labels[:3])
    with pytest.raises(ValueError, match=r"resizes to \(224, 224\) but size is \(640, 640\)"):
        DetectionFiles(paths, boxes, labels, crop=RandomResizedCrop(224))
    with pytest.raises(ValueError, match="box_format must be one of"):
        DetectionFiles(paths, boxes, labels, box_format="yxyx")
    with pytest.raises(ValueError, match="crop must be a SquareCrop or a RandomIoUCrop"):
        DetectionFiles(paths, boxes, labels, crop="square")
    with pytest.raises(ValueError, match="min_size must be a finite number"):
        DetectionFiles(paths, boxes, labels, min_size=-1)
    with pytest.raises(ValueError, match="image_ids must be 12 integers"):
        DetectionFiles(paths, boxes, labels, image_ids=[1, 2])
    with pytest.raises(ValueError, match="scales must be"):
        SquareCrop(scales=(0.0, 0.5))
    with pytest.raises(ValueError, match="thresholds must be"):
        RandomIoUCrop(thresholds=())
    with pytest.raises(ValueError, match="position must be one of"):
        Letterbox("bottom")
    with pytest.raises(ValueError, match="fill must be None or 3 numbers"):
        Letterbox(fill=(1, 2))


def test_storage_is_flat(painted):
    paths, boxes, labels = painted
    ds = DetectionFiles(paths, boxes, labels, image_ids=np.arange(12) * 10 + 7)
    total = sum(len(b) for b in boxes)
    assert ds._boxes.shape == (total, 4) and ds._boxes.dtype == np.float32
    assert ds._labels.shape == (total,) and ds._offsets.shape == (13,)
    assert ds.num_boxes == total and len(ds) == 12
    assert "12 images" in repr(ds) and f"{total} boxes" in repr(ds)
    _, t = ds[5]
    assert t["image_id"] == 57


# --------------------------------------------------------------------------
# Batches: both faces, every num_workers, resume, bad files


def copy_batch(batch):
    images, t = batch
    return np.array(images), {k: np.array(v) for k, v in t.items()}


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (ia, ta), (ib, tb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)
        assert list(ta) == list(tb)
        for k in ta:
            np.testing.assert_array_equal(ta[k], tb[k])


def test_numpy_face_every_num_workers_gives_the_same_batches(painted):
    paths, boxes, labels = painted
    ds = DetectionFiles(paths, boxes, labels, size=96, crop=SquareCrop(),
                        image_ids=np.arange(12) + 100)
    runs = {}
    for nw in (0, 2):
        with DataLoader(ds, batch_size=5, shuffle=True, num_workers=nw, seed=4) as dl:
            runs[nw] = [copy_batch(b) for b in dl] + [copy_batch(b) for b in dl]
    assert_same_batches(runs[0], runs[2])
    images, t = runs[0][0]
    assert images.shape == (5, 3, 96, 96) and images.dtype == np.float32
    assert list(t) == ["boxes", "labels", "offsets", "image_id"]
    assert t["boxes"].dtype == np.float32 and t["labels"].dtype == np.int64
    assert t["offsets"].dtype == np.int64 and t["offsets"][0] == 0
    assert t["offsets"][-1] == len(t["boxes"]) == len(t["labels"])
    assert (np.diff(t["offsets"]) >= 0).all()
    # Every image of the epoch is delivered once, the box-less ones included.
    ids = np.concatenate([t["image_id"] for _, t in runs[0][:3]])
    assert sorted(ids.tolist()) == list(range(100, 112))
    # The batch's boxes are each image's own: the labels are a subset of the image's.
    for _, t in runs[0]:
        for j, iid in enumerate(t["image_id"]):
            got = t["labels"][t["offsets"][j]:t["offsets"][j + 1]]
            assert set(got.tolist()) <= set(labels[iid - 100].tolist())
    # __getitems__ (torch's own loader, a collate_fn) gives the same rows.
    np.random.seed(2)
    rows = ds.__getitems__([3, 4, 5])
    np.random.seed(2)
    images, t = ds.gather_batch([3, 4, 5], np.empty)
    for j, (img, tgt) in enumerate(rows):
        np.testing.assert_array_equal(img, images[j])
        np.testing.assert_array_equal(tgt["boxes"], t["boxes"][t["offsets"][j]:t["offsets"][j + 1]])
        assert tgt["image_id"] == t["image_id"][j]


def test_torch_face_gives_per_image_dicts_as_views(painted):
    torch = pytest.importorskip("torch")
    from netcl_loader.torch import DataLoader as TorchLoader
    paths, boxes, labels = painted
    ds = DetectionFiles(paths, boxes, labels, size=80, crop=RandomIoUCrop())
    with DataLoader(ds, batch_size=4, shuffle=True, seed=9) as dl:
        ref = [copy_batch(b) for b in dl]
    for nw in (0, 2):
        got = list(TorchLoader(ds, batch_size=4, shuffle=True, num_workers=nw, seed=9))
        assert len(got) == len(ref)
        for (images, targets), (rimages, rt) in zip(got, ref):
            assert isinstance(images, torch.Tensor) and images.shape == (4, 3, 80, 80)
            np.testing.assert_array_equal(images.numpy(), rimages)
            assert isinstance(targets, list) and len(targets) == 4
            base = targets[0]["boxes"].untyped_storage().data_ptr()
            for j, tgt in enumerate(targets):
                assert set(tgt) == {"boxes", "labels", "image_id"}
                a, b = rt["offsets"][j], rt["offsets"][j + 1]
                assert tgt["boxes"].dtype == torch.float32 and tgt["boxes"].shape == (b - a, 4)
                assert tgt["labels"].dtype == torch.int64
                np.testing.assert_array_equal(tgt["boxes"].numpy(), rt["boxes"][a:b])
                np.testing.assert_array_equal(tgt["labels"].numpy(), rt["labels"][a:b])
                assert tgt["image_id"] == rt["image_id"][j] and type(tgt["image_id"]) is int
                # Views of one flat tensor: no copy per image.
                assert tgt["boxes"].untyped_storage().data_ptr() == base


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exact_resume_mid_epoch(painted, num_workers):
    paths, boxes, labels = painted
    ds = DetectionFiles(paths, boxes, labels, size=64, crop=SquareCrop(), output="uint8")
    kw = dict(batch_size=3, shuffle=True, seed=31, num_workers=num_workers)
    with DataLoader(ds, **kw) as dl:
        dl.set_epoch(2)
        full = [copy_batch(b) for b in dl]
    with DataLoader(ds, **kw) as dl:
        dl.set_epoch(2)
        it = iter(dl)
        head = [copy_batch(next(it)) for _ in range(2)]
        state = json.dumps(dl.state_dict())
    assert_same_batches(head, full[:2])
    with DataLoader(ds, **kw) as dl:
        dl.load_state_dict(json.loads(state))
        assert_same_batches([copy_batch(b) for b in dl], full[2:])


def test_a_bad_image_is_replaced_with_its_boxes(painted, tmp_path):
    paths, boxes, labels = painted
    bad = tmp_path / "bad.jpg"
    with open(paths[4], "rb") as f:
        bad.write_bytes(f.read()[:600])  # truncated
    files = list(paths[:4]) + [str(bad)] + list(paths[5:])
    skip = DetectionFiles(files, boxes, labels, size=64, crop=Letterbox(), flip=0.0,
                          on_error="skip")
    # Replaced by the next readable image, index 5, with its boxes and id.
    image, t = skip[4]
    want_image, want = skip[5]
    np.testing.assert_array_equal(image, want_image)
    np.testing.assert_array_equal(t["boxes"], want["boxes"])
    np.testing.assert_array_equal(t["labels"], want["labels"])
    assert t["image_id"] == 5
    with DataLoader(skip, batch_size=12, shuffle=False, num_workers=2) as dl:
        images, t = copy_batch(next(iter(dl)))
        assert dl.stats.skipped == 1
    assert t["image_id"].tolist() == [0, 1, 2, 3, 5] + list(range(5, 12))
    o = t["offsets"]
    np.testing.assert_array_equal(t["boxes"][o[4]:o[5]], t["boxes"][o[5]:o[6]])
    np.testing.assert_array_equal(images[4], images[5])
    strict = DetectionFiles(files, boxes, labels, size=64)
    with pytest.raises(ImageFileError, match="bad.jpg"):
        strict[4]
    with DataLoader(strict, batch_size=4, num_workers=2) as dl:
        with pytest.raises(ImageFileError, match="bad.jpg"):
            list(dl)


def test_a_slot_too_small_for_the_boxes_grows(painted, tmp_path):
    """Many boxes per image: the targets, allocated after the images, outgrow the slot
    sized from the first batch; the slot grows and the batches stay exact."""
    paths, _, _ = painted
    rng = np.random.default_rng(3)
    many = []
    for k in range(12):
        n = 4000 if k >= 8 else 1
        x, y = rng.uniform(0, 200, n), rng.uniform(0, 200, n)
        many.append(np.stack([x, y, x + 40, y + 40], axis=1))
    labels = [np.zeros(len(b), np.int64) for b in many]
    ds = DetectionFiles(paths, many, labels, size=32, crop=Letterbox(), flip=0.0)
    with DataLoader(ds, batch_size=4, shuffle=False, num_workers=0) as dl:
        ref = [copy_batch(b) for b in dl]
    with DataLoader(ds, batch_size=4, shuffle=False, num_workers=2) as dl:
        got = [copy_batch(b) for b in dl]
        grown = dl.stats.grown_slots
    assert_same_batches(got, ref)
    assert grown >= 1
    assert len(ref[2][1]["boxes"]) > 10000


needs_nginx = pytest.mark.skipif(
    __import__("shutil").which("nginx") is None and not os.path.exists("/usr/sbin/nginx"),
    reason="nginx is not installed (apt-get install nginx-light)")


@needs_nginx
def test_files_over_http_give_the_local_files_batches(painted, tmp_path):
    """Images named by URL (a loopback nginx): fetched ahead into the cache, the same
    batches, boxes and ids as the same files on disk."""
    from netcl_loader.images import Retry
    from remote_util import Nginx
    paths, boxes, labels = painted
    root = os.path.dirname(paths[0])
    with Nginx(root) as server:
        urls = [f"{server.url}/{os.path.basename(p)}" for p in paths]
        remote = DetectionFiles(urls, boxes, labels, size=64, cache_dir=tmp_path / "cache",
                                retry=Retry(attempts=8, backoff_seconds=0.005,
                                            backoff_max_seconds=0.05))
        local = DetectionFiles(paths, boxes, labels, size=64)
        kw = dict(batch_size=5, shuffle=True, seed=8, num_workers=2)
        with DataLoader(local, **kw) as a, DataLoader(remote, **kw) as b:
            assert_same_batches([copy_batch(x) for x in b], [copy_batch(x) for x in a])


def test_a_subset_keeps_the_torch_face_targets(painted):
    pytest.importorskip("torch")
    from netcl_loader import Subset
    from netcl_loader.torch import DataLoader as TorchLoader
    paths, boxes, labels = painted
    ds = DetectionFiles(paths, boxes, labels, size=48, crop=Letterbox())
    images, targets = next(iter(TorchLoader(Subset(ds, [5, 6, 7]), batch_size=3)))
    assert images.shape == (3, 3, 48, 48)
    assert [t["image_id"] for t in targets] == [5, 6, 7]
    assert [len(t["boxes"]) for t in targets] == [len(boxes[k]) for k in (5, 6, 7)]


@pytest.mark.parametrize("crop", sorted(CROPS))
def test_tiny_and_oblong_images(tmp_path, crop):
    """Images of a few pixels, or one pixel across: every crop gives a window inside the
    image, a valid place, and boxes inside the output."""
    rng = np.random.default_rng(5)
    paths, boxes, labels = [], [], []
    for k, (w, h) in enumerate([(1, 1), (5, 3), (2, 700), (700, 2), (9, 9)]):
        path = tmp_path / f"t{k}.jpg"
        path.write_bytes(encode_jpeg(photo_region(rng, (w, h)), quality=90))
        paths.append(str(path))
        boxes.append(np.array([[0, 0, w, h], [w / 3, h / 3, w / 2, h / 2]], np.float64))
        labels.append(np.array([0, 1]))
    size = (40, 56)
    ds = DetectionFiles(paths, boxes, labels, size=size, crop=CROPS[crop](size), min_size=0,
                        min_area=0)
    for i in range(len(paths)):
        for seed in range(4):
            np.random.seed(seed)
            image, t = ds[i]
            assert image.shape == (3,) + size and np.isfinite(image).all()
            b = t["boxes"]
            assert ((b[:, 0] >= 0) & (b[:, 2] <= size[1]) & (b[:, 1] >= 0)
                    & (b[:, 3] <= size[0])).all()


def test_a_bad_box_of_a_signed_url_does_not_show_the_signature():
    url = "https://example.com/img/a.jpg?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIA"
    with pytest.raises(ValueError, match=r"box 0") as info:
        DetectionFiles([url], [[[1.0, 2, np.nan, 4]]], [[0]])
    assert "deadbeef" not in str(info.value) and "AKIA" not in str(info.value)


# --------------------------------------------------------------------------
# EXIF orientation: boxes in the displayed image


def displayed_rgb(path):
    """The oracle's image: Pillow's, turned by ImageOps.exif_transpose."""
    with Image.open(path) as img:
        return ImageOps.exif_transpose(img).convert("RGB")


@pytest.fixture(scope="module")
def painted_oriented(tmp_path_factory):
    """Per EXIF orientation 1-8 a photo painted (as displayed) with 2-4 boxes, stored turned
    the other way with the tag, as a camera held sideways writes it; the boxes are in the
    displayed image's pixels: (paths, boxes, labels)."""
    root = tmp_path_factory.mktemp("painted_oriented")
    rng = np.random.default_rng(77)
    paths, boxes, labels = [], [], []
    for k in range(1, 9):
        width, height = SIZES[k % len(SIZES)]
        img = np.array(photo_region(rng, (width, height)))
        free = [c for c in rng.permutation(len(PALETTE)) if not has_colour(
            img.transpose(2, 0, 1), PALETTE[c], COLOUR_LEVELS + 20).any()]
        b = paint(rng, width, height, int(rng.integers(2, 5)))[:len(free)]
        lab = np.array(free[:len(b)], np.int64)
        for (x1, y1, x2, y2), c in zip(b.astype(int), lab):
            img[y1:y2, x1:x2] = PALETTE[c]
        path = os.path.join(root, f"o{k}.jpg")
        with open(path, "wb") as f:
            f.write(encode_oriented_jpeg(stored_for_display(img, k), k, subsampling=0))
        # The file displays as painted: the boxes' coordinates are the displayed ones.
        assert displayed_rgb(path).size == (width, height)
        paths.append(path)
        boxes.append(b)
        labels.append(lab)
    return paths, boxes, labels


@pytest.mark.parametrize("decoder", ["auto", "pillow"])
@pytest.mark.parametrize("crop", ["square", "resized", "letterbox"])
def test_exif_orientation_boxes_frame_the_displayed_colour(painted_oriented, monkeypatch,
                                                           crop, decoder):
    """With exif_orientation=True, boxes given in the displayed image frame their colour
    after every crop, resize and flip, and the pixels are Pillow's displayed image through
    the same window (compiled decoder and Pillow path alike)."""
    monkeypatch.setenv("NETCL_LOADER_IMAGE_DECODER", decoder)
    paths, boxes, labels = painted_oriented
    size = (112, 128) if crop == "resized" else (120, 120)
    ds = DetectionFiles(paths, boxes, labels, size=size, crop=CROPS[crop](size), flip=0.5,
                        output="uint8", exif_orientation=True)
    kept = flips = 0
    for i in range(len(paths)):
        shown = displayed_rgb(paths[i])
        width, height = shown.size
        for seed in range(3):
            np.random.seed(7 * i + seed)
            u = np.random.random((1, ds.crop.draws + 1))[0]
            np.random.seed(7 * i + seed)
            image, t = ds[i]
            given = clamp(boxes[i], height, width)
            window, place, keep = ds.crop.detect(height, width, given, u[:-1], *size)
            flip = bool(u[-1] < ds.flip)
            want, rows = reference_boxes(given, window, place, size[1], flip, keep)
            np.testing.assert_allclose(t["boxes"], want, atol=1e-3)
            np.testing.assert_array_equal(t["labels"], labels[i][rows])
            top, left, h, w = window
            y0, x0, ph, pw = place
            ref = np.empty(size + (3,), np.uint8)
            ref[:] = np.round(np.asarray(IMAGENET_MEAN) * 255).astype(np.uint8)
            ref[y0:y0 + ph, x0:x0 + pw] = np.asarray(
                shown.crop((left, top, left + w, top + h)).resize((pw, ph), Image.BILINEAR))
            if flip:
                ref = ref[:, ::-1]
            d = np.abs(image.astype(np.float64) - ref.transpose(2, 0, 1))
            assert d.mean() <= MEAN_ABS_LEVELS and d.max() <= MAX_LEVELS, (i + 1, d.mean())
            m = margin_for(window, place)
            for b, lab in zip(t["boxes"], t["labels"]):
                assert_frames(image, b, PALETTE[lab], m, (crop, decoder, i + 1, seed))
            kept += len(rows)
            flips += flip
    assert kept > 20 and flips > 3, (kept, flips)


def test_exif_orientation_off_reads_the_stored_image_and_every_num_workers_agree(
        painted_oriented):
    """The default ignores the tag: the image as stored (Pillow's Image.open, as
    torchvision reads it), boxes taken in its pixels; with the tag applied, 0 and 2
    workers give the same batches."""
    paths, boxes, labels = painted_oriented
    off = DetectionFiles(paths, boxes, labels, size=96, crop=SquareCrop(), flip=0.5,
                         output="uint8")
    assert not off.exif_orientation
    for i in range(len(paths)):
        image, t, window, place, keep, flip, given = replay(off, i, 50 + i)
        ref = reference_pixels(paths[i], window, place, (96, 96), flip, IMAGENET_MEAN)
        d = np.abs(image.astype(np.float64) - ref)
        assert d.mean() <= MEAN_ABS_LEVELS and d.max() <= MAX_LEVELS, (i + 1, d.mean())
        want, _ = reference_boxes(given, window, place, 96, flip, keep)
        np.testing.assert_allclose(t["boxes"], want, atol=1e-3)
    on = DetectionFiles(paths, boxes, labels, size=96, crop=SquareCrop(), exif_orientation=True)
    runs = {}
    for nw in (0, 2):
        with DataLoader(on, batch_size=3, shuffle=True, num_workers=nw, seed=8) as dl:
            runs[nw] = [copy_batch(b) for b in dl]
    assert_same_batches(runs[0], runs[2])
    with pytest.raises(ValueError, match="DetectionFiles: exif_orientation must be True"):
        DetectionFiles(paths, boxes, labels, exif_orientation="on")
