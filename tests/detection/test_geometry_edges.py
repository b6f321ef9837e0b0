"""Review of the detection path: the edges of the writers' geometry and of the options.

- The resize and the JPEG decoder write a placed image into a sub-rectangle of
  a larger array: flush with its bottom-right edge, through negative row or
  plane strides, flipped, from sources of one pixel; the values are those a
  packed ``out`` receives and nothing outside the sub-rectangle is written.
- Batches whose images have no box at all (every crop, every num_workers,
  both faces) keep one empty row range per image.
- Options that take numbers refuse a string: iterated, "12" would be read as
  the numbers 1 and 2.
"""
import numpy as np
import pytest

from images_util import encode_jpeg, sample_photo

from netcl_loader import DataLoader
from netcl_loader.images import (DetectionFiles, Letterbox, RandomIoUCrop, RandomResizedCrop,
                                 SquareCrop)

pytestmark = pytest.mark.filterwarnings("ignore:netcl_loader._jpeg is not built")

_jpeg = pytest.importorskip("netcl_loader._jpeg")
from netcl_loader import _image  # noqa: E402

PAD = 77


def _place(big, sub, strides):
    """The view of ``big`` that is written: ``sub`` = (y0, x0, h, w) of the array as
    seen through ``strides`` (None, "row": rows reversed, "plane": planes reversed)."""
    base = {None: big, "row": big[:, ::-1, :], "plane": big[::-1]}[strides]
    y0, x0, h, w = sub
    return base, base[:, y0:y0 + h, x0:x0 + w]


@pytest.mark.parametrize("strides", [None, "row", "plane"])
def test_a_placed_image_at_the_edge_through_any_strides_gets_the_packed_values(strides):
    rng = np.random.default_rng(21)
    decoder = _jpeg.Decoder()
    photo = sample_photo(0)
    checked = 0
    for ih, iw in [(1, 1), (1, 7), (9, 1), (37, 53)]:
        src = np.ascontiguousarray(photo[:ih, :iw])
        data = encode_jpeg(src, quality=92)
        for trial in range(12):
            H, W = int(rng.integers(1, 60)), int(rng.integers(1, 60))
            h, w = int(rng.integers(1, H + 1)), int(rng.integers(1, W + 1))
            # Every third flush with the bottom-right corner of the array.
            y0, x0 = ((H - h, W - w) if trial % 3 == 0 else
                      (int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1))))
            bh, bw = float(rng.uniform(0.2, ih)), float(rng.uniform(0.2, iw))
            box = (float(rng.uniform(0, ih - bh)), float(rng.uniform(0, iw - bw)), bh, bw)
            flip = bool(trial % 2)
            for dtype in (np.uint8, np.float32):
                for write in (lambda out: decoder.decode_into(data, box, out, flip,
                                                              crop_first=True),
                              lambda out: _image.resize_into(src, box, out, flip,
                                                             crop_first=True)):
                    want = np.empty((3, h, w), dtype)
                    write(want)
                    big = np.full((3, H, W), PAD, dtype)
                    base, view = _place(big, (y0, x0, h, w), strides)
                    write(view)
                    np.testing.assert_array_equal(view, want)
                    outside = np.ones(big.shape, bool)
                    _place(outside, (y0, x0, h, w), strides)[1][...] = False
                    assert (big[outside] == PAD).all(), (box, (y0, x0, h, w), strides)
                    checked += 1
    assert checked == 4 * 12 * 2 * 2


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("review")
    paths = []
    for k in range(6):
        path = folder / f"{k}.jpg"
        path.write_bytes(encode_jpeg(sample_photo(k)[5 * k:300, :400 - 7 * k], quality=90))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("crop", [Letterbox(), SquareCrop(), RandomIoUCrop(),
                                  RandomResizedCrop(48)], ids=lambda c: type(c).__name__)
def test_batches_without_any_box_keep_every_image(photos, crop):
    n = len(photos)
    ds = DetectionFiles(photos, [np.zeros((0, 4))] * n, [np.zeros(0, np.int64)] * n, size=48,
                        crop=crop)
    for nw in (0, 2):
        with DataLoader(ds, batch_size=4, shuffle=False, num_workers=nw, seed=1) as dl:
            got = [(images.shape, {k: np.array(v) for k, v in t.items()}) for images, t in dl]
        assert [shape for shape, _ in got] == [(4, 3, 48, 48), (2, 3, 48, 48)]
        for (shape, t), ids in zip(got, ([0, 1, 2, 3], [4, 5])):
            assert t["boxes"].shape == (0, 4) and t["boxes"].dtype == np.float32
            assert t["labels"].shape == (0,) and t["labels"].dtype == np.int64
            assert t["offsets"].tolist() == [0] * (shape[0] + 1)
            assert t["image_id"].tolist() == ids


def test_torch_face_batches_without_any_box(photos):
    torch = pytest.importorskip("torch")
    from netcl_loader.torch import DataLoader as TorchLoader
    n = len(photos)
    ds = DetectionFiles(photos, [np.zeros((0, 4))] * n, [np.zeros(0, np.int64)] * n, size=32,
                        crop=RandomIoUCrop())
    for nw in (0, 2):
        batches = list(TorchLoader(ds, batch_size=4, num_workers=nw, seed=2))
        assert [len(targets) for _, targets in batches] == [4, 2]
        for _, targets in batches:
            for t in targets:
                assert t["boxes"].shape == (0, 4) and t["boxes"].dtype == torch.float32
                assert t["labels"].shape == (0,) and t["labels"].dtype == torch.int64


@pytest.mark.parametrize("build, fragment", [
    (lambda: SquareCrop(scales="1"), "scales"),
    (lambda: SquareCrop(fill="010"), "fill"),
    (lambda: Letterbox(fill="111"), "fill"),
    (lambda: RandomIoUCrop(thresholds="1"), "thresholds"),
    (lambda: RandomResizedCrop(64, ratio="12"), "ratio"),
    (lambda: RandomResizedCrop(64, scale=b"11"), "scale"),
])
def test_a_string_is_not_taken_for_numbers(build, fragment):
    with pytest.raises(ValueError, match=fragment):
        build()


def test_a_string_mean_or_std_is_refused(photos):
    for kw, name in ((dict(mean="000", std=(0.2, 0.2, 0.2)), "mean"),
                     (dict(mean=(0.5, 0.5, 0.5), std="111"), "std")):
        with pytest.raises(ValueError, match=f"{name} must be 3"):
            DetectionFiles(photos[:1], [[]], [[]], **kw)
