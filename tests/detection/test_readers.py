"""The detection readers: WIDER FACE's ground-truth text and COCO's JSON, on small trees in
the official layouts made from real photos (boxes synthetic)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from detection_trees import make_coco, make_wider, write_photo
from netcl_loader.images._readers import (WIDER_ATTRIBUTES, parse_coco, parse_wider,
                                          parse_wider_list)


def _write(tmp_path, text, name="gt.txt"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------- WIDER FACE


def test_parse_wider_official_layout(tmp_path):
    gt, expected = make_wider(str(tmp_path))
    names, boxes, attrs = parse_wider(gt)
    assert names == [e[0] for e in expected]
    for (name, want_b, want_a), b, a in zip(expected, boxes, attrs):
        assert b.dtype == np.float32 and b.shape == want_b.shape, name
        assert a.dtype == np.int8 and a.shape == want_a.shape, name
        np.testing.assert_array_equal(b, want_b)
        np.testing.assert_array_equal(a, want_a)
        assert os.path.isfile(tmp_path / "WIDER_train" / "images" / name)
    # The zero-face image and the image whose only face has zero height are kept, empty.
    assert boxes[1].shape == (0, 4) and boxes[3].shape == (0, 4)
    # Readme order: the ninth column (index 4 of the attributes) is occlusion.
    assert WIDER_ATTRIBUTES[4] == "occlusion" and attrs[0][1, 4] == 2 and attrs[0][1, 5] == 1


def test_parse_wider_tolerates_crlf_and_trailing_blank_lines(tmp_path):
    text = "a/b.jpg\r\n1\r\n1 2 3 4 0 0 0 0 0 0 \r\nc/d.jpg\r\n0\r\n0 0 0 0 0 0 0 0 0 0\r\n\r\n\n"
    path = tmp_path / "gt.txt"
    path.write_bytes(text.encode())
    names, boxes, _ = parse_wider(str(path))
    assert names == ["a/b.jpg", "c/d.jpg"]
    np.testing.assert_array_equal(boxes[0], [[1, 2, 3, 4]])
    assert boxes[1].shape == (0, 4)


@pytest.mark.parametrize("text, line, words", [
    ("a.jpg\nmany\n", 2, "number of faces"),
    ("a.jpg\n-1\n", 2, "number of faces"),
    ("a.jpg\n1\n1 2 3 4 0 0 0 0 0\n", 3, "10 integers"),
    ("a.jpg\n1\n1 2 3 4.5 0 0 0 0 0 0\n", 3, "10 integers"),
    ("a.jpg\n0\n1 0 0 0 0 0 0 0 0 0\n", 3, "all zeros"),
    ("a.jpg\n0\nb.jpg\n1\n1 2 3 4 0 0 0 0 0 0\n", 3, "10 integers"),   # the zero line missing
    ("a.jpg\n2\n1 2 3 4 0 0 0 0 0 0\n", 2, "ends inside"),
    ("a.jpg\n1\n1 2 -3 4 0 0 0 0 0 0\n", 3, "negative width"),
    ("a.jpg\n1\n1 2 3 4 0 0 0 2 0 0\n", 3, "invalid=2"),
    ("a.jpg\n1\n1 2 3 4 0 0 0 0 0 0\n\nb.jpg\n0\n0 0 0 0 0 0 0 0 0 0\n", 4, "blank line"),
    ("a.jpg\n", 1, "number of faces"),
])
def test_parse_wider_malformed_names_file_and_line(tmp_path, text, line, words):
    path = _write(tmp_path, text, "wider_face_train_bbx_gt.txt")
    with pytest.raises(ValueError) as err:
        parse_wider(path)
    msg = str(err.value)
    assert path in msg and f"line {line}:" in msg and words in msg, msg


def test_parse_wider_reads_a_file_with_a_byte_order_mark(tmp_path):
    # Saved by an editor that writes a UTF-8 BOM: the first path is "a/b.jpg",
    # not "\ufeffa/b.jpg" (which failed later as a missing image).
    path = tmp_path / "wider_face_train_bbx_gt.txt"
    path.write_bytes(b"\xef\xbb\xbfa/b.jpg\n1\n1 2 3 4 0 0 0 0 0 0\n")
    names, boxes, _ = parse_wider(str(path))
    assert names == ["a/b.jpg"]
    np.testing.assert_array_equal(boxes[0], [[1, 2, 3, 4]])
    listed = tmp_path / "wider_face_test_filelist.txt"
    listed.write_bytes(b"\xef\xbb\xbfa/b.jpg\nc/d.jpg\n")
    assert parse_wider_list(str(listed)) == ["a/b.jpg", "c/d.jpg"]


@pytest.mark.parametrize("text, words", [
    # The count says 1, two face lines follow: the second was taken for a path.
    ("a.jpg\n1\n1 2 3 4 0 0 0 0 0 0\n5 6 7 8 0 0 0 0 0 0\nb.jpg\n0\n0 0 0 0 0 0 0 0 0 0\n",
     "announces 1 faces, but more face lines follow"),
    # The count says 3, two face lines follow, then the next image's path.
    ("a.jpg\n3\n1 2 3 4 0 0 0 0 0 0\n5 6 7 8 0 0 0 0 0 0\nb.jpg\n0\n0 0 0 0 0 0 0 0 0 0\n",
     "announces 3 faces, but only 2 face lines follow before the path 'b.jpg'"),
])
def test_parse_wider_a_count_that_disagrees_with_its_lines_names_the_count_line(tmp_path, text,
                                                                               words):
    path = _write(tmp_path, text, "wider_face_train_bbx_gt.txt")
    with pytest.raises(ValueError) as err:
        parse_wider(path)
    msg = str(err.value)
    assert path in msg and "line 2:" in msg and "'a.jpg'" in msg and words in msg, msg


# ----------------------------------------------------------------------------- COCO


def test_parse_coco_official_layout(tmp_path):
    ann, _ = make_coco(str(tmp_path))
    out = parse_coco(ann)
    # Sorted by image id (torchvision's CocoDetection order).
    assert out["file_names"] == ["000000000007.jpg", "000000000019.jpg", "000000000042.jpg"]
    assert out["image_ids"].dtype == np.int64
    np.testing.assert_array_equal(out["image_ids"], [7, 19, 42])
    assert out["classes"] == {1: "person", 3: "car"}
    b7, b19, b42 = out["boxes"]
    np.testing.assert_array_equal(b7, [[0, 0, 100, 50]])
    assert b19.shape == (0, 4) and b19.dtype == np.float32     # no annotation: kept, empty
    np.testing.assert_array_equal(b42, [[10.5, 20.25, 30, 40], [200, 100, 50, 60], [5, 6, 7, 8]])
    np.testing.assert_array_equal(out["labels"][2], [3, 1, 1])
    assert out["labels"][1].dtype == np.int64 and out["labels"][1].shape == (0,)
    np.testing.assert_array_equal(out["crowd"][2], [False, True, False])
    np.testing.assert_array_equal(out["crowd"][0], [False])


def test_parse_coco_image_info_file_without_annotations(tmp_path):
    path = _write(tmp_path, json.dumps({"images": [{"id": 3, "file_name": "a.jpg"}]}), "i.json")
    out = parse_coco(path)
    assert out["file_names"] == ["a.jpg"] and out["classes"] == {}
    assert out["boxes"][0].shape == (0, 4)


def _mask_counts(mask):
    """COCO's run lengths of a mask: column-major, alternating 0s and 1s from 0s."""
    flat = np.asarray(mask, np.uint8).ravel(order="F")
    counts, value, run = [], 0, 0
    for v in flat:
        if v == value:
            run += 1
        else:
            counts.append(run)
            value, run = v, 1
    counts.append(run)
    return counts


