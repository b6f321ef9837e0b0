"""The detection API as a user meets it: bad arguments, repr, len, indexing, both faces,
collate functions of the user's, a torchvision-style training loop, resume, pickling.

Every bad argument must be refused at construction with an error that names the
argument, shows the value and says what is expected.  The images are regions of
the real photos scikit-learn ships (``images_util``); boxes are synthetic.
"""
import json
import os
import pickle
import re

import numpy as np
import pytest

from images_util import encode_jpeg, photo_region

pytest.importorskip("PIL")

from netcl_loader import CollateError, DataLoader, Subset, random_split  # noqa: E402
from netcl_loader.images import (CenterCrop, CocoDetection, DetectionFiles,  # noqa: E402
                                 Letterbox, RandomIoUCrop, RandomResizedCrop, SquareCrop,
                                 WiderFace)

pytestmark = pytest.mark.filterwarnings("ignore:netcl_loader._jpeg is not built")

#: (width, height) of the test images: landscape, portrait, square.
SIZES = [(320, 240), (240, 320), (256, 256), (300, 200), (200, 300), (280, 280)]
#: Boxes per image (XYXY, source pixels); image 1 has none.
BOXES = [
    [[10, 10, 100, 100], [150, 40, 300, 200]],
    [],
    [[0, 0, 256, 256], [5, 5, 50, 60], [100, 120, 180, 200]],
    [[20, 30, 120, 150]],
    [[50, 50, 150, 250], [10, 10, 40, 40]],
    [[100, 100, 200, 200]],
]
LABELS = [[1, 2], [], [3, 1, 2], [7], [4, 5], [6]]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("detect_api")
    rng = np.random.default_rng(2024)
    paths = []
    for k, size in enumerate(SIZES):
        path = os.path.join(root, f"img{k}.jpg")
        with open(path, "wb") as f:
            f.write(encode_jpeg(photo_region(rng, size), quality=90))
        paths.append(path)
    return paths


def make(files, **kw):
    return DetectionFiles(files, BOXES, LABELS, **kw)


# ------------------------------------------------------------------ bad arguments


def _one(files, boxes=((1, 2, 30, 40),), labels=(1,), **kw):
    """A one-image dataset with the given boxes and labels of that image."""
    return DetectionFiles(files[:1], [boxes], [labels], **kw)


