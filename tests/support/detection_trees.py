"""WIDER FACE and COCO trees in their official layouts, made from real photos (boxes
synthetic): the detection readers' tests and the docs' examples read them."""
from __future__ import annotations

import json
import os

import numpy as np

from images_util import encode_jpeg, photo_region
from netcl_loader.images._readers import WIDER_ATTRIBUTES


def write_photo(path, rng, size):
    """A JPEG of ``size`` cut from a sample photo at ``path``, its folders made."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(encode_jpeg(photo_region(rng, size), quality=90))


def _face_line(x, y, w, h, blur=0, expression=0, illumination=0, invalid=0, occlusion=0,
               pose=0):
    # The official files end every face line with a space.
    return f"{x} {y} {w} {h} {blur} {expression} {illumination} {invalid} {occlusion} {pose} "


def make_wider(root, split="train", seed=0, size=(320, 240)):
    """A WIDER FACE tree under ``root``: ``WIDER_{split}/images/<event>/<name>.jpg`` and
    ``wider_face_split/wider_face_{split}_bbx_gt.txt``.

    Returns (gt_file, expected) with ``expected`` a list of (name, kept boxes xywh,
    kept attrs) in file order, as ``parse_wider`` must give them.
    """
    rng = np.random.default_rng(seed)
    entries = [
        ("0--Parade/0_Parade_marchingband_1_1.jpg", [
            (10, 20, 30, 40, dict(blur=2)),
            (100, 50, 12, 15, dict(occlusion=2, pose=1)),
            (5, 5, 8, 9, dict(invalid=1)),          # invalid: left out
            (60, 60, 0, 10, dict()),                # zero width: left out
        ]),
        ("0--Parade/0_Parade_Parade_0_2.jpg", []),  # no face: "0" + one zero line
        ("1--Handshaking/1_Handshaking_3.jpg", [
            (0, 0, 320, 240, dict(expression=1, illumination=1, occlusion=1)),
        ]),
        ("1--Handshaking/1_Handshaking_4.jpg", [
            (200, 100, 10, 0, dict(blur=1)),        # zero height: left out (none kept)
        ]),
    ]
    lines, expected = [], []
    for name, faces in entries:
        write_photo(os.path.join(root, f"WIDER_{split}", "images", name), rng, size)
        lines.append(name)
        lines.append(str(len(faces)))
        if not faces:
            lines.append(_face_line(0, 0, 0, 0))
        kept_b, kept_a = [], []
        for x, y, w, h, attrs in faces:
            lines.append(_face_line(x, y, w, h, **attrs))
            if not attrs.get("invalid") and w > 0 and h > 0:
                kept_b.append((x, y, w, h))
                kept_a.append([attrs.get(k, 0) for k in WIDER_ATTRIBUTES])
        expected.append((name, np.array(kept_b, np.float32).reshape(-1, 4),
                         np.array(kept_a, np.int8).reshape(-1, 6)))
    gt = os.path.join(root, "wider_face_split", f"wider_face_{split}_bbx_gt.txt")
    os.makedirs(os.path.dirname(gt), exist_ok=True)
    with open(gt, "w") as f:
        f.write("\n".join(lines) + "\n")
    return gt, expected


def make_coco(root, seed=0, size=(320, 240)):
    """A COCO tree: ``root/images/*.jpg`` and ``root/annotations/instances.json``.

    Image ids are not in file order; one image has no annotation; one box is a crowd.
    Returns (ann_file, doc)."""
    rng = np.random.default_rng(seed)
    images = [
        {"id": 42, "file_name": "000000000042.jpg", "width": size[0], "height": size[1]},
        {"id": 7, "file_name": "000000000007.jpg", "width": size[0], "height": size[1]},
        {"id": 19, "file_name": "000000000019.jpg", "width": size[0], "height": size[1]},
    ]
    for img in images:
        write_photo(os.path.join(root, "images", img["file_name"]), rng, size)
    annotations = [
        {"id": 1, "image_id": 42, "bbox": [10.5, 20.25, 30.0, 40.0], "category_id": 3,
         "iscrowd": 0, "area": 1200.0},
        {"id": 2, "image_id": 7, "bbox": [0, 0, 100, 50], "category_id": 1, "iscrowd": 0},
        {"id": 3, "image_id": 42, "bbox": [200, 100, 50, 60], "category_id": 1, "iscrowd": 1},
        {"id": 4, "image_id": 42, "bbox": [5, 6, 7, 8], "category_id": 1},  # iscrowd absent
    ]
    categories = [{"id": 1, "name": "person", "supercategory": "person"},
                  {"id": 3, "name": "car", "supercategory": "vehicle"}]
    doc = {"info": {}, "licenses": [], "images": images, "annotations": annotations,
           "categories": categories}
    ann = os.path.join(root, "annotations", "instances.json")
    os.makedirs(os.path.dirname(ann), exist_ok=True)
    with open(ann, "w") as f:
        json.dump(doc, f)
    return ann, doc