def _rle_string(counts):
    """pycocotools' rleToString, written from its definition."""
    out = []
    for i, x in enumerate(counts):
        if i > 2:
            x -= counts[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = (x != -1) if c & 0x10 else (x != 0)
            out.append(chr((c | 0x20 if more else c) + 48))
    return "".join(out)


def test_coco_annotations_with_only_a_segmentation_take_its_extent(tmp_path):
    # The rule: no bbox, a segmentation -> the segmentation's extent (as
    # COCO's bbox is); an empty mask -> left out.  Before, the whole file
    # was an error.
    rng = np.random.default_rng(4)
    h, w = 37, 53
    mask = np.zeros((h, w), bool)
    mask[5:20, 9:31] = rng.random((15, 22)) < 0.7
    mask[5, 9] = mask[19, 30] = True
    ys, xs = np.nonzero(mask)
    tight = [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
    counts = _mask_counts(mask)
    anns = [
        {"id": 1, "image_id": 6, "category_id": 1,
         "segmentation": [[10.5, 2, 40, 8.25, 20, 30], [5, 12, 7, 13]]},
        {"id": 2, "image_id": 6, "category_id": 1, "iscrowd": 1,
         "segmentation": {"size": [h, w], "counts": _rle_string(counts)}},
        {"id": 3, "image_id": 6, "category_id": 1, "iscrowd": 1,
         "segmentation": {"size": [h, w], "counts": counts}},
        {"id": 4, "image_id": 6, "category_id": 1, "iscrowd": 1,
         "segmentation": {"size": [h, w], "counts": [h * w]}},   # empty: left out
        {"id": 5, "image_id": 6, "category_id": 1, "bbox": [1, 2, 3, 4]},
    ]
    doc = _coco_doc()
    doc["annotations"] = anns
    path = _write(tmp_path, json.dumps(doc), "seg.json")
    out = parse_coco(path)
    boxes = out["boxes"][out["image_ids"].tolist().index(6)]
    np.testing.assert_allclose(boxes, [[5, 2, 35, 28], tight, tight, [1, 2, 3, 4]])
    doc["annotations"] = [{"id": 9, "image_id": 6, "category_id": 1, "segmentation": "x"}]
    path = _write(tmp_path, json.dumps(doc), "bad.json")
    with pytest.raises(ValueError) as err:
        parse_coco(path)
    assert "annotations[0] (id 9).segmentation" in str(err.value) and "six.jpg" in str(err.value)


def _coco_doc(**change):
    doc = {"images": [{"id": 5, "file_name": "five.jpg"}, {"id": 6, "file_name": "six.jpg"}],
           "annotations": [{"id": 11, "image_id": 6, "bbox": [1, 2, 3, 4], "category_id": 1,
                            "iscrowd": 0}],
           "categories": [{"id": 1, "name": "face"}]}
    for key, value in change.items():
        if key.startswith("ann_"):
            doc["annotations"][0][key[4:]] = value
        else:
            doc[key] = value
    return doc


@pytest.mark.parametrize("doc, words", [
    (_coco_doc(ann_bbox=[1, 2, 3]), ["annotations[0] (id 11).bbox", "'six.jpg'", "4 finite"]),
    (_coco_doc(ann_bbox=[1, 2, float("nan"), 4]), ["annotations[0] (id 11).bbox", "six.jpg"]),
    (_coco_doc(ann_bbox=[1, 2, -3, 4]), ["annotations[0] (id 11).bbox", "six.jpg", "negative"]),
    (_coco_doc(ann_image_id=99), ["annotations[0] (id 11)", "image_id 99"]),
    (_coco_doc(ann_category_id=2), ["annotations[0] (id 11).category_id", "six.jpg"]),
    (_coco_doc(ann_iscrowd=2), ["annotations[0] (id 11).iscrowd", "six.jpg", "0 or 1"]),
    (_coco_doc(images=[{"id": 5, "file_name": "a.jpg"}, {"id": 5, "file_name": "b.jpg"}]),
     ["images[1]", "image id 5 appears twice"]),
    (_coco_doc(images=[{"id": "5", "file_name": "a.jpg"}]), ["images[0]", "integer 'id'"]),
    (_coco_doc(images=[{"id": 5}]), ["images[0]", "file_name"]),
    (_coco_doc(categories=[{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]),
     ["categories[1]", "category id 1 appears twice"]),
    ({"annotations": []}, ["top level", "'images'"]),
    (_coco_doc(annotations={"a": 1}), ["annotations", "expected a list"]),
    ([1, 2], ["top level", "JSON object"]),
])
def test_parse_coco_malformed_names_file_key_and_image(tmp_path, doc, words):
    path = _write(tmp_path, json.dumps(doc), "instances_bad.json")
    with pytest.raises(ValueError) as err:
        parse_coco(path)
    msg = str(err.value)
    assert path in msg and all(w in msg for w in words), msg


def test_parse_coco_not_json_names_the_line(tmp_path):
    path = _write(tmp_path, '{"images": [\n  {"id": 1, "file_name": "a.jpg"},\n  oops\n]}',
                  "instances_bad.json")
    with pytest.raises(ValueError) as err:
        parse_coco(path)
    msg = str(err.value)
    assert path in msg and "line 3" in msg and "not valid JSON" in msg, msg


# ----------------------------------------------------------------------------- datasets


def _xyxy(xywh):
    b = np.asarray(xywh, np.float32).reshape(-1, 4)
    return np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], axis=1)


def test_wider_face_dataset_delivers_the_kept_faces(tmp_path):
    from netcl_loader.images import Letterbox, WiderFace
    _, expected = make_wider(str(tmp_path))
    # Letterbox onto the images' own size: boxes come back as given (XYWH -> XYXY).
    ds = WiderFace(str(tmp_path), "train", size=(240, 320), crop=Letterbox(), flip=0.0)
    assert len(ds) == len(expected) and ds.classes == {0: "face"} and ds.split == "train"
    assert ds.attribute_names == WIDER_ATTRIBUTES
    for i, (name, want_b, want_a) in enumerate(expected):
        assert ds.path(i) == os.path.join(str(tmp_path), "WIDER_train", "images", name)
        image, target = ds[i]
        assert image.shape == (3, 240, 320) and image.dtype == np.float32
        assert 0.0 <= image.min() and image.max() <= 1.0     # no mean/std: [0, 1]
        np.testing.assert_allclose(target["boxes"], _xyxy(want_b), atol=1e-3)
        np.testing.assert_array_equal(target["labels"], np.zeros(len(want_b), np.int64))
        assert target["image_id"] == i
        a, e = ds.attribute_offsets[i], ds.attribute_offsets[i + 1]
        np.testing.assert_array_equal(ds.attributes[a:e], want_a)


def test_wider_face_through_the_loader(tmp_path):
    from netcl_loader import DataLoader
    from netcl_loader.images import SquareCrop, WiderFace
    make_wider(str(tmp_path))
    ds = WiderFace(str(tmp_path), size=128, crop=SquareCrop())
    batches = list(DataLoader(ds, batch_size=4, num_workers=0, seed=3))
    assert len(batches) == 1
    images, t = batches[0]
    assert images.shape == (4, 3, 128, 128)
    assert t["offsets"].shape == (5,) and t["offsets"][0] == 0
    assert t["offsets"][-1] == len(t["boxes"]) == len(t["labels"])
    np.testing.assert_array_equal(np.sort(t["image_id"]), np.arange(4))
    assert (t["labels"] == 0).all()
    assert ((t["boxes"] >= 0) & (t["boxes"] <= 128)).all()


def test_wider_face_test_split_has_no_boxes(tmp_path):
    from netcl_loader.images import Letterbox, WiderFace
    rng = np.random.default_rng(1)
    names = ["0--Parade/0_Parade_a.jpg", "1--Handshaking/1_Handshaking_b.jpg"]
    for n in names:
        write_photo(str(tmp_path / "WIDER_test" / "images" / n), rng, (200, 150))
    (tmp_path / "wider_face_split").mkdir()
    (tmp_path / "wider_face_split" / "wider_face_test_filelist.txt").write_text(
        "\n".join(names) + "\n")
    ds = WiderFace(str(tmp_path), "test", size=160, crop=Letterbox())
    assert len(ds) == 2 and ds.num_boxes == 0
    image, target = ds[1]
    assert image.shape == (3, 160, 160) and target["boxes"].shape == (0, 4)


def test_wider_face_errors(tmp_path):
    from netcl_loader.images import WiderFace
    with pytest.raises(ValueError, match="split must be one of"):
        WiderFace(str(tmp_path), "training")
    gt, _ = make_wider(str(tmp_path))
    with open(gt, "a") as f:
        f.write("9--Extra/9_x.jpg\n1\n1 2 3\n")
    with pytest.raises(ValueError) as err:
        WiderFace(str(tmp_path))
    n = sum(1 for _ in open(gt))
    assert gt in str(err.value) and f"line {n}:" in str(err.value)


def test_coco_detection_dataset(tmp_path):
    from netcl_loader.images import CocoDetection, Letterbox
    ann, _ = make_coco(str(tmp_path))
    root = str(tmp_path / "images")
    ds = CocoDetection(root, ann, size=(240, 320), crop=Letterbox(), flip=0.0)
    assert len(ds) == 3 and ds.classes == {1: "person", 3: "car"}
    np.testing.assert_array_equal(ds.image_ids, [7, 19, 42])
    assert ds.path(2) == os.path.join(root, "000000000042.jpg")
    # The crowd box of image 42 is left out; its label goes with it.
    _, t = ds[2]
    np.testing.assert_allclose(t["boxes"], [[10.5, 20.25, 40.5, 60.25], [5, 6, 12, 14]],
                               atol=1e-3)
    np.testing.assert_array_equal(t["labels"], [3, 1])
    assert t["image_id"] == 42
    _, t = ds[1]                        # no annotation: delivered, empty
    assert t["boxes"].shape == (0, 4) and t["labels"].shape == (0,) and t["image_id"] == 19
    # A batch names COCO's ids.
    images, bt = ds.gather_batch([0, 1, 2], np.empty)
    np.testing.assert_array_equal(bt["image_id"], [7, 19, 42])
    np.testing.assert_array_equal(bt["offsets"], [0, 1, 1, 3])
    crowd = CocoDetection(root, ann, size=(240, 320), crop=Letterbox(), flip=0.0,
                          include_crowd=True)
    _, t = crowd[2]
    np.testing.assert_array_equal(t["labels"], [3, 1, 1])
    np.testing.assert_allclose(t["boxes"][1], [200, 100, 250, 160], atol=1e-3)


def test_coco_detection_errors(tmp_path):
    from netcl_loader.images import CocoDetection
    ann, doc = make_coco(str(tmp_path))
    with pytest.raises(ValueError, match="include_crowd must be True or False"):
        CocoDetection(str(tmp_path / "images"), ann, include_crowd="yes")
    doc["annotations"][1]["bbox"] = [0, 0, -1, 5]
    bad = _write(tmp_path, json.dumps(doc), "instances_bad.json")
    with pytest.raises(ValueError) as err:
        CocoDetection(str(tmp_path / "images"), bad)
    msg = str(err.value)
    assert bad in msg and "annotations[1] (id 2).bbox" in msg and "000000000007.jpg" in msg


def test_coco_detection_on_the_pytorch_face(tmp_path):
    torch = pytest.importorskip("torch")
    from netcl_loader.images import CocoDetection, Letterbox
    from netcl_loader.torch import DataLoader
    ann, _ = make_coco(str(tmp_path))
    ds = CocoDetection(str(tmp_path / "images"), ann, size=(240, 320), crop=Letterbox(),
                       flip=0.0)
    (images, targets), = list(DataLoader(ds, batch_size=3, num_workers=0))
    assert isinstance(images, torch.Tensor) and images.shape == (3, 3, 240, 320)
    assert [t["image_id"] for t in targets] == [7, 19, 42]
    assert [len(t["boxes"]) for t in targets] == [1, 0, 2]
    assert targets[2]["labels"].tolist() == [3, 1]
    assert targets[2]["boxes"].dtype == torch.float32


def _mutations(data, rng, n):
    """``n`` damaged copies of ``data``: truncated, bit-flipped, emptied, bytes inserted."""
    for trial in range(n):
        b = bytearray(data)
        kind = trial % 4
        if kind == 0:
            del b[int(rng.integers(0, len(b))):]
        elif kind == 1:
            for p in rng.integers(0, len(b), size=int(rng.integers(1, 6))):
                b[int(p)] ^= 1 << int(rng.integers(8))
        elif kind == 2:
            b = bytearray()
        else:
            p = int(rng.integers(0, len(b)))
            b[p:p] = rng.integers(0, 256, size=int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
        yield bytes(b)


@pytest.mark.parametrize("reader", ["wider", "coco"])
def test_damaged_annotation_files_read_or_fail_naming_the_file(tmp_path, reader):
    """Truncated, bit-flipped, empty and spliced annotation files (non-UTF-8 bytes among
    them) either parse or raise a ValueError that names the file: never another error."""
    if reader == "wider":
        path, _ = make_wider(str(tmp_path / "w"))
        parse = parse_wider
    else:
        path, _ = make_coco(str(tmp_path / "c"))
        parse = parse_coco
    with open(path, "rb") as f:
        data = f.read()
    damaged = str(tmp_path / "damaged.txt")
    refused = 0
    for b in _mutations(data, np.random.default_rng(0), 400):
        with open(damaged, "wb") as f:
            f.write(b)
        try:
            parse(damaged)
        except ValueError as exc:
            assert type(exc) is ValueError and "damaged.txt" in str(exc), repr(exc)
            refused += 1
    assert refused > 100


def test_an_annotation_file_that_is_not_utf8_names_the_file_and_byte(tmp_path):
    gt = tmp_path / "gt.txt"
    gt.write_bytes(b"0--Parade/a.jpg\n1\n\xff\xfe 1 2 3 4 0 0 0 0 0 0\n")
    with pytest.raises(ValueError, match=r"gt\.txt: not UTF-8 text \(byte 18"):
        parse_wider(str(gt))
    ann = tmp_path / "ann.json"
    ann.write_bytes(b'{"images": ["\xc3\x28"]}')
    with pytest.raises(ValueError, match=r"ann\.json.*byte \d+.*not UTF-8 JSON"):
        parse_coco(str(ann))


# ----------------------------------------------------------------------------- EXIF


def _turn_files(folder, orientation):
    """Rewrite every JPEG under ``folder`` stored turned, with the EXIF ``orientation`` that
    displays it as it was (the annotations then hold for the displayed image)."""
    from PIL import Image

    from images_util import encode_oriented_jpeg, stored_for_display
    for dirpath, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".jpg"):
                path = os.path.join(dirpath, name)
                with Image.open(path) as img:
                    shown = np.asarray(img.convert("RGB"))
                with open(path, "wb") as f:
                    f.write(encode_oriented_jpeg(stored_for_display(shown, orientation),
                                                 orientation))


@pytest.mark.parametrize("reader", ["coco", "wider"])
def test_readers_take_exif_orientation_and_name_a_bad_value(tmp_path, reader):
    """CocoDetection and WiderFace pass exif_orientation on: with the files stored turned
    and tagged, their annotations (in the displayed image) give what the untouched tree
    gives; a bad value is named before the annotation file is read."""
    pytest.importorskip("PIL")
    from netcl_loader.images import CocoDetection, Letterbox, WiderFace

    def build(root, **kw):
        if reader == "coco":
            return CocoDetection(os.path.join(root, "images"),
                                 os.path.join(root, "annotations", "instances.json"),
                                 size=64, crop=Letterbox(), flip=0, output="uint8", **kw)
        return WiderFace(root, size=64, crop=Letterbox(), flip=0, output="uint8", **kw)

    make = make_coco if reader == "coco" else make_wider
    plain, turned = str(tmp_path / "plain"), str(tmp_path / "turned")
    make(plain, seed=3)
    make(turned, seed=3)
    _turn_files(turned, 6)
    a, b = build(plain), build(turned, exif_orientation=True)
    assert b.exif_orientation and not a.exif_orientation
    for i in range(len(a)):
        (xa, ta), (xb, tb) = a[i], b[i]
        assert np.abs(xa.astype(float) - xb).mean() <= 2.0, i
        np.testing.assert_allclose(ta["boxes"], tb["boxes"], atol=1e-3)
    name = "CocoDetection" if reader == "coco" else "WiderFace"
    with pytest.raises(ValueError, match=f"{name}: exif_orientation must be True"):
        build(plain, exif_orientation="yes")