# (what is changed, the error type, fragments the message must hold)
BAD = [
    # boxes, labels and paths of different lengths
    (lambda f: DetectionFiles(f, BOXES[:5], LABELS), ValueError,
     ["DetectionFiles", "6 paths", "5 box arrays", "6 label arrays", "one (n_i, 4) box array"]),
    (lambda f: DetectionFiles(f, BOXES, LABELS[:4]), ValueError,
     ["6 paths", "6 box arrays", "4 label arrays"]),
    (lambda f: DetectionFiles(f[:5], BOXES, LABELS), ValueError,
     ["5 paths", "6 box arrays", "6 label arrays"]),
    (lambda f: DetectionFiles(f, None, LABELS), TypeError,
     ["boxes and labels must be sequences", "NoneType"]),
    (lambda f: DetectionFiles(f, BOXES, 7), TypeError,
     ["boxes and labels must be sequences", "int"]),
    (lambda f: DetectionFiles(f[0], BOXES[:1], LABELS[:1]), ValueError,
     ["paths must be a sequence of file names", "single name", "img0.jpg"]),
    (lambda f: DetectionFiles([1], [[]], [[]]), TypeError, ["paths[0] is 1", "not a file name"]),
    # a box array of the wrong shape or content
    (lambda f: _one(f, boxes=[(1, 2, 3, 4, 5)]), ValueError,
     ["boxes[0]", "img0.jpg", "shape (n, 4)", "(1, 5)"]),
    (lambda f: DetectionFiles(f[:1], [(1, 2, 30, 40)], [(1,)]), ValueError,
     ["boxes[0]", "shape (n, 4)", "got shape (4,)", "[[x1, y1, x2, y2]]"]),
    (lambda f: _one(f, boxes=[("a", "b", "c", "d")]), ValueError,
     ["boxes[0]", "array of numbers", "'a'"]),
    (lambda f: _one(f, boxes=[(1, 2, float("nan"), 4)]), ValueError,
     ["img0.jpg", "box 0", "nan", "not finite"]),
    (lambda f: _one(f, boxes=[(1, 2, 1e300, 4)]), ValueError,
     ["img0.jpg", "box 0", "1e+300", "float32"]),
    (lambda f: _one(f, boxes=[(50, 2, 10, 4)]), ValueError,
     ["img0.jpg", "box 0", "[50.0, 2.0, 10.0, 4.0]", "(xyxy)", "negative"]),
    (lambda f: _one(f, boxes=[(5, 2, -1, 4)], box_format="xywh"), ValueError,
     ["box 0", "(xywh)", "negative"]),
    (lambda f: _one(f, boxes=[(5, 2, 4, -3)], box_format="cxcywh"), ValueError,
     ["box 0", "(cxcywh)", "negative"]),
    # labels that do not match their boxes
    (lambda f: _one(f, labels=(1, 2)), ValueError,
     ["labels[0]", "img0.jpg", "1 integers", "one per box of boxes[0]", "shape (2,)", "(1, 2)"]),
    (lambda f: _one(f, labels=1), ValueError, ["labels[0]", "1 integers", "got 1"]),
    (lambda f: _one(f, labels=(1.5,)), ValueError, ["labels[0]", "integer", "1.5"]),
    (lambda f: _one(f, labels=("car",)), ValueError, ["labels[0]", "integer", "'car'"]),
    (lambda f: _one(f, labels=np.array([2 ** 63], np.uint64)), ValueError,
     ["labels[0]", "(within int64)", "9223372036854775808"]),
    # options
    (lambda f: make(f, box_format="XYXY"), ValueError,
     ["box_format", "'xyxy', 'xywh', 'cxcywh'", "'XYXY'"]),
    (lambda f: make(f, box_format=None), ValueError, ["box_format", "None"]),
    (lambda f: make(f, min_size=-1), ValueError, ["min_size", ">= 0", "-1"]),
    (lambda f: make(f, min_size=float("nan")), ValueError, ["min_size", "finite", "nan"]),
    (lambda f: make(f, min_size="1"), ValueError, ["min_size", "'1'"]),
    (lambda f: make(f, min_size=True), ValueError, ["min_size", "True"]),
    (lambda f: make(f, min_area=-0.5), ValueError, ["min_area", ">= 0", "-0.5"]),
    (lambda f: make(f, crop=CenterCrop(224)), ValueError,
     ["crop must be a SquareCrop or a RandomIoUCrop or a Letterbox or a RandomResizedCrop",
      "CenterCrop(size=(224, 224)"]),
    (lambda f: make(f, crop=None), ValueError, ["crop must be", "got None"]),
    (lambda f: make(f, crop="square"), ValueError, ["crop must be", "'square'"]),
    (lambda f: make(f, crop=SquareCrop), ValueError,
     ["crop must be a crop object", "the class SquareCrop", "SquareCrop()"]),
    (lambda f: make(f, crop=RandomResizedCrop), ValueError,
     ["the class RandomResizedCrop", "size=(640, 640)"]),
    (lambda f: make(f, size=320, crop=RandomResizedCrop(224)), ValueError,
     ["crop RandomResizedCrop(size=(224, 224)", "(224, 224)", "size is (320, 320)",
      "give RandomResizedCrop the dataset's size"]),
    (lambda f: make(f, flip=1.5), ValueError, ["flip", "probability", "1.5"]),
    (lambda f: make(f, output="float16"), ValueError,
     ["output", "'float32', 'uint8'", "'float16'"]),
    (lambda f: make(f, on_error="ignore"), ValueError, ["on_error", "'raise', 'skip'", "'ignore'"]),
    (lambda f: make(f, mean=(0.5, 0.5, 0.5)), ValueError, ["mean and std go together", "std=None"]),
    (lambda f: make(f, mean=(0.5, 0.5), std=(1, 1, 1)), ValueError, ["mean", "3", "(0.5, 0.5)"]),
    (lambda f: make(f, image_ids=[1, 2]), ValueError, ["image_ids", "6 integers", "[1, 2]"]),
    (lambda f: make(f, image_ids=[0.5] * 6), ValueError, ["image_ids", "integers", "0.5"]),
    (lambda f: make(f, image_ids=np.full(6, 2 ** 63, np.uint64)), ValueError,
     ["image_ids", "within int64"]),
    (lambda f: make(f, max_file_bytes=0), ValueError, ["max_file_bytes", "positive", "0"]),
]


@pytest.mark.parametrize("build, exc, fragments", BAD,
                         ids=[f"bad{k}-{'-'.join(f)[:40]}" for k, (_, _, f) in enumerate(BAD)])
def test_bad_arguments_name_the_argument_the_value_and_what_is_expected(files, build, exc,
                                                                        fragments):
    with pytest.raises(exc) as info:
        build(files)
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, (fragment, msg)


