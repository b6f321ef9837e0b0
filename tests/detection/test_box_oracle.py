"""The detection box oracle (tests/support/boxes_oracle.py) against Albumentations 2.0.8,
then the engine's box arithmetic and crop draws against the oracle."""
from __future__ import annotations

import numpy as np
import pytest

import boxes_oracle as oracle

# ----------------------------------------------------------------------------- helpers


def _random_boxes(rng, height, width, n, outside=0.2):
    """``n`` XYXY boxes in a (height, width) image, some sticking out by up to a fifth
    of the image (``outside``), some thin (down to a fraction of a pixel)."""
    x1 = rng.uniform(-outside * width, width, n)
    y1 = rng.uniform(-outside * height, height, n)
    bw = np.where(rng.random(n) < 0.15, rng.uniform(0.0, 2.0, n), rng.uniform(1, width / 2, n))
    bh = np.where(rng.random(n) < 0.15, rng.uniform(0.0, 2.0, n), rng.uniform(1, height / 2, n))
    return np.stack([x1, y1, x1 + bw, y1 + bh], axis=1)


def _random_case(rng):
    """One sample: image size, boxes, a fixed crop box (or the padded whole image, as
    SquareCrop's fallback and Letterbox place it), output size and flip."""
    height, width = int(rng.integers(100, 1100)), int(rng.integers(100, 1100))
    boxes = _random_boxes(rng, height, width, int(rng.integers(1, 9)))
    flip = bool(rng.random() < 0.5)
    if rng.random() < 0.2:
        # The whole image padded at the bottom/right to a square, then resized.
        side = int(rng.choice([320, 640]))
        long = max(height, width)
        window = (0, 0, height, width)
        place = (0, 0, height * side / long, width * side / long)
        return dict(height=height, width=width, boxes=boxes, window=window, place=place,
                    out=(side, side), flip=flip, pad_to=long)
    # Mostly crops of a quarter of the image or more (boxes kept), a few tiny ones.
    low = 1 if rng.random() < 0.1 else 4
    ch = int(rng.integers(max(1, height // low), height + 1))
    cw = int(rng.integers(max(1, width // low), width + 1))
    top, left = int(rng.integers(0, height - ch + 1)), int(rng.integers(0, width - cw + 1))
    out = (640, 640) if rng.random() < 0.5 else (int(rng.integers(64, 700)),
                                                 int(rng.integers(64, 700)))
    return dict(height=height, width=width, boxes=boxes, window=(top, left, ch, cw),
                place=(0, 0) + out, out=out, flip=flip, pad_to=None)


def _oracle_case(case, min_size=1.0, min_area=1.0):
    given = oracle.clamp(case["boxes"], case["height"], case["width"])
    return oracle.pipeline(given, case["window"], case["place"], case["out"], case["flip"],
                           min_size, min_area)


def _albumentations_case(A, cv2, case, min_size=1.0, min_area=1.0):
    """Albumentations' boxes for the same sample; dropping only at the end
    (``check_each_transform=False``), boxes given outside the image clipped (``clip``)."""
    top, left, ch, cw = case["window"]
    out_h, out_w = case["out"]
    if case["pad_to"] is not None:
        steps = [A.PadIfNeeded(min_height=case["pad_to"], min_width=case["pad_to"],
                               position="top_left", border_mode=cv2.BORDER_CONSTANT, fill=0)]
    else:
        steps = [A.Crop(x_min=left, y_min=top, x_max=left + cw, y_max=top + ch)]
    steps.append(A.Resize(out_h, out_w))
    if case["flip"]:
        steps.append(A.HorizontalFlip(p=1.0))
    pipe = A.Compose(steps, bbox_params=A.BboxParams(
        format="pascal_voc", label_fields=["index"], min_area=min_area, min_width=min_size,
        min_height=min_size, check_each_transform=False, clip=True))
    image = np.zeros((case["height"], case["width"], 3), np.uint8)
    n = len(case["boxes"])
    # Albumentations refuses a box left empty by clipping to the image (a ValueError
    # where torchvision's rules carry it to the end and drop it there): it is not given.
    given = oracle.clamp(case["boxes"], case["height"], case["width"])
    usable = np.flatnonzero((given[:, 2] > given[:, 0]) & (given[:, 3] > given[:, 1]))
    got = pipe(image=image, bboxes=np.asarray(case["boxes"], np.float64)[usable],
               index=usable)
    keep = np.zeros(n, bool)
    boxes = np.full((n, 4), np.nan)
    idx = np.asarray(got["index"], dtype=np.int64)
    keep[idx] = True
    boxes[idx] = np.asarray(got["bboxes"], np.float64).reshape(-1, 4)
    return boxes, keep


# ----------------------------------------------------------------------------- oracle rules


def test_oracle_rules_by_hand():
    b = np.array([[10.0, 20.0, 50.0, 60.0], [-5.0, 0.0, 5.0, 10.0]])
    np.testing.assert_allclose(oracle.crop(b, 15, 20, 30, 25),
                               [[0, 5, 25, 30], [0, 0, 0, 0]])
    np.testing.assert_allclose(oracle.resize(b, (100, 200), (50, 400)),
                               [[20, 10, 100, 30], [-10, 0, 10, 5]])      # no clamp
    np.testing.assert_allclose(oracle.hflip(b, 100), [[50, 20, 90, 60], [95, 0, 105, 10]])
    np.testing.assert_allclose(oracle.pad(b, (100, 100), 3, 4, 0, 0)[0],
                               [[13, 24, 53, 64], [0, 4, 8, 14]])
    np.testing.assert_array_equal(
        oracle.sanitize([[0, 0, 1, 1], [0, 0, 0.99, 5], [0, 0, 1, 0.999], [0, 0, 2, 0.5]],
                        (10, 10)), [True, False, False, False])
    np.testing.assert_array_equal(oracle.sanitize([[0, 0, 11, 5], [-1, 0, 3, 3]], (10, 10)),
                                  [False, False])
    np.testing.assert_array_equal(oracle.centre_inside([[0, 0, 10, 10], [0, 0, 12, 12]],
                                                       (0, 0, 6, 7)), [True, False])
    np.testing.assert_allclose(oracle.box_iou([[0, 0, 2, 2]], [[1, 1, 3, 3], [0, 0, 2, 2]]),
                               [[1 / 7, 1.0]])
    np.testing.assert_allclose(oracle.to_xyxy([[1, 2, 3, 4]], "xywh"), [[1, 2, 4, 6]])
    np.testing.assert_allclose(oracle.to_xyxy([[1, 2, 4, 6]], "cxcywh"), [[-1, -1, 3, 5]])


def test_oracle_agrees_with_albumentations():
    """A few hundred random boxes through fixed crops (and the padded whole image), resize
    and flip: the oracle and Albumentations 2.0.8 deliver the same boxes and drop the same
    ones.  Albumentations compares its thresholds with a 1e-7 slack and computes in
    float32; boxes within 1e-3 of a threshold are counted apart, not compared for dropping."""
    A = pytest.importorskip("albumentations")
    import cv2

    assert A.__version__ == "2.0.8"
    rng = np.random.default_rng(20240624)
    compared = kept = borderline = 0
    worst = 0.0
    for _ in range(120):
        case = _random_case(rng)
        want, want_keep = _oracle_case(case)
        got, got_keep = _albumentations_case(A, cv2, case)
        w, h = want[:, 2] - want[:, 0], want[:, 3] - want[:, 1]
        near = ((np.abs(w - 1) < 1e-3) | (np.abs(h - 1) < 1e-3) | (np.abs(w * h - 1) < 1e-3))
        borderline += int(near.sum())
        np.testing.assert_array_equal(want_keep[~near], got_keep[~near], err_msg=str(case))
        both = want_keep & got_keep
        if both.any():
            worst = max(worst, float(np.abs(want[both] - got[both]).max()))
        compared += len(want)
        kept += int(both.sum())
    print(f"\noracle vs Albumentations 2.0.8: {compared} boxes compared, {kept} kept by both, "
          f"{compared - kept - borderline} dropped by both, {borderline} within 1e-3 px of a "
          f"threshold; worst difference {worst:.2e} px")
    assert compared >= 300 and kept >= 150
    assert borderline <= compared // 50
    assert worst < 1e-3


# ----------------------------------------------------------------------------- the engine


def _placed_case(rng):
    """A fixed crop with the engine's placements: the window resized to the whole output,
    or (padding crops) the whole image fitted at the top-left or centred."""
    case = _random_case(rng)
    if case["pad_to"] is not None and rng.random() < 0.5:
        out_h, out_w = case["out"]
        h, w = case["height"], case["width"]
        s = min(out_h / h, out_w / w)
        ph, pw = min(out_h, max(1, round(h * s))), min(out_w, max(1, round(w * s)))
        case["place"] = ((out_h - ph) // 2, (out_w - pw) // 2, ph, pw)
    return case


def test_engine_box_arithmetic_matches_the_oracle():
    """The engine's crop_resize_flip + sanitize_mask against the oracle's torchvision
    pipeline (crop, resize, pad, flip, sanitize) for fixed crop boxes: within 1e-3 px,
    the same boxes dropped."""
    import netcl_loader.images._boxes as _boxes

    rng = np.random.default_rng(7)
    compared = worst = 0
    for _ in range(3000):
        case = _placed_case(rng)
        given = _boxes.clamp(case["boxes"], case["height"], case["width"])
        got = _boxes.crop_resize_flip(given, case["window"], case["place"], case["out"][1],
                                      case["flip"])
        got_keep = _boxes.sanitize_mask(got, 1.0, 1.0)
        want, want_keep = oracle.pipeline(oracle.clamp(case["boxes"], case["height"],
                                                       case["width"]),
                                          case["window"], case["place"], case["out"],
                                          case["flip"])
        assert got.dtype == np.float32
        worst = max(worst, float(np.abs(got - want).max()))
        # float32 rounding may move a box across a threshold only when it lies on it.
        w, h = want[:, 2] - want[:, 0], want[:, 3] - want[:, 1]
        near = (np.abs(w - 1) < 1e-4) | (np.abs(h - 1) < 1e-4) | (np.abs(w * h - 1) < 1e-4)
        np.testing.assert_array_equal(got_keep[~near], want_keep[~near], err_msg=str(case))
        compared += len(want)
    print(f"\nengine vs oracle, fixed crop boxes: {compared} boxes, worst difference "
          f"{worst:.2e} px")
    assert worst < 1e-3


class _Recording:
    """A detection crop that also records what it decided (a real crop: its subclass)."""

    def detect(self, height, width, boxes, u, out_h, out_w):
        out = super().detect(height, width, boxes, u, out_h, out_w)
        self.seen.append((height, width, out))
        return out


def _photo_files(tmp_path, n, seed):
    from images_util import encode_jpeg, photo_region
    rng = np.random.default_rng(seed)
    paths, boxes = [], []
    for k in range(n):
        w, h = int(rng.integers(160, 420)), int(rng.integers(120, 330))
        p = tmp_path / f"p{k:03d}.jpg"
        p.write_bytes(encode_jpeg(photo_region(rng, (w, h)), quality=92))
        paths.append(str(p))
        boxes.append(_random_boxes(rng, h, w, int(rng.integers(0, 12))))
    return paths, boxes


@pytest.mark.parametrize("crop_name", ["SquareCrop", "RandomIoUCrop", "Letterbox"])
@pytest.mark.parametrize("flip", [0.0, 1.0])
def test_dataset_boxes_match_the_oracle(tmp_path, crop_name, flip):
    """DetectionFiles' delivered boxes against the oracle run on the crop box the dataset
    decided (recorded by the crop itself), for each crop, flipped or not."""
    import netcl_loader.images as nli
    from netcl_loader.images import DetectionFiles

    base = getattr(nli, crop_name)
    crop = type("Recording" + crop_name, (_Recording, base), {})(
        **({"position": "center"} if crop_name == "Letterbox" else {}))
    crop.seen = []
    paths, boxes = _photo_files(tmp_path, 12, seed=len(crop_name) + int(flip))
    ds = DetectionFiles(paths, boxes, [np.arange(len(b)) for b in boxes], size=(200, 240),
                        crop=crop, flip=flip)
    images, t = ds.gather_batch(np.arange(len(ds)), np.empty)
    assert len(crop.seen) == len(ds)
    for j, (height, width, (window, place, keep)) in enumerate(crop.seen):
        given = oracle.clamp(boxes[j], height, width)
        want, mask = oracle.pipeline(given, window, place, (200, 240), bool(flip), keep=keep)
        got = t["boxes"][t["offsets"][j]:t["offsets"][j + 1]]
        np.testing.assert_array_equal(t["labels"][t["offsets"][j]:t["offsets"][j + 1]],
                                      np.flatnonzero(mask))
        np.testing.assert_allclose(got, want[mask], atol=1e-3, rtol=0)


# ----------------------------------------------------------------------------- crop draws


def _face_boxes(rng, height, width):
    """Boxes as a face dataset has them: 0 to 30 per image, integer WIDER-style ones
    (sides of 1 px up) and fractional ones, a few larger than any square."""
    n = int(rng.integers(0, 31)) if rng.random() < 0.9 else 0
    side = np.exp(rng.uniform(0, np.log(max(2, min(height, width) * 1.2)), n))
    bw = side * rng.uniform(0.7, 1.3, n)
    bh = side * rng.uniform(0.7, 1.3, n)
    if rng.random() < 0.5:
        bw, bh = np.maximum(1, np.round(bw)), np.maximum(1, np.round(bh))
    x = rng.uniform(-0.1 * width, width, n)
    y = rng.uniform(-0.1 * height, height, n)
    if rng.random() < 0.5:
        x, y = np.round(x), np.round(y)
    return oracle.clamp(np.stack([x, y, x + bw, y + bh], axis=1), height, width)


def _areas_at_least_one(boxes):
    return ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) >= 1).all()


def test_square_crop_draws_match_retinaface():
    """SquareCrop and RetinaFace's _crop, run from the same uniform numbers on many images:
    the same square (or both the padded fallback) and the same boxes kept."""
    from netcl_loader.images import SquareCrop

    crop = SquareCrop()
    rng = np.random.default_rng(2024)
    samples = fallbacks = 0
    sides = {}
    while samples < 1500:
        height, width = int(rng.integers(20, 1100)), int(rng.integers(20, 1100))
        boxes = _face_boxes(rng, height, width)
        if not _areas_at_least_one(boxes):
            continue   # sub-pixel boxes: see the next test
        u = rng.random(crop.draws)
        window, place, keep = crop.detect(height, width, boxes, u, 640, 640)
        want, want_keep = oracle.retinaface_crop(height, width, boxes, u)
        samples += 1
        if want is None:
            fallbacks += 1
            assert window == (0, 0, height, width) and keep is None
            longer = max(height, width)
            assert place == (0, 0, min(640, max(1, round(height * 640 / longer))),
                             min(640, max(1, round(width * 640 / longer))))
            continue
        assert tuple(int(v) for v in window) == want and place == (0, 0, 640, 640)
        np.testing.assert_array_equal(keep, want_keep)
        # The scale drawn: the one whose square has this side.
        s = next(v for v in crop.scales if int(v * min(height, width)) == want[2])
        sides[s] = sides.get(s, 0) + 1
    print(f"\nSquareCrop vs RetinaFace _crop: {samples} images, {fallbacks} padded fallbacks, "
          f"squares by scale: {dict(sorted(sides.items()))}")
    assert fallbacks > 20 and len(sides) >= 5


def test_square_crop_sub_pixel_box_as_retinaface():
    """RetinaFace's matrix_iof divides the intersection by max(box area, 1): a box under
    1 px^2 never counts as wholly inside, and SquareCrop follows it."""
    from netcl_loader.images import SquareCrop

    crop = SquareCrop()
    boxes = np.array([[50.0, 50.0, 50.5, 50.5]])        # area 0.25, the only box
    u = np.random.default_rng(0).random(crop.draws)
    want, _ = oracle.retinaface_crop(100, 100, boxes, u)
    window, _, keep = crop.detect(100, 100, boxes, u, 640, 640)
    assert want is None                                  # RetinaFace: the padded fallback
    assert keep is None, f"the engine cropped {window}"


def test_random_iou_crop_draws_match_torchvision():
    """RandomIoUCrop and torchvision's RandomIoUCrop._get_params, run from the same uniform
    numbers on many images: the same crop (or both none) and the same boxes kept."""
    from netcl_loader.images import RandomIoUCrop

    crop = RandomIoUCrop()
    rng = np.random.default_rng(2025)
    samples, uncropped, by_threshold = 0, 0, {}
    for _ in range(1500):
        height, width = int(rng.integers(20, 1100)), int(rng.integers(20, 1100))
        boxes = _face_boxes(rng, height, width)
        u = rng.random(crop.draws)
        window, place, keep = crop.detect(height, width, boxes, u, 512, 512)
        want, want_keep = oracle.random_iou_crop(height, width, boxes, u,
                                                 attempts=crop.attempts)
        samples += 1
        assert place == (0, 0, 512, 512)
        if want is None:
            uncropped += 1
            assert window == (0, 0, height, width) and keep is None
            continue
        assert tuple(int(v) for v in window) == want
        np.testing.assert_array_equal(keep, want_keep)
        iou = oracle.box_iou(boxes[want_keep], [[want[1], want[0], want[1] + want[3],
                                                 want[0] + want[2]]]).max()
        key = round(float(iou), 1)
        by_threshold[key] = by_threshold.get(key, 0) + 1
    print(f"\nRandomIoUCrop vs torchvision: {samples} images, {uncropped} not cropped, "
          f"crops by best IoU (rounded): {dict(sorted(by_threshold.items()))}")
    assert 0 < uncropped < samples
