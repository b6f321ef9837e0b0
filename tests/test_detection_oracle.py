"""The detection box oracle (tests/boxes_oracle.py) against Albumentations 2.0.8, then the
engine's box arithmetic and crop draws against the oracle."""
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