@pytest.mark.parametrize("size, shown", [
    (0, "0"), (-3, "-3"), (1.5, "1.5"), ("640", "'640'"), ((640,), "(640,)"),
    ((640, 0), "(640, 0)"), ((640, 480, 3), "(640, 480, 3)"), (None, "None"), (True, "True"),
    ((True, 3), "(True, 3)"),
])
def test_a_bad_size_is_named_with_its_value(files, size, shown):
    with pytest.raises(ValueError, match="DetectionFiles: size must be a positive int or a "
                       r"pair \(height, width\)") as info:
        make(files, size=size)
    assert str(info.value).endswith(f"got {shown}")


def test_good_sizes_and_array_likes_are_taken(files):
    torch = pytest.importorskip("torch")
    ds = make(files, size=np.int64(96))
    assert ds.size == (96, 96) and ds.image_shape == (3, 96, 96)
    assert make(files, size=(64, 96)).size == (64, 96)
    # Boxes and labels as tensors, tuples, int32 arrays; stored as float32 / int64.
    boxes = [torch.tensor(b, dtype=torch.float64).reshape(-1, 4) for b in BOXES]
    labels = [np.array(lab, np.int32) for lab in LABELS]
    ds = DetectionFiles([os.fspath(p) for p in files], boxes, tuple(labels))
    for i in range(len(files)):
        b, lab = ds.boxes_of(i)
        assert b.dtype == np.float32 and lab.dtype == np.int64
        np.testing.assert_array_equal(b, np.array(BOXES[i], np.float32).reshape(-1, 4))
        np.testing.assert_array_equal(lab, LABELS[i])
    assert ds.num_boxes == sum(len(b) for b in BOXES)


CROP_BAD = [
    (lambda: SquareCrop(scales=(0, 1)), ["SquareCrop", "scales", "(0, 1]", "(0, 1)"]),
    (lambda: SquareCrop(scales=0.5), ["SquareCrop", "scales", "sequence", "0.5"]),
    (lambda: SquareCrop(scales=()), ["SquareCrop", "scales", "non-empty", "()"]),
    (lambda: SquareCrop(tries=0), ["SquareCrop", "tries", "positive int", "0"]),
    (lambda: SquareCrop(tries=True), ["SquareCrop", "tries", "True"]),
    (lambda: SquareCrop(fill=(255, 0, 0)), ["SquareCrop", "fill", "[0, 1]", "(255, 0, 0)"]),
    (lambda: RandomIoUCrop(min_scale=0.8, max_scale=0.5),
     ["RandomIoUCrop", "(min_scale, max_scale)", "min <= max", "(0.8, 0.5)"]),
    (lambda: RandomIoUCrop(max_scale=2), ["RandomIoUCrop", "max_scale", "at most 1", "2"]),
    (lambda: RandomIoUCrop(min_aspect_ratio=-1),
     ["RandomIoUCrop", "(min_aspect_ratio, max_aspect_ratio)", "(-1, 2.0)"]),
    (lambda: RandomIoUCrop(thresholds=()), ["RandomIoUCrop", "thresholds", "non-empty", "()"]),
    (lambda: RandomIoUCrop(thresholds=0.5), ["RandomIoUCrop", "thresholds", "0.5"]),
    (lambda: RandomIoUCrop(thresholds=(0.1, float("nan"))), ["thresholds", "nan"]),
    (lambda: RandomIoUCrop(trials=0), ["RandomIoUCrop", "trials", "positive int", "0"]),
    (lambda: RandomIoUCrop(attempts=2.5), ["RandomIoUCrop", "attempts", "positive int", "2.5"]),
    (lambda: Letterbox("centre"), ["Letterbox", "position", "'top-left', 'center'", "'centre'"]),
    (lambda: Letterbox(fill=(1, 2)), ["Letterbox", "fill", "3 numbers", "(1, 2)"]),
    (lambda: RandomResizedCrop(0), ["RandomResizedCrop", "size", "got 0"]),
]


@pytest.mark.parametrize("build, fragments", CROP_BAD,
                         ids=[f"crop{k}" for k in range(len(CROP_BAD))])
def test_bad_crop_arguments_are_named(build, fragments):
    with pytest.raises(ValueError) as info:
        build()
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_crop_reprs_are_their_constructor_calls():
    crops = [SquareCrop(), SquareCrop(scales=(0.5, 1.0), tries=10, fill=(0.1, 0.2, 0.3)),
             RandomIoUCrop(), RandomIoUCrop(min_scale=0.5, thresholds=(0.3, 1.0), trials=5,
                                            attempts=3),
             Letterbox(), Letterbox("center", fill=(0.0, 0.0, 0.0)), RandomResizedCrop(320)]
    namespace = {c.__name__: c for c in (SquareCrop, RandomIoUCrop, Letterbox,
                                         RandomResizedCrop)}
    for crop in crops:
        again = eval(repr(crop), namespace)
        assert type(again) is type(crop) and repr(again) == repr(crop)


# ------------------------------------------------------------------ the readers


def _tiny_coco(tmp_path, files):
    images = [{"id": 10 + k, "file_name": os.path.basename(p)} for k, p in enumerate(files)]
    anns = [{"id": 1, "image_id": 10, "bbox": [10, 10, 50, 60], "category_id": 1}]
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps({"images": images, "annotations": anns,
                               "categories": [{"id": 1, "name": "thing"}]}))
    return os.path.dirname(files[0]), str(ann)


def test_reader_arguments_are_named(files, tmp_path):
    root, ann = _tiny_coco(tmp_path, files)
    with pytest.raises(FileNotFoundError, match="CocoDetection: ann_file .*nope.json' does not "
                       "exist; expected COCO's annotation JSON"):
        CocoDetection(root, str(tmp_path / "nope.json"))
    # The arguments swapped: the folder where the JSON belongs.
    with pytest.raises(IsADirectoryError, match="CocoDetection: ann_file .* is a folder; "
                       "expected COCO's annotation JSON .*root, the images' folder, then "
                       "ann_file"):
        CocoDetection(ann, root)
    with pytest.raises(TypeError, match=r"CocoDetection: root must be a path \(str or "
                       r"os.PathLike\), got None"):
        CocoDetection(None, ann)
    with pytest.raises(FileNotFoundError, match="CocoDetection: root .*nowhere' is not a "
                       "folder; expected the folder of the images"):
        CocoDetection(str(tmp_path / "nowhere"), ann)
    with pytest.raises(TypeError, match="CocoDetection: ann_file must be a path.*got None"):
        CocoDetection(root, None)
    with pytest.raises(ValueError, match="CocoDetection: include_crowd must be True or False, "
                       "got 1"):
        CocoDetection(root, ann, include_crowd=1)
    # The shared options are named with the reader's name.
    with pytest.raises(ValueError, match="CocoDetection: size must be .* got 0"):
        CocoDetection(root, ann, size=0)
    with pytest.raises(ValueError, match="CocoDetection: min_size must be .* got -1"):
        CocoDetection(root, ann, min_size=-1)
    ds = CocoDetection(root, ann, size=64, max_requests=4)
    assert len(ds) == len(files) and list(ds.image_ids) == list(range(10, 10 + len(files)))
    text = repr(ds)
    assert text.startswith("CocoDetection(root=") and "instances.json" in text
    assert f"{len(files)} images" in text and "1 boxes" in text and "size=(64, 64)" in text


def test_wider_face_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"WiderFace: split must be one of \('train', 'val', "
                       r"'test'\), got 'training'"):
        WiderFace(tmp_path, split="training")
    with pytest.raises(ValueError, match="WiderFace: split must be one of .* got None"):
        WiderFace(tmp_path, split=None)
    with pytest.raises(TypeError, match="WiderFace: root must be a path .* got 5"):
        WiderFace(5)
    # A root without the official layout: the file looked for and the layout expected.
    with pytest.raises(FileNotFoundError) as info:
        WiderFace(tmp_path)
    msg = str(info.value)
    assert "WiderFace: no wider_face_train_bbx_gt.txt for split='train'" in msg
    assert str(tmp_path) in msg and "root/WIDER_{split}/images/" in msg
    with pytest.raises(FileNotFoundError, match="no wider_face_test_filelist.txt for "
                       "split='test' under annotations"):
        WiderFace(tmp_path, split="test", annotations=tmp_path)
    split = tmp_path / "wider_face_split"
    split.mkdir()
    (split / "wider_face_val_bbx_gt.txt").write_text("a.jpg\n1\n1 2 3 4 0 0 0 0 0 0 \n")
    with pytest.raises(FileNotFoundError, match="WiderFace: the images' folder .*WIDER_val/"
                       "images' is not a folder; expected the images of split='val'"):
        WiderFace(tmp_path, split="val")
    (tmp_path / "WIDER_val" / "images").mkdir(parents=True)
    ds = WiderFace(tmp_path, split="val", size=32, max_requests=4)
    assert len(ds) == 1 and ds.classes == {0: "face"}
    assert repr(ds).startswith(f"WiderFace(root={str(tmp_path)!r}, split='val', 1 images")


# ------------------------------------------------------------------ the map-style face


def test_repr_len_and_indexing(files):
    ds = make(files, size=64, crop=Letterbox(), flip=0)
    assert len(ds) == len(files)
    text = repr(ds)
    for part in ("DetectionFiles(", f"{len(files)} images", "crop=Letterbox(position='top-left')",
                 f"{ds.num_boxes} boxes", "size=(64, 64)", "box_format='xyxy'",
                 "min_size=1.0", "min_area=1.0", "output='float32'"):
        assert part in text, (part, text)
    image, target = ds[2]
    assert image.shape == (3, 64, 64) and image.dtype == np.float32
    assert 0.0 <= image.min() and image.max() <= 1.0   # no mean/std: [0, 1]
    assert set(target) == {"boxes", "labels", "image_id"}
    assert target["boxes"].dtype == np.float32 and target["boxes"].shape == (3, 4)
    assert target["labels"].dtype == np.int64 and list(target["labels"]) == LABELS[2]
    assert type(target["image_id"]) is int and target["image_id"] == 2
    # Letterbox of a 256 x 256 image into 64 x 64: boxes scaled by 1/4.
    np.testing.assert_allclose(target["boxes"], np.array(BOXES[2], np.float32) / 4)
    assert ds[-1][1]["image_id"] == len(files) - 1
    assert ds[np.int64(3)][1]["image_id"] == 3
    with pytest.raises(IndexError, match=f"index {len(files)} is out of range for a dataset "
                       f"of {len(files)} images"):
        ds[len(files)]
    with pytest.raises(IndexError, match="index -7 is out of range"):
        ds[-7]
    with pytest.raises(TypeError, match="int index; wrap them in netcl_loader.Subset"):
        ds[0:2]
    with pytest.raises(TypeError):
        ds["0"]
    with pytest.raises(IndexError, match="index 99 is out of range"):
        ds.gather_batch([0, 99], np.empty)
    with pytest.raises(IndexError, match="index 6 is out of range"):
        ds.boxes_of(6)
    b, lab = ds.boxes_of(0)
    b[:] = -1   # a copy: the dataset's boxes are untouched
    assert ds.boxes_of(0)[0].min() >= 0 and list(lab) == LABELS[0]


def test_an_image_without_boxes_and_every_box_dropped(files):
    # min_size larger than the output: every box is dropped at the end.
    for ds, counts in ((make(files, size=48, min_size=1000), [0] * len(files)),
                       (make(files, size=48, crop=Letterbox()), [len(b) for b in BOXES])):
        for nw in (0, 2):
            with DataLoader(ds, batch_size=4, shuffle=False, num_workers=nw) as dl:
                got = list(dl)
            assert [len(images) for images, _ in got] == [4, 2]
            images, t = got[0]
            assert t["boxes"].shape == (sum(counts[:4]), 4) and t["boxes"].dtype == np.float32
            assert t["labels"].dtype == np.int64 and t["offsets"].dtype == np.int64
            assert list(np.diff(t["offsets"])) == counts[:4]
            assert list(t["image_id"]) == [0, 1, 2, 3]
        image, target = ds[1]   # the image given no box
        assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)


def test_an_empty_dataset(files):
    ds = DetectionFiles([], [], [])
    assert len(ds) == 0 and ds.num_boxes == 0
    assert list(DataLoader(ds, batch_size=2, num_workers=0)) == []


def test_pickled_datasets_give_the_same_samples(files, tmp_path):
    root, ann = _tiny_coco(tmp_path, files)
    for ds in (make(files, size=48, crop=RandomIoUCrop()), CocoDetection(root, ann, size=48)):
        again = pickle.loads(pickle.dumps(ds))
        assert type(again) is type(ds) and repr(again) == repr(ds)
        for i in range(len(ds)):
            np.random.seed(i)
            a = ds[i]
            np.random.seed(i)
            b = again[i]
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1]["boxes"], b[1]["boxes"])
            np.testing.assert_array_equal(a[1]["labels"], b[1]["labels"])
    assert again.classes == ds.classes


def _copy(batch):
    images, t = batch
    return images.copy(), {k: v.copy() for k, v in t.items()}


def test_spawned_workers_give_the_forked_batches(files):
    ds = make(files, size=48, crop=SquareCrop(), output="uint8")
    kw = dict(batch_size=4, shuffle=True, seed=5)
    with DataLoader(ds, num_workers=0, **kw) as dl:
        ref = [_copy(b) for b in dl]
    with DataLoader(ds, num_workers=2, multiprocessing_context="spawn", **kw) as dl:
        got = [_copy(b) for b in dl]
    assert len(got) == len(ref)
    for (a, ta), (b, tb) in zip(got, ref):
        np.testing.assert_array_equal(a, b)
        for key in ta:
            np.testing.assert_array_equal(ta[key], tb[key])


def collate_samples(batch):
    """A collate of the user's: the samples as they come, in torchvision's layout."""
    return tuple(zip(*batch))


def test_numpy_face_with_a_collate_of_the_users(files):
    ds = make(files, size=48, crop=SquareCrop())
    with DataLoader(ds, batch_size=3, shuffle=True, seed=3, num_workers=0) as dl:
        ref = [_copy(b) for b in dl]
    for nw in (0, 2):
        with DataLoader(ds, batch_size=3, shuffle=True, seed=3, num_workers=nw,
                        collate_fn=collate_samples) as dl:
            got = list(dl)
        assert len(got) == len(ref)
        for (images, targets), (rimages, rt) in zip(got, ref):
            assert isinstance(images, tuple) and isinstance(targets, tuple)
            np.testing.assert_array_equal(np.stack(images), rimages)
            o = rt["offsets"]
            for j, tgt in enumerate(targets):
                np.testing.assert_array_equal(tgt["boxes"], rt["boxes"][o[j]:o[j + 1]])
                np.testing.assert_array_equal(tgt["labels"], rt["labels"][o[j]:o[j + 1]])
                assert tgt["image_id"] == rt["image_id"][j]


def test_netcl_subsets_keep_the_batch_path(files):
    ds = make(files, size=48, crop=Letterbox())
    part = Subset(ds, [5, 1, 2])
    images, t = next(iter(DataLoader(part, batch_size=3, shuffle=False, num_workers=0)))
    assert list(t["image_id"]) == [5, 1, 2] and list(np.diff(t["offsets"])) == [1, 0, 3]
    a, b = random_split(ds, [4, 2], seed=0)
    got = [tb for _, tb in DataLoader(a, batch_size=4, shuffle=False, num_workers=0)]
    assert sorted(got[0]["image_id"].tolist()) == sorted(int(ds.image_ids[i]) for i in a.indices)


# ------------------------------------------------------------------ the PyTorch face


def _torch():
    torch = pytest.importorskip("torch")
    from netcl_loader.torch import DataLoader as TorchLoader
    return torch, TorchLoader


def check_targets_as_torchvision_does(torch, images, targets):
    """What torchvision's detection models check of their input in training
    (``GeneralizedRCNN.forward``, ``RoIHeads.check_targets``), written out."""
    assert isinstance(images, torch.Tensor) and images.dim() == 4 and images.shape[1] == 3
    assert images.dtype == torch.float32
    assert isinstance(targets, list) and len(targets) == len(images)
    for t in targets:
        boxes = t["boxes"]
        assert isinstance(boxes, torch.Tensor) and boxes.dim() == 2 and boxes.shape[-1] == 4
        assert boxes.dtype in (torch.float, torch.double, torch.half)
        assert t["labels"].dtype == torch.int64 and t["labels"].shape == (len(boxes),)
        # "All bounding boxes should have positive height and width."
        assert not (boxes[:, 2:] <= boxes[:, :2]).any()


class TinyDetector:
    """A real (tiny) model trained on the targets: a conv, pooled, regresses each image's
    mean box and classifies its first label (images without boxes add no loss)."""

    def __init__(self, torch, num_classes=8):
        torch.manual_seed(0)
        self.torch = torch
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=4)
        self.box = torch.nn.Linear(8, 4)
        self.cls = torch.nn.Linear(8, num_classes)
        self.params = [*self.conv.parameters(), *self.box.parameters(), *self.cls.parameters()]

    def __call__(self, images, targets):
        torch = self.torch
        check_targets_as_torchvision_does(torch, images, targets)
        feats = self.conv(images).mean(dim=(2, 3))
        losses = {"box": feats.sum() * 0, "cls": feats.sum() * 0}
        for j, t in enumerate(targets):
            if len(t["boxes"]):
                scale = images.shape[-1]
                losses["box"] = losses["box"] + torch.nn.functional.smooth_l1_loss(
                    self.box(feats[j]), t["boxes"].mean(dim=0) / scale)
                losses["cls"] = losses["cls"] + torch.nn.functional.cross_entropy(
                    self.cls(feats[j])[None], t["labels"][:1])
        return losses


def test_a_torchvision_style_training_loop(files):
    torch, TorchLoader = _torch()
    ds = make(files, size=64, crop=RandomIoUCrop(), flip=0.5)
    model = TinyDetector(torch)
    opt = torch.optim.SGD(model.params, lr=0.01)
    seen = 0
    for nw in (0, 2):
        loader = TorchLoader(ds, batch_size=4, shuffle=True, num_workers=nw, seed=1)
        for images, targets in loader:
            losses = model(images, targets)
            loss = sum(losses.values())
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert torch.isfinite(loss)
            seen += len(targets)
            for t in targets:
                assert type(t["image_id"]) is int and 0 <= t["image_id"] < len(ds)
                b = t["boxes"]
                assert (b >= 0).all() and (b[:, 2] <= 64).all() and (b[:, 3] <= 64).all()
    assert seen == 2 * len(ds)


def test_torch_face_default_collate_explicit_and_without_batching(files):
    torch, TorchLoader = _torch()
    from torch.utils.data import default_collate
    ds = make(files, size=48, crop=Letterbox(), flip=0)
    images, targets = next(iter(TorchLoader(ds, batch_size=3, collate_fn=default_collate)))
    assert isinstance(targets, list) and [t["image_id"] for t in targets] == [0, 1, 2]
    # batch_size=None: each sample as the dataset gives it, its arrays made tensors.
    sample = next(iter(TorchLoader(ds, batch_size=None)))
    image, target = sample
    assert isinstance(image, torch.Tensor) and image.shape == (3, 48, 48)
    assert isinstance(target, dict) and target["boxes"].dtype == torch.float32
    assert target["labels"].dtype == torch.int64 and target["image_id"] == 0


def test_torch_face_with_a_collate_of_the_users(files):
    torch, TorchLoader = _torch()
    ds = make(files, size=48, crop=SquareCrop())
    ref = list(TorchLoader(ds, batch_size=3, shuffle=True, seed=4))
    for nw in (0, 2):
        got = list(TorchLoader(ds, batch_size=3, shuffle=True, seed=4, num_workers=nw,
                               collate_fn=collate_samples))
        assert len(got) == len(ref)
        for (images, targets), (rimages, rtargets) in zip(got, ref):
            assert isinstance(images, tuple) and isinstance(targets, tuple)
            assert torch.equal(torch.stack(images), rimages)
            for tgt, rt in zip(targets, rtargets):
                assert tgt["boxes"].dtype == torch.float32 and tgt["labels"].dtype == torch.int64
                assert torch.equal(tgt["boxes"], rt["boxes"])
                assert torch.equal(tgt["labels"], rt["labels"])
                assert tgt["image_id"] == rt["image_id"]


def _same_torch_batches(torch, a, b):
    assert len(a) == len(b)
    for (ia, ta), (ib, tb) in zip(a, b):
        assert torch.equal(ia, ib) and len(ta) == len(tb)
        for x, y in zip(ta, tb):
            assert torch.equal(x["boxes"], y["boxes"]) and torch.equal(x["labels"], y["labels"])
            assert x["image_id"] == y["image_id"]


def _clone(torch, batch):
    images, targets = batch
    return images.clone(), [{"boxes": t["boxes"].clone(), "labels": t["labels"].clone(),
                             "image_id": t["image_id"]} for t in targets]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_face_resumes_mid_epoch(files, num_workers):
    torch, TorchLoader = _torch()
    ds = make(files, size=48, crop=RandomIoUCrop(), output="uint8")
    kw = dict(batch_size=2, shuffle=True, seed=17, num_workers=num_workers)
    loader = TorchLoader(ds, **kw)
    loader.set_epoch(1)
    full = [_clone(torch, b) for b in loader]
    loader = TorchLoader(ds, **kw)
    loader.set_epoch(1)
    it = iter(loader)
    head = [_clone(torch, next(it))]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    _same_torch_batches(torch, head, full[:1])
    # Resumed with the other num_workers: the same batches still.
    again = TorchLoader(ds, **dict(kw, num_workers=2 - num_workers))
    again.load_state_dict(state)
    rest = [_clone(torch, b) for b in again]
    _same_torch_batches(torch, rest, full[1:])
    assert all(isinstance(t, list) for _, t in rest)


def test_torch_subsets(files):
    torch, TorchLoader = _torch()
    ds = make(files, size=48, crop=Letterbox(), flip=0)
    # netcl's random_split keeps the list of dicts.
    a, _ = random_split(ds, [4, 2], seed=1)
    _, targets = next(iter(TorchLoader(a, batch_size=4)))
    assert isinstance(targets, list) and len(targets) == 4
    # torch's own Subset hides the batch path: samples collate one by one, which
    # differing box counts cannot (the README's advice: torchvision's collate).
    part = torch.utils.data.Subset(ds, [0, 1, 2])
    with pytest.raises(CollateError, match=re.escape("[1]['boxes']")):
        next(iter(TorchLoader(part, batch_size=3)))
    images, targets = next(iter(TorchLoader(part, batch_size=3, collate_fn=collate_samples)))
    assert [t["image_id"] for t in targets] == [0, 1, 2]
    assert [len(t["boxes"]) for t in targets] == [len(BOXES[i]) for i in range(3)]


# A sampler or batch sampler of the user's hands the in-process fetcher its indices as
# a list; workers receive them as an int64 array.  Both must take the batch path
# (gather_batch): collated sample by sample, differing box counts would fail.
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sampler_of_the_users(files, num_workers):
    ds = make(files, size=48, crop=Letterbox(), flip=0)
    with DataLoader(ds, batch_size=3, sampler=[5, 4, 3, 2, 1, 0],
                    num_workers=num_workers) as dl:
        _, t = next(iter(dl))
    assert list(t["image_id"]) == [5, 4, 3]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_face_with_a_distributed_sampler(files, num_workers):
    torch, TorchLoader = _torch()
    from torch.utils.data import DistributedSampler
    ds = make(files, size=48, crop=Letterbox(), flip=0)
    sampler = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False)
    got = list(TorchLoader(ds, batch_size=2, sampler=sampler, num_workers=num_workers))
    assert [t["image_id"] for _, ts in got for t in ts] == [0, 2, 4]


def test_threads_decoding_one_dataset_each_get_their_own_boxes(files):
    # The decoder releases the GIL: a thread pool calling dataset[i] (torchdata's
    # thread mappers, a user's executor) decodes samples of one dataset at once.
    from concurrent.futures import ThreadPoolExecutor
    many = list(files) * 20
    ds = DetectionFiles(many, BOXES * 20, LABELS * 20, size=160, crop=Letterbox(), flip=0)
    ref = [ds[i][1] for i in range(len(ds))]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: ds[i][1], range(len(ds))))
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a["boxes"], b["boxes"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
        assert a["image_id"] == b["image_id"]


def test_readers_check_their_options_before_reading_the_annotations(tmp_path):
    # A bad option is named at once, before a (large) annotation file is parsed: here
    # the file is not even there, and the option's error comes first.
    missing = str(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="CocoDetection: size must be .* got 0"):
        CocoDetection(tmp_path, missing, size=0)
    with pytest.raises(ValueError, match="CocoDetection: crop must be a crop object, got the "
                       "class Letterbox"):
        CocoDetection(tmp_path, missing, crop=Letterbox)
    with pytest.raises(ValueError, match="WiderFace: min_area must be .* got -1"):
        WiderFace(tmp_path, min_area=-1)
    with pytest.raises(ValueError, match="WiderFace: crop RandomResizedCrop.* size is "
                       r"\(320, 320\)"):
        WiderFace(tmp_path, size=320, crop=RandomResizedCrop(224))


def test_flat_storage_keeps_every_label_and_names_the_bad_box_of_a_later_image(files):
    # An image without labels (an empty list: float) must not make the others float.
    ds = DetectionFiles(files[:3], [[[0, 0, 5, 5]], [], [[1, 1, 4, 4]]],
                        [[2 ** 60 + 1], [], np.array([3], np.uint8)])
    assert ds._labels.dtype == np.int64 and list(ds._labels) == [2 ** 60 + 1, 3]
    assert list(ds._offsets) == [0, 1, 1, 2]
    # The coordinates are checked over the flat array: the error still names the image
    # and the box within it.
    with pytest.raises(ValueError, match=r"img2.jpg' \(index 2\), box 1 \[9.0, 1.0, 4.0, "
                       r"4.0\] \(xyxy\): its width or height is negative"):
        DetectionFiles(files[:3], [[[0, 0, 5, 5]], [], [[1, 1, 4, 4], [9, 1, 4, 4]]],
                       [[1], [], [1, 2]])


def test_letterbox_boxes_map_back_to_the_source_as_the_readme_says(files):
    # README: the boxes are only scaled, by round(W * s) / W across and round(H * s) / H
    # down with s = min(h / H, w / W); dividing by those gives the source boxes.
    h, w = 96, 128
    ds = make(files, size=(h, w), crop=Letterbox(), flip=0)
    for i, (width, height) in enumerate(SIZES):
        _, target = ds[i]
        s = min(h / height, w / width)
        back = target["boxes"] / np.array([round(width * s) / width, round(height * s) / height,
                                           round(width * s) / width, round(height * s) / height])
        given = np.array(BOXES[i], np.float64).reshape(-1, 4)
        given = np.clip(given, 0, [width, height, width, height])
        np.testing.assert_allclose(back, given, atol=1e-3)
