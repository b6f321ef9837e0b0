"""netcl_loader.images: torchvision's folder rules, loader semantics, crops and bad files.

Test images are JPEGs made from scikit-learn's sample photos (tests/support/images_util.py).
"""
import io
import json
import math
import multiprocessing
import os
import random
import subprocess
import sys
import tarfile

import numpy as np
import pytest

pytest.importorskip("PIL", reason="netcl_loader.images needs Pillow (the 'images' extra)")
pytest.importorskip("sklearn", reason="test images are made from scikit-learn's sample photos")

from PIL import Image  # noqa: E402

from compare import assert_same_pairs  # noqa: E402
from images_util import encode_jpeg, make_jpegs, photo_region  # noqa: E402
from netcl_loader import DataLoader, Subset  # noqa: E402
from netcl_loader.images import (DECODER_ENV, IMG_EXTENSIONS, CenterCrop,  # noqa: E402
                                 ImageFileError, ImageFiles, ImageFolder, RandomResizedCrop,
                                 TarImages)

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
#: The agreement asked of our pipeline with Pillow + torchvision's recipe, in
#: levels of 255: mean absolute difference, and a bound on the largest one.
MEAN_ABS_LEVELS = 2.0
MAX_LEVELS = 40

try:
    from netcl_loader import _jpeg  # noqa: F401
    HAVE_JPEG = True
except ImportError:
    HAVE_JPEG = False

pytestmark = pytest.mark.filterwarnings("ignore:netcl_loader._jpeg is not built")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 classes x 8 JPEGs of jittered ImageNet-like sizes (some grey, some progressive)."""
    root = tmp_path_factory.mktemp("folder")
    for c, name in enumerate(["cat", "dog", "emu"]):
        make_jpegs(root / name, 8, size=(200, 150), seed=c, jitter=0.3,
                   mode=("RGB", "RGB", "L") if c == 2 else "RGB", progressive="mixed")
    return root


def batches(loader):
    return [(np.array(x), np.array(y)) for x, y in loader]


# --------------------------------------------------------------------------
# torchvision's folder rules


def torchvision_rule(root, extensions=IMG_EXTENSIONS):
    """torchvision's find_classes + make_dataset, written out: classes are the sorted
    subfolders of root; per class in that order, os.walk(followlinks=True) sorted
    by directory, files sorted by name, kept when the lower-cased name ends with
    an extension; samples are (path, class index)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples = []
    for c in classes:
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(tuple(extensions)):
                    samples.append((os.path.join(dirpath, fname), class_to_idx[c]))
    return classes, class_to_idx, samples


def test_classes_and_targets_follow_torchvision(tmp_path):
    data = encode_jpeg(photo_region(np.random.default_rng(0), (40, 30)))
    files = ["b/x.jpg", "b/A.JPG", "b/sub/z.jpeg", "b/sub/a/q.png", "b/notes.txt", "a/1.webp",
             "a/0.jpg", "Zeta/y.jpg", "Zeta/.hidden.jpg", "a b/k.bmp", "stray.jpg"]
    for f in files:
        p = tmp_path / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (tmp_path / "b" / "dir.jpg").mkdir()  # a folder named like an image is not a file
    ds = ImageFolder(tmp_path, crop=CenterCrop(16))
    classes, class_to_idx, samples = torchvision_rule(str(tmp_path))
    assert ds.classes == classes == ["Zeta", "a", "a b", "b"]
    assert ds.class_to_idx == class_to_idx
    assert ds.targets.dtype == np.int64
    assert ds.targets.tolist() == [t for _, t in samples]
    assert [ds.path(i) for i in range(len(ds))] == [p for p, _ in samples]
    assert list(ds.samples) == samples
    # extensions: a str or a sequence, compared with the lower-cased name.
    exts = (".jpg", ".webp", ".bmp")
    only = ImageFolder(tmp_path, crop=CenterCrop(16), extensions=exts)
    assert [only.path(i) for i in range(len(only))] == [
        p for p, _ in torchvision_rule(str(tmp_path), exts)[2]]
    # A class left without a valid file: torchvision's error.
    with pytest.raises(FileNotFoundError, match="no valid file for the classes a b"):
        ImageFolder(tmp_path, crop=CenterCrop(16), extensions=".jpg")


def test_the_index_holds_no_python_object_per_sample(folder):
    ds = ImageFolder(folder)
    held = [v for v in vars(ds).values() if isinstance(v, (list, tuple, dict))]
    assert len(ds) > len(IMG_EXTENSIONS) and all(len(v) < len(ds) for v in held)
    assert isinstance(ds._names.blob, np.ndarray) and ds._names.offsets.dtype == np.int64


def test_missing_root_and_empty_folders_raise_naming_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as e:
        ImageFolder(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(e.value)
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder") as e:
        ImageFolder(tmp_path)
    assert str(tmp_path) in str(e.value)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    make_jpegs(tmp_path / "a", 1)
    (tmp_path / "b" / "readme.txt").write_text("no images here")
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes b") as e:
        ImageFolder(tmp_path)
    assert ".jpg" in str(e.value)


@pytest.mark.parametrize("kw,name", [
    (dict(on_error="ignore"), "on_error"), (dict(output="float16"), "output"),
    (dict(flip=1.5), "flip"), (dict(flip="yes"), "flip"), (dict(mean=(0.5, 0.5)), "mean"),
    (dict(std=(0.2, 0.0, 0.2)), "std"), (dict(mean=None), "mean"),
    (dict(crop=224), "crop"), (dict(crop=None), "crop"),
])
def test_bad_arguments_name_argument_and_value(folder, kw, name):
    with pytest.raises(ValueError, match=name) as e:
        ImageFolder(folder, **kw)
    assert repr(next(iter(kw.values()))) in str(e.value)


@pytest.mark.parametrize("make,name", [
    (lambda: RandomResizedCrop(0), "size"), (lambda: RandomResizedCrop((3, -1)), "size"),
    (lambda: RandomResizedCrop(8, scale=(0.5, 0.1)), "scale"),
    (lambda: RandomResizedCrop(8, ratio=(0, 1)), "ratio"),
    (lambda: CenterCrop(224, resize=200), "resize"), (lambda: CenterCrop("big"), "size"),
])
def test_bad_crop_arguments(make, name):
    with pytest.raises(ValueError, match=name):
        make()


@pytest.mark.slow
def test_import_stays_light():
    code = ("import sys, netcl_loader, netcl_loader.images; "
            "assert 'PIL' not in sys.modules, 'Pillow imported eagerly'; "
            "assert 'netcl_loader.images' not in sys.modules or True")
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import sys, netcl_loader; assert 'netcl_loader.images' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------
# Loader semantics


def test_same_batches_for_every_num_workers_and_delivery(folder):
    ds = ImageFolder(folder, crop=RandomResizedCrop(48))
    runs = {}
    for nw in (0, 2):
        for zc in (False, True):
            with DataLoader(ds, batch_size=5, shuffle=True, num_workers=nw, seed=11,
                            zero_copy=zc) as dl:
                runs[nw, zc] = batches(dl) + batches(dl)  # two epochs
    ref = runs[0, False]
    assert ref[0][0].shape == (5, 3, 48, 48) and ref[0][0].dtype == np.float32
    assert ref[0][1].dtype == np.int64
    for key, got in runs.items():
        assert_same_pairs(got, ref)
    # Random, not constant: epochs differ, and so do two seeds.
    assert not np.array_equal(ref[0][0], ref[len(ref) // 2][0])
    with DataLoader(ds, batch_size=5, shuffle=True, seed=12) as dl:
        assert not np.array_equal(batches(dl)[0][0], ref[0][0])


def test_same_batches_on_the_torch_face(folder):
    torch = pytest.importorskip("torch")
    from netcl_loader.torch import DataLoader as TorchLoader
    ds = ImageFolder(folder, crop=RandomResizedCrop(40), output="uint8")
    with DataLoader(ds, batch_size=6, shuffle=True, seed=3) as dl:
        ref = batches(dl)
    for nw in (0, 2):
        dl = TorchLoader(ds, batch_size=6, shuffle=True, num_workers=nw, seed=3,
                         persistent_workers=nw > 0)
        got = list(dl)
        assert isinstance(got[0][0], torch.Tensor) and got[0][0].dtype == torch.uint8
        assert got[0][1].dtype == torch.int64
        assert_same_pairs([(x.numpy(), y.numpy()) for x, y in got], ref)


def test_torch_wrappers_keep_the_batch_seed(folder):
    """torch's Subset and ConcatDataset do not forward the dataset's class
    attributes: the batch's seed reaches the images inside them all the same."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import ConcatDataset
    from torch.utils.data import Subset as TorchSubset

    from netcl_loader.torch import DataLoader as TorchLoader
    ds = ImageFolder(folder, crop=RandomResizedCrop(24), output="uint8")
    n = len(ds)
    with DataLoader(ds, batch_size=6, shuffle=False, seed=5) as dl:
        plain = batches(dl)
    for wrapped in (TorchSubset(ds, range(n)), ConcatDataset([ds, ds])):
        runs = [[(x.numpy(), y.numpy()) for x, y in
                 TorchLoader(wrapped, batch_size=6, num_workers=nw, seed=5)]
                for nw in (0, 2)]
        assert_same_pairs(runs[1], runs[0])
        if isinstance(wrapped, TorchSubset):
            # Through __getitems__: the unwrapped dataset's batches.
            assert_same_pairs(runs[0], plain)
    # ConcatDataset fetches sample by sample: the same file twice in one batch
    # gets two different draws, not the batch's first row twice.
    sampler = [0, n] * 3
    x, _ = next(iter(TorchLoader(ConcatDataset([ds, ds]), batch_size=6, sampler=sampler,
                                 seed=1)))
    assert not all(torch.equal(x[0], x[j]) for j in range(1, 6))
    # Outside a loader, ds[i] still draws from NumPy's global RNG.
    np.random.seed(8)
    a = ds[2][0]
    np.random.seed(8)
    np.testing.assert_array_equal(ds[2][0], a)


def test_collate_fn_path_and_getitem_match_the_batch_rows(folder):
    ds = ImageFolder(folder, crop=RandomResizedCrop(32))
    with DataLoader(ds, batch_size=4, shuffle=True, seed=7) as dl:
        ref = batches(dl)

    def stack(samples):
        return (np.stack([s[0] for s in samples]), np.array([s[1] for s in samples]))
    with DataLoader(ds, batch_size=4, shuffle=True, seed=7, num_workers=2,
                    collate_fn=stack) as dl:
        assert_same_pairs(batches(dl), ref)
    # Outside a loader: NumPy's global RNG, ds[i] is row 0 of the batch [i].
    np.random.seed(5)
    x, y = ds[3]
    np.random.seed(5)
    xb, yb = ds.gather_batch([3], np.empty)
    np.testing.assert_array_equal(x, xb[0])
    assert y == yb[0] == ds.targets[3] and isinstance(y, int)
    # A Subset keeps the fast path and the batch's seed.
    sub = Subset(ds, list(range(0, len(ds), 2)))
    with DataLoader(sub, batch_size=4, seed=7, num_workers=2) as dl:
        a = batches(dl)
    with DataLoader(sub, batch_size=4, seed=7) as dl:
        assert_same_pairs(batches(dl), a)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exact_resume_mid_epoch(folder, num_workers):
    ds = ImageFolder(folder, crop=RandomResizedCrop(32), output="uint8")
    kw = dict(batch_size=4, shuffle=True, seed=21, num_workers=num_workers)
    with DataLoader(ds, **kw) as dl:
        dl.set_epoch(1)
        full = batches(dl)
    with DataLoader(ds, **kw) as dl:
        dl.set_epoch(1)
        it = iter(dl)
        head = [tuple(np.array(v) for v in next(it)) for _ in range(2)]
        state = json.dumps(dl.state_dict())
    assert_same_pairs(head, full[:2])
    with DataLoader(ds, **kw) as dl:
        dl.load_state_dict(json.loads(state))
        assert_same_pairs(batches(dl), full[2:])


def write_shards(ds, folder_root, out, per_shard):
    """WebDataset shards of ``ds``'s files in its order: KEY.jpg + KEY.cls."""
    paths = []
    for s in range(0, len(ds), per_shard):
        path = out / f"shard-{s // per_shard:03d}.tar"
        with tarfile.open(path, "w") as tf:
            for i in range(s, min(s + per_shard, len(ds))):
                data = open(ds.path(i), "rb").read()
                ext = os.path.splitext(ds.path(i))[1].lower().lstrip(".")
                for name, payload in ((f"sample{i:06d}.{ext}", data),
                                      (f"sample{i:06d}.cls", str(int(ds.targets[i])).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        paths.append(path)
    return paths


def test_tar_shards_give_what_the_folder_gives(folder, tmp_path):
    ds = ImageFolder(folder, crop=RandomResizedCrop(36))
    shards = write_shards(ds, folder, tmp_path, per_shard=7)
    tar = TarImages(shards, crop=RandomResizedCrop(36))
    assert len(tar) == len(ds)
    np.testing.assert_array_equal(tar.targets, ds.targets)
    for s in shards:
        assert os.path.exists(f"{s}.idx.npz")   # cached beside the shard
    for nw in (0, 2):
        with DataLoader(ds, batch_size=5, shuffle=True, seed=4, num_workers=nw) as a, \
                DataLoader(tar, batch_size=5, shuffle=True, seed=4, num_workers=nw) as b:
            assert_same_pairs(batches(b), batches(a))
    # The cached index is used, and rebuilt when the shard changes or the
    # cache is damaged.
    again = TarImages(shards, crop=RandomResizedCrop(36))
    np.testing.assert_array_equal(again._offset, tar._offset)
    with open(f"{shards[1]}.idx.npz", "wb") as f:
        f.write(b"PK\x03\x04 not a zip")
    np.testing.assert_array_equal(TarImages(shards)._offset, tar._offset)
    assert os.path.getsize(f"{shards[1]}.idx.npz") > 100
    with tarfile.open(shards[0], "a") as tf:
        payload = open(ds.path(0), "rb").read()
        for name, data in (("extra.jpg", payload), ("extra.cls", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    grown = TarImages(shards, crop=RandomResizedCrop(36))
    assert len(grown) == len(ds) + 1 and grown.targets[7] == 2
    assert "extra.jpg" in grown._name(7)


def test_tar_index_where_the_cache_cannot_be_written(folder, tmp_path):
    """The index is then kept in memory only, and nothing is left beside the shard
    (a folder takes the cache's name: as root, a read-only folder is still writable)."""
    ds = ImageFolder(folder, crop=CenterCrop(16))
    shards = write_shards(ds, folder, tmp_path, per_shard=100)
    os.mkdir(f"{shards[0]}.idx.npz")
    before = sorted(os.listdir(tmp_path))
    tar = TarImages(shards, crop=CenterCrop(16), flip=0)
    assert sorted(os.listdir(tmp_path)) == before
    assert len(tar) == len(ds)
    np.testing.assert_array_equal(tar.gather_batch([3, 9], np.empty)[0],
                                  ImageFolder(folder, crop=CenterCrop(16), flip=0)
                                  .gather_batch([3, 9], np.empty)[0])


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux /proc only")
def test_many_shards_keep_few_descriptors_open(folder, tmp_path):
    """Reading from more shards than MAX_OPEN_SHARDS closes the least recently
    used: a thousand shards must not exhaust a worker's 1024 descriptors."""
    import netcl_loader.images._buffers as _buffers   # where the bound is read
    ds = ImageFolder(folder, crop=CenterCrop(16), flip=0, output="uint8")
    shards = write_shards(ds, folder, tmp_path, per_shard=1)   # one shard per image
    assert len(shards) == len(ds) > 16
    saved = _buffers.MAX_OPEN_SHARDS
    _buffers.MAX_OPEN_SHARDS = 16
    try:
        tar = TarImages(shards, crop=CenterCrop(16), flip=0, output="uint8")
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(2):
            got, labels = tar.gather_batch(np.arange(len(tar))[::-1], np.empty)
        assert len(os.listdir("/proc/self/fd")) <= before + 16
    finally:
        _buffers.MAX_OPEN_SHARDS = saved
    want, _ = ds.gather_batch(np.arange(len(ds))[::-1], np.empty)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(labels, ds.targets[::-1])


def test_a_forked_child_closes_the_shard_descriptors_it_inherits(folder, tmp_path):
    """Shards the parent read stay open in its _Process; a forked child (a worker) makes
    its own and closes its copies of the parent's, so they do not add up per fork."""
    import netcl_loader.images._buffers as _buffers
    ds = ImageFolder(folder, crop=CenterCrop(16), flip=0, output="uint8")
    shards = write_shards(ds, folder, tmp_path, per_shard=1)
    tar = TarImages(shards, crop=CenterCrop(16), flip=0, output="uint8")
    _buffers._here().close_shards()   # what earlier tests left open in this process
    tar.gather_batch(np.arange(len(tar)), np.empty)
    inherited = sorted(_buffers._here().shards.values())
    assert len(inherited) == min(len(shards), _buffers.MAX_OPEN_SHARDS)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: one read, then report which inherited fds are open
        try:
            os.close(r)
            tar.gather_batch(np.arange(1), np.empty)
            still = [fd for fd in inherited if os.path.exists(f"/proc/self/fd/{fd}")
                     and os.readlink(f"/proc/self/fd/{fd}").endswith(".tar")
                     and fd not in _buffers._here().shards.values()]
            os.write(w, json.dumps(still).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        still = json.loads(f.read())
    os.waitpid(pid, 0)
    assert still == []


def test_tar_shards_need_labels_and_no_compression(tmp_path):
    data = encode_jpeg(photo_region(np.random.default_rng(0), (40, 30)))
    bad = tmp_path / "nolabel.tar"
    with tarfile.open(bad, "w") as tf:
        info = tarfile.TarInfo("k1.jpg")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="k1.*label"):
        TarImages(bad)
    gz = tmp_path / "packed.tar.gz"
    with tarfile.open(gz, "w:gz") as tf:
        info = tarfile.TarInfo("k1.jpg")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="uncompressed"):
        TarImages(gz)
    # Cut inside the first member's data: tarfile's own error, with the shard named.
    whole = tmp_path / "whole.tar"
    with tarfile.open(whole, "w") as tf:
        for name, payload in (("k1.jpg", data), ("k1.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[:700])
    with pytest.raises(ValueError, match="is damaged") as e:
        TarImages(cut)
    assert str(cut) in str(e.value)


def add_members(tf, members):
    """Add ``(name, payload)`` members to the open tar ``tf`` (a name ending in / a folder)."""
    for name, payload in members:
        info = tarfile.TarInfo(name.rstrip("/"))
        if name.endswith("/"):
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
            continue
        info.size = len(payload)
        tf.addfile(info, io.BytesIO(payload))


def webdataset_samples(shards):
    """What the webdataset package reads from ``shards``: ``(key, image suffix, image
    bytes, label)`` of each sample with one image and a .cls, and the keys of the others."""
    wds = pytest.importorskip("webdataset")
    ours, others = [], []
    for sample in wds.WebDataset([str(s) for s in shards], shardshuffle=False,
                                 empty_check=False):
        exts = [e for e in ("jpg", "jpeg", "png") if e in sample]
        if exts and "cls" in sample:
            ours.append((sample["__key__"], exts[0], sample[exts[0]], int(sample["cls"])))
        else:
            others.append(sample["__key__"])
    return ours, others


def tar_samples(tar):
    """The same of a TarImages: key, suffix and bytes from its index, read by offset."""
    from netcl_loader.images._buffers import _here
    out = []
    for i in range(len(tar)):
        shard, member = tar._name(i).rsplit(":", 1)
        key, ext = member.rsplit(".", 1)
        out.append((key, ext, bytes(tar._read(i, _here())), int(tar.targets[i])))
    return out


def test_tar_samples_group_as_webdataset_groups_them(tmp_path):
    """Consecutive members sharing a key are a sample, as the webdataset package reads
    them: a key met again later (two shards appended into one) is a new sample; the key
    is the name up to the first dot after its last slash (directories included, dots
    in folder names kept); suffixes are lower-cased; a.seg.png is not an image."""
    rng = np.random.default_rng(11)
    jpgs = [encode_jpeg(photo_region(rng, (40 + 4 * k, 30))) for k in range(8)]
    buf = io.BytesIO()
    Image.fromarray(photo_region(rng, (36, 28))).save(buf, "PNG")
    png = buf.getvalue()
    first = tmp_path / "first.tar"
    with tarfile.open(first, "w") as tf:
        add_members(tf, [("a.jpg", jpgs[0]), ("a.cls", b"1"), ("b.jpg", jpgs[1]),
                         ("b.cls", b"2\n")])
    second = tmp_path / "second.tar"
    with tarfile.open(second, "w") as tf:
        add_members(tf, [
            ("a.jpg", jpgs[2]), ("a.cls", b"3"),                       # the same key again
            ("__meta__", b"{}"), ("train/", b""),                       # skipped by both
            ("train/n01/c.jpg", jpgs[3]), ("train/n01/c.seg.png", png),
            ("train/n01/c.cls", b"4"),
            ("v1.2/d.JPEG", jpgs[4]), ("v1.2/d.CLS", b" 5 "),           # dot in the folder
            ("x.y.png", png), ("x.y.cls", b"9"),                        # suffixes y.png, y.cls
            ("notes.txt", b"not a sample of ours"),
            ("e.png", png), ("e.cls", b"-6"),
            ("f.jpeg", jpgs[5]), ("f.cls", b"7"),
            ("g/.jpg", jpgs[6]), ("g/.cls", b"8"),                      # key "g/": no base name
        ])
    with tarfile.open(first, "a") as tf:   # appended as tar -A appends: one archive
        with tarfile.open(second) as src:
            for m in src:
                tf.addfile(m, src.extractfile(m) if m.isfile() else None)
    want, others = webdataset_samples([first])
    assert [k for k, *_ in want] == ["a", "b", "a", "train/n01/c", "v1.2/d", "e", "f", "g/"]
    assert others == ["x", "notes"]
    tar = TarImages(first, crop=CenterCrop(16), flip=0, output="uint8")
    assert tar_samples(tar) == want
    assert len(tar) == 8 and tar.targets.tolist() == [1, 2, 3, 4, 5, -6, 7, 8]
    # Several shards: numbered shard by shard, as WebDataset reads them in order.
    both = TarImages([second, first], crop=CenterCrop(16), flip=0, output="uint8")
    assert tar_samples(both) == webdataset_samples([second, first])[0]
    # The samples decode (their offsets are the images'), through the loader too.
    with DataLoader(tar, batch_size=8, shuffle=False, num_workers=2) as dl:
        x, y = next(iter(dl))
    np.testing.assert_array_equal(np.asarray(y), tar.targets)
    np.testing.assert_array_equal(np.asarray(x)[2], tar[2][0])


def test_tar_index_of_an_older_layout_is_rebuilt(folder, tmp_path):
    """A cache written by an earlier version of the index (another grouping rule) is
    not used: the index is built again and the cache replaced."""
    from netcl_loader.images._tarindex import _TAR_INDEX_VERSION
    ds = ImageFolder(folder, crop=CenterCrop(16))
    shard = write_shards(ds, folder, tmp_path, per_shard=100)[0]
    st = os.stat(shard)
    stale = {"offset": np.zeros(1, np.int64), "size": np.ones(1, np.int64),
             "label": np.zeros(1, np.int64), "keys": np.frombuffer(b"old", np.uint8),
             "key_offsets": np.array([0, 3], np.int64), "ext": np.zeros(1, np.int8)}
    np.savez(f"{shard}.idx.npz", stamp=np.array([st.st_size, st.st_mtime_ns,
                                                 _TAR_INDEX_VERSION - 1], np.int64), **stale)
    tar = TarImages(shard, crop=CenterCrop(16))
    assert len(tar) == len(ds)
    np.testing.assert_array_equal(tar.targets, ds.targets)
    with np.load(f"{shard}.idx.npz") as z:
        assert z["stamp"][2] == _TAR_INDEX_VERSION and len(z["offset"]) == len(ds)


@pytest.mark.parametrize("text,what", [
    (b"12345678901234567890", "outside int64"), (b"-9223372036854775809", "outside int64"),
    (b"3.5", "not an integer"), (b"cat", "not an integer"), (b"", "not an integer"),
])
def test_a_cls_outside_int64_or_not_an_integer_names_shard_and_member(tmp_path, text, what):
    data = encode_jpeg(photo_region(np.random.default_rng(0), (40, 30)))
    shard = tmp_path / "labels.tar"
    with tarfile.open(shard, "w") as tf:
        add_members(tf, [("ok.jpg", data), ("ok.cls", b"9223372036854775807"),
                         ("dir/k7.jpg", data), ("dir/k7.cls", text)])
    with pytest.raises(ValueError, match=what) as e:
        TarImages(shard)
    assert type(e.value) is ValueError   # not OverflowError
    assert str(shard) in str(e.value) and "dir/k7.cls" in str(e.value)


def test_repeated_suffix_or_two_images_in_a_sample_name_the_member(tmp_path):
    data = encode_jpeg(photo_region(np.random.default_rng(0), (40, 30)))
    for members, what in (([("k.jpg", data), ("k.JPG", data), ("k.cls", b"1")],
                           "k.JPG repeats the suffix 'jpg'"),
                          ([("k.jpg", data), ("k.png", data), ("k.cls", b"1")],
                           "two images"),
                          ([("k.jpg", data), ("j.cls", b"1"), ("k.cls", b"1")],
                           "sample 'k' has no label.*consecutive")):
        shard = tmp_path / "s.tar"
        with tarfile.open(shard, "w") as tf:
            add_members(tf, members)
        with pytest.raises(ValueError, match=what) as e:
            TarImages(shard)
        assert str(shard) in str(e.value)


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "1000", None])
def test_max_file_bytes_must_be_a_positive_int(folder, tmp_path, value):
    shards = write_shards(ImageFolder(folder), folder, tmp_path, per_shard=100)
    paths = [str(p) for p in sorted(folder.glob("*/*.jpg"))]
    for make, what in ((lambda: ImageFolder(folder, max_file_bytes=value), "ImageFolder"),
                       (lambda: ImageFiles(paths, [0] * len(paths), max_file_bytes=value),
                        "ImageFiles"),
                       (lambda: TarImages(shards, max_file_bytes=value), "TarImages")):
        with pytest.raises(ValueError, match=f"{what}: max_file_bytes must be a positive "
                                             f"int.*got {value!r}"):
            make()


@pytest.fixture()
def sized(tmp_path):
    """Six JPEGs as files and as one shard; file 2 is the largest, by a margin."""
    rng = np.random.default_rng(8)
    datas = [encode_jpeg(photo_region(rng, (48, 36))) for _ in range(6)]
    datas[2] = encode_jpeg(photo_region(rng, (400, 300)), quality=95)
    paths = []
    for k, data in enumerate(datas):
        paths.append(str(tmp_path / f"f{k}.jpg"))
        with open(paths[-1], "wb") as f:
            f.write(data)
    shard = tmp_path / "sized.tar"
    with tarfile.open(shard, "w") as tf:
        add_members(tf, [m for k, d in enumerate(datas)
                         for m in ((f"s{k}.jpg", d), (f"s{k}.cls", str(k).encode()))])
    bound = max(len(d) for k, d in enumerate(datas) if k != 2)
    assert len(datas[2]) > bound
    return paths, shard, datas, bound


@pytest.mark.parametrize("kind", ["files", "tar"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_over_max_file_bytes_is_refused_before_it_is_read(sized, kind, num_workers):
    paths, shard, datas, bound = sized
    def make(**kw):
        kw.update(crop=CenterCrop(16), flip=0, output="uint8")
        if kind == "files":
            return ImageFiles(paths, range(6), **kw)
        return TarImages(shard, **kw)
    ds = make(max_file_bytes=bound)
    name = paths[2] if kind == "files" else f"{shard}:s2.jpg"
    with DataLoader(ds, batch_size=3, shuffle=False, num_workers=num_workers) as dl:
        with pytest.raises(ImageFileError, match="too large") as e:
            list(dl)
    assert f"{name}: " in str(e.value)
    assert f"{len(datas[2])} bytes" in str(e.value) and f"max_file_bytes={bound}" in str(e.value)
    # Skipped and counted like any bad file: 2 is replaced by 3.
    skip = make(max_file_bytes=bound, on_error="skip")
    with DataLoader(skip, batch_size=3, shuffle=False, num_workers=num_workers) as dl:
        got = batches(dl)
        assert dl.stats.skipped == 1
    whole = make(max_file_bytes=len(datas[2]))   # a file of exactly the bound is read
    want = whole.gather_batch([0, 1, 3, 3, 4, 5], np.empty)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in got]), want[0])
    np.testing.assert_array_equal(np.concatenate([b[1] for b in got]), want[1])
    assert make().max_file_bytes == 256 << 20   # the default


@pytest.mark.parametrize("kind", ["files", "tar"])
def test_the_read_buffer_shrinks_back_after_an_outsized_file(tmp_path, kind):
    """A file larger than the buffer a process keeps (READ_BUFFER_KEEP) is read whole
    and decoded, then the buffer goes back to its first size; a camera-sized file's
    buffer is kept for the next one."""
    from netcl_loader.images._buffers import READ_BUFFER_BYTES, READ_BUFFER_KEEP, _here
    rng = np.random.default_rng(2)
    base = photo_region(rng, (600, 450))
    big = np.kron(base, np.ones((6, 6, 1), np.uint8))          # 3600 x 2700 RGB: 29 MB as BMP
    paths = [str(tmp_path / "big.bmp"), str(tmp_path / "small.jpg")]
    Image.fromarray(big).save(paths[0])
    camera = np.kron(photo_region(rng, (400, 300)), np.ones((4, 4, 1), np.uint8))
    camera = np.clip(camera + rng.normal(0, 12, camera.shape), 0, 255).astype(np.uint8)
    with open(paths[1], "wb") as f:
        f.write(encode_jpeg(camera, quality=97))   # 1600 x 1200, a few MB
    sizes = [os.path.getsize(p) for p in paths]
    assert sizes[0] > READ_BUFFER_KEEP and READ_BUFFER_BYTES < sizes[1] < READ_BUFFER_KEEP
    kw = dict(crop=CenterCrop(32), flip=0, output="uint8")
    if kind == "files":
        ds = ImageFiles(paths, [0, 1], **kw)
    else:
        shard = tmp_path / "big.tar"
        with tarfile.open(shard, "w") as tf:
            add_members(tf, [("big.png", open(paths[0], "rb").read()), ("big.cls", b"0"),
                             ("small.jpg", open(paths[1], "rb").read()), ("small.cls", b"1")])
        ds = TarImages(shard, **kw)
    proc = _here()
    x, _ = ds[0]
    assert len(proc.buf) == READ_BUFFER_BYTES   # the outsized buffer is gone
    mean_abs, worst = levels(x, torchvision_v1_eval(paths[0], 36, 32))
    assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (mean_abs, worst)
    ds[1]
    assert sizes[1] < len(proc.buf) <= READ_BUFFER_KEEP   # kept: the next photo needs it
    ds[0]
    assert len(proc.buf) == READ_BUFFER_BYTES


# --------------------------------------------------------------------------
# Crops against torchvision's recipe on Pillow


def torchvision_v1_eval(path, resize, crop):
    """torchvision v1 on PIL: Resize(resize) (shorter side; bilinear, antialiased by
    Pillow), CenterCrop(crop): uint8 CHW."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = resize, int(resize * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    img = img.resize((new_w, new_h), Image.BILINEAR)
    top = int(round((new_h - crop) / 2.0))
    left = int(round((new_w - crop) / 2.0))
    img = img.crop((left, top, left + crop, top + crop))
    return np.asarray(img).transpose(2, 0, 1)


def levels(a, b):
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return d.mean(), d.max()


@pytest.mark.parametrize("force_pillow", [False, True])
def test_center_crop_matches_torchvision_recipe(folder, monkeypatch, force_pillow):
    if force_pillow:
        monkeypatch.setenv(DECODER_ENV, "pillow")
    ds = ImageFolder(folder, crop=CenterCrop(64, resize=73), flip=0, output="uint8")
    assert ds._compiled == (HAVE_JPEG and not force_pillow)
    fl = ImageFolder(folder, crop=CenterCrop(64, resize=73), flip=0)
    images, _ = ds.gather_batch(np.arange(len(ds)), np.empty)
    floats, _ = fl.gather_batch(np.arange(len(ds)), np.empty)
    for i in range(len(ds)):
        ref = torchvision_v1_eval(ds.path(i), 73, 64)
        mean_abs, worst = levels(images[i], ref)
        assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (ds.path(i), mean_abs, worst)
        # float32: torchvision's ToTensor + Normalize of the same pixels.
        want = (ref / 255.0 - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]
        got = floats[i].astype(np.float64)
        err = np.abs(got - want) * np.array(STD)[:, None, None] * 255
        assert err.mean() <= MEAN_ABS_LEVELS, (ds.path(i), err.mean())


@pytest.mark.parametrize("force_pillow", [False, True])
def test_files_larger_than_the_read_buffer_are_read_whole(tmp_path, monkeypatch, force_pillow):
    """A camera-sized JPEG (more than the 1 MiB read buffer a process starts with) is read
    whole, after a smaller file has set up the buffer: its image matches torchvision's
    recipe on the same file."""
    from netcl_loader.images._buffers import READ_BUFFER_BYTES, _here
    from netcl_loader.images._sources import _read_file
    rng = np.random.default_rng(5)
    base = photo_region(rng, size=(400, 300))   # (300, 400, 3)
    big = np.clip(np.kron(base, np.ones((4, 4, 1), np.uint8)).astype(np.int16)
                  + rng.normal(0, 12, (1200, 1600, 3)), 0, 255)
    path = str(tmp_path / "big.jpg")
    Image.fromarray(big.astype(np.uint8)).save(path, quality=97)
    assert os.path.getsize(path) > READ_BUFFER_BYTES
    small = make_jpegs(tmp_path / "s", 1, size=(40, 30), seed=1)[0]
    if force_pillow:
        monkeypatch.setenv(DECODER_ENV, "pillow")
    ds = ImageFiles([small, path], [0, 1], crop=CenterCrop(64, resize=73), flip=0,
                    output="uint8")
    ds[0]   # the process's read buffer is now set up at its first size
    got = ds[1][0]
    mean_abs, worst = levels(got, torchvision_v1_eval(path, 73, 64))
    assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (mean_abs, worst)
    with open(path, "rb") as f:
        assert bytes(_read_file(os.fsencode(path), _here())) == f.read()


def test_center_crop_default_resize_fits_oblong_crops():
    """The default resize is min(size) / 0.875, raised to the crop's largest side when the
    crop is too oblong for it; a resize given smaller than that is refused, naming it."""
    assert CenterCrop(224).resize == 256
    assert CenterCrop((224, 300)).resize == 300
    assert CenterCrop((224, 250)).resize == 256
    with pytest.raises(ValueError, match="resize.*300.*got 256"):
        CenterCrop((224, 300), resize=256)
    top, left, h, w = CenterCrop((224, 300)).box(600, 400)   # portrait: width is short
    assert 0 <= left and left + w <= 400 + 1e-9 and 0 <= top and top + h <= 600 + 1e-9


@pytest.mark.parametrize("force_pillow", [False, True])
def test_images_smaller_than_the_crop_are_enlarged_not_padded(tmp_path, monkeypatch,
                                                              force_pillow):
    if force_pillow:
        monkeypatch.setenv(DECODER_ENV, "pillow")
    rng = np.random.default_rng(9)
    paths = []
    for k, (h, w) in enumerate([(10, 14), (1, 1), (3, 40)]):
        paths.append(str(tmp_path / f"{k}.jpg"))
        (tmp_path / f"{k}.jpg").write_bytes(encode_jpeg(photo_region(rng, (h, w)), quality=95))
    ds = ImageFiles(paths, [0, 1, 2], crop=CenterCrop(24, resize=27), flip=0, output="uint8")
    for i, p in enumerate(paths):
        mean_abs, worst = levels(ds[i][0], torchvision_v1_eval(p, 27, 24))
        assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (p, mean_abs, worst)
    # A training crop larger than the image: its box is the image's, enlarged.
    big = ImageFiles(paths, [0, 1, 2], crop=RandomResizedCrop(32), output="uint8")
    images, _ = big.gather_batch([0, 1, 2], np.empty)
    assert images.shape == (3, 3, 32, 32)
    assert (images[1] == images[1][:, :1, :1]).all()   # 1 x 1: one colour


def test_other_formats_follow_torchvisions_loader(tmp_path):
    """PNG (16-bit grey, palette with transparency, grey, grey + alpha, RGBA) and WebP
    go through Pillow's convert("RGB"), as torchvision's loader reads them."""
    from PIL import features
    rgb = photo_region(np.random.default_rng(2), (30, 44))
    img = Image.fromarray(rgb)
    wide = Image.fromarray(rgb[..., 0].astype(np.uint16) * 200)   # 16-bit, values past 255
    palette = img.convert("P")
    made = {"p16.png": (wide, {}), "pal.png": (palette, {"transparency": 0}),
            "grey.png": (img.convert("L"), {}), "la.png": (img.convert("LA"), {}),
            "rgba.png": (img.convert("RGBA"), {})}
    if features.check("webp"):
        made["x.webp"] = (img, {"quality": 90})
    paths = []
    for name, (im, kw) in made.items():
        im.save(tmp_path / name, **kw)
        paths.append(str(tmp_path / name))
    assert Image.open(paths[0]).mode.startswith("I")
    ds = ImageFiles(paths, range(len(paths)), crop=CenterCrop(24, resize=27), flip=0,
                    output="uint8")
    images, _ = ds.gather_batch(np.arange(len(paths)), np.empty)
    for p, x in zip(paths, images):
        mean_abs, worst = levels(x, torchvision_v1_eval(p, 27, 24))
        assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (p, mean_abs, worst)


def test_whole_image_crop_and_flip_match_pillow(folder):
    """A RandomResizedCrop whose only possible box is the whole image, flipped."""
    ds = ImageFolder(folder, crop=RandomResizedCrop(50, scale=(1, 1), ratio=(0.1, 10)),
                     flip=1.0, output="uint8")
    images, _ = ds.gather_batch(np.arange(len(ds)), np.empty)
    for i in range(len(ds)):
        img = Image.open(ds.path(i)).convert("RGB").resize((50, 50), Image.BILINEAR)
        ref = np.asarray(img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)).transpose(2, 0, 1)
        mean_abs, worst = levels(images[i], ref)
        assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (i, mean_abs, worst)


def test_pillow_path_agrees_with_the_compiled_path(folder, monkeypatch):
    if not HAVE_JPEG:
        pytest.skip("netcl_loader._jpeg is not built (libjpeg-turbo headers missing)")
    crop = RandomResizedCrop(56)
    fast = ImageFolder(folder, crop=crop, output="uint8")
    monkeypatch.setenv(DECODER_ENV, "pillow")
    slow = ImageFolder(folder, crop=crop, output="uint8")
    assert fast._compiled and not slow._compiled
    with DataLoader(fast, batch_size=8, shuffle=True, seed=9) as a, \
            DataLoader(slow, batch_size=8, shuffle=True, seed=9, num_workers=2) as b:
        for (xa, ya), (xb, yb) in zip(batches(a), batches(b)):
            np.testing.assert_array_equal(ya, yb)
            mean_abs, worst = levels(xa, xb)
            assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (mean_abs, worst)


def test_bad_decoder_choice_names_the_variable(folder, monkeypatch):
    monkeypatch.setenv(DECODER_ENV, "magic")
    with pytest.raises(ValueError, match=DECODER_ENV):
        ImageFolder(folder)


def torchvision_get_params(height, width, scale, ratio, rnd):
    """torchvision's RandomResizedCrop.get_params, written out with Python's random."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rnd.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rnd.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            return rnd.randint(0, height - h), rnd.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def test_random_resized_crop_boxes_follow_get_params():
    crop = RandomResizedCrop(224)
    rng = np.random.default_rng(0)
    rnd = random.Random(0)
    n, height, width = 20000, 310, 410
    ours = np.array([crop.get_params(height, width, rng) for _ in range(n)])
    ref = np.array([torchvision_get_params(height, width, crop.scale, crop.ratio, rnd)
                    for _ in range(n)])
    top, left, h, w = ours.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= height).all() and (left + w <= width).all()
    area = h * w / (height * width)
    # Rounding the sides to whole pixels moves area and ratio a little past their ranges.
    assert area.min() >= 0.08 * 0.9 and area.max() <= 1.0
    assert (w / h).min() >= 0.75 * 0.95 and (w / h).max() <= 4 / 3 * 1.05
    # Same distribution as torchvision's: quantiles of area, ratio and the box's centre.
    r_top, r_left, r_h, r_w = ref.T
    for a, b in ((area, r_h * r_w / (height * width)), (np.log(w / h), np.log(r_w / r_h)),
                 ((top + h / 2) / height, (r_top + r_h / 2) / height),
                 ((left + w / 2) / width, (r_left + r_w / 2) / width)):
        q = [0.1, 0.25, 0.5, 0.75, 0.9]
        np.testing.assert_allclose(np.quantile(a, q), np.quantile(b, q), atol=0.03)
    # The fallback, as often as torchvision's: on a 310 x 410 image a box fails
    # a try when it is too tall or too wide.
    fell = np.mean([tuple(b) == (0, 0, height, width) for b in ours])
    fell_ref = np.mean([tuple(b) == (0, 0, height, width) for b in ref])
    assert abs(fell - fell_ref) < 0.01


def test_random_resized_crop_falls_back_to_the_centre_crop_of_the_allowed_ratio():
    crop = RandomResizedCrop(8)
    rng = np.random.default_rng(1)
    # 10 x 1000: no box of ratio <= 4/3 and area >= 8% fits; the centre crop
    # of the widest allowed ratio is taken.
    for _ in range(100):
        assert crop.get_params(10, 1000, rng) == (0, (1000 - 13) // 2, 10, 13)
        assert crop.get_params(1000, 10, rng) == ((1000 - 13) // 2, 0, 13, 10)
    # An area above the image's: the whole image when its ratio is allowed.
    big = RandomResizedCrop(8, scale=(2, 3))
    assert big.get_params(300, 300, rng) == (0, 0, 300, 300)
    assert torchvision_get_params(300, 300, (2, 3), big.ratio, random.Random(0)) == (0, 0, 300, 300)


# --------------------------------------------------------------------------
# Bad files


@pytest.fixture()
def bad_folder(tmp_path):
    """One class of 8 files: 0,2,4,6 good JPEGs; 1 empty; 3 truncated JPEG;
    5 a PNG named .jpg (an image); 7 random bytes."""
    root = tmp_path / "bad"
    make_jpegs(root / "c", 8, size=(120, 90), seed=3)
    files = sorted(os.listdir(root / "c"))
    paths = [str(root / "c" / f) for f in files]
    open(paths[1], "wb").close()
    data = open(paths[3], "rb").read()
    open(paths[3], "wb").write(data[:len(data) // 2])
    buf = io.BytesIO()
    Image.fromarray(photo_region(np.random.default_rng(5), (100, 80))).save(buf, "PNG")
    open(paths[5], "wb").write(buf.getvalue())
    open(paths[7], "wb").write(np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes())
    return root, paths


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("bad,what,exc", [
    (1, "empty", ImageFileError), (3, "truncated|corrupt|premature", ImageFileError),
    (7, "not an image", ImageFileError), ("missing", "No such file", FileNotFoundError),
])
def test_on_error_raise_names_the_file_and_what_is_wrong(bad_folder, num_workers, bad, what,
                                                         exc):
    root, paths = bad_folder
    ds = ImageFolder(root, crop=CenterCrop(32))
    if bad == "missing":
        os.unlink(paths[2])
        bad = 2
    with DataLoader(ds, batch_size=1, sampler=[bad], num_workers=num_workers) as dl:
        with pytest.raises(exc, match=what) as e:
            next(iter(dl))
        assert paths[bad] in str(e.value)
        # The loader stays usable.
        with DataLoader(ds, batch_size=1, sampler=[0], num_workers=num_workers) as ok:
            assert next(iter(ok))[0].shape == (1, 3, 32, 32)


def test_a_png_named_jpg_is_an_image(bad_folder):
    root, paths = bad_folder
    ds = ImageFolder(root, crop=CenterCrop(32), flip=0, output="uint8")
    x, _ = ds[5]
    assert Image.open(paths[5]).format == "PNG"
    ref = torchvision_v1_eval(paths[5], 36, 32)
    mean_abs, worst = levels(x, ref)
    assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS


def test_pillow_failures_are_the_files_errors(bad_folder, monkeypatch):
    """Any failure inside Pillow (here its decompression-bomb limit, which is not an
    OSError) is the file's ImageFileError, named, and skipped with on_error="skip"."""
    root, paths = bad_folder
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    ds = ImageFolder(root, crop=CenterCrop(16), flip=0)
    with pytest.raises(ImageFileError, match="too large for Pillow") as e:
        ds[5]   # the PNG, 100 x 80
    assert paths[5] in str(e.value)
    skip = ImageFolder(root, crop=CenterCrop(16), flip=0, on_error="skip")
    np.testing.assert_array_equal(skip[5][0], ds[6][0])


def test_exif_orientation_is_ignored_as_torchvision_ignores_it(tmp_path, monkeypatch):
    """torchvision's loader (Image.open(...).convert("RGB")) does not apply EXIF
    orientation; neither do we, on either path."""
    img = Image.fromarray(photo_region(np.random.default_rng(4), (60, 90)))  # 90 wide
    exif = Image.Exif()
    exif[0x0112] = 6   # "rotate 90 degrees clockwise to display"
    path = tmp_path / "rotated.jpg"
    img.save(path, "JPEG", quality=95, exif=exif)
    ref = torchvision_v1_eval(str(path), 40, 40)
    for decoder in ("auto", "pillow"):
        monkeypatch.setenv(DECODER_ENV, decoder)
        x, _ = ImageFiles([str(path)], [0], crop=CenterCrop(40, resize=40), flip=0,
                          output="uint8")[0]
        mean_abs, worst = levels(x, ref)
        assert mean_abs <= MEAN_ABS_LEVELS and worst <= MAX_LEVELS, (decoder, mean_abs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_error_skip_replaces_by_the_next_good_file_and_counts(bad_folder, num_workers):
    root, paths = bad_folder
    crop = CenterCrop(32)
    ds = ImageFolder(root, crop=crop, flip=0, output="uint8", on_error="skip")
    good = ImageFolder(root, crop=crop, flip=0, output="uint8")
    with DataLoader(ds, batch_size=4, shuffle=False, num_workers=num_workers) as dl:
        got = batches(dl)
        assert dl.stats.skipped == 3   # files 1, 3 and 7
    x = np.concatenate([b[0] for b in got])
    # 1 -> 2, 3 -> 4, 7 -> 0 (wrapping around); 5 (a PNG) is an image.
    for i, k in enumerate([0, 2, 2, 4, 4, 5, 6, 0]):
        np.testing.assert_array_equal(x[i], good[k][0])
    # Every file bad: an error, not a hang.
    for p in paths:
        open(p, "wb").close()
    with DataLoader(ImageFolder(root, on_error="skip"), batch_size=2,
                    num_workers=num_workers) as dl:
        with pytest.raises(ImageFileError, match="none of its 8 files"):
            next(iter(dl))


def test_extensions_is_refused_where_it_would_be_ignored(folder, tmp_path):
    paths = [str(p) for p in sorted((folder / "cat").iterdir())]
    with pytest.raises(ValueError, match=r"ImageFiles: extensions must be None, got '\.jpg'"):
        ImageFiles(paths, [0] * len(paths), extensions=".jpg")
    ds = ImageFolder(folder)
    shards = write_shards(ds, folder, tmp_path, per_shard=100)
    with pytest.raises(ValueError, match=r"TarImages: extensions must be None, got \('\.png',\)"):
        TarImages(shards, extensions=(".png",))
    assert ImageFiles(paths, [0] * len(paths)).extensions is None


def test_folders_fifos_and_devices_named_like_images_fail_without_hanging(tmp_path):
    import signal
    good = make_jpegs(tmp_path / "ok", 1, size=(40, 30), seed=2)[0]
    (tmp_path / "dir.jpg").mkdir()
    os.mkfifo(tmp_path / "pipe.jpg")   # open() would wait for a writer forever
    odd = [str(tmp_path / "dir.jpg"), str(tmp_path / "pipe.jpg"), "/dev/zero"]
    signal.alarm(60)   # a hang fails the test instead of stalling the run
    try:
        for path, what in zip(odd, ["a directory", "not a regular file", "not a regular file"]):
            ds = ImageFiles([path, good], [0, 1], crop=CenterCrop(16), flip=0)
            with pytest.raises(ImageFileError, match=what) as e:
                ds[0]
            assert path in str(e.value)
        skip = ImageFiles(odd + [good], [0, 1, 2, 3], crop=CenterCrop(16), flip=0,
                          on_error="skip")
        with DataLoader(skip, batch_size=4, shuffle=False, num_workers=2) as dl:
            (x, y), = batches(dl)
            assert y.tolist() == [3, 3, 3, 3] and dl.stats.skipped == 3
    finally:
        signal.alarm(0)


def _claim_size(data, width, height):
    """The JPEG ``data`` with its frame header (SOF0/SOF2) claiming ``width`` x ``height``."""
    data = bytearray(data)
    at = 2
    while at < len(data):
        marker, length = data[at + 1], int.from_bytes(data[at + 2:at + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            data[at + 5:at + 7] = height.to_bytes(2, "big")
            data[at + 7:at + 9] = width.to_bytes(2, "big")
            return bytes(data)
        at += 2 + length
    raise AssertionError("no frame header")


def test_a_header_claiming_a_huge_image_is_refused_as_pillow_refuses_it(tmp_path,
                                                                        monkeypatch):
    """A few KB claiming 65000x65000 pixels: refused before decoding (as Pillow refuses a
    decompression bomb), naming the file, on both decoders; skipped with on_error="skip"."""
    good = make_jpegs(tmp_path / "ok", 1, size=(64, 48), seed=4)[0]
    bomb = str(tmp_path / "bomb.jpg")
    with open(bomb, "wb") as f:
        f.write(_claim_size(open(good, "rb").read(), 65000, 65000))
    for decoder in ("auto", "pillow"):
        monkeypatch.setenv(DECODER_ENV, decoder)
        ds = ImageFiles([bomb, good], [0, 1], crop=CenterCrop(16), flip=0)
        with pytest.raises(ImageFileError, match="too large") as e:
            ds[0]
        assert bomb in str(e.value)
    monkeypatch.delenv(DECODER_ENV)
    ds = ImageFiles([bomb, good], [0, 1], crop=CenterCrop(16), flip=0, on_error="skip")
    with DataLoader(ds, batch_size=2, shuffle=False, num_workers=0) as dl:
        (x, y), = batches(dl)
        assert y.tolist() == [1, 1] and dl.stats.skipped == 1


@pytest.mark.parametrize("cut", [2, 40, "half"])
def test_a_truncated_jpeg_is_found_by_every_crop(tmp_path, monkeypatch, cut):
    """The compiled decoder reads only the crop's rows, yet a JPEG cut short is an
    error for every crop, those above the cut too, as Pillow (torchvision) finds
    it; with on_error="skip" the batches are then the same for every num_workers."""
    files = make_jpegs(tmp_path / "c", 3, size=(160, 160), seed=6)
    data = open(files[0], "rb").read()
    open(files[0], "wb").write(data[:len(data) // 2 if cut == "half" else len(data) - cut])
    with pytest.raises(OSError, match="truncated"):
        Image.open(files[0]).load()
    top = RandomResizedCrop(16, scale=(0.02, 0.05))
    for decoder in ("auto", "pillow"):
        monkeypatch.setenv(DECODER_ENV, decoder)
        ds = ImageFiles(files, [0, 1, 2], crop=top, output="uint8")
        with pytest.raises(ImageFileError, match="truncated") as e:
            ds.gather_batch([0] * 16, np.empty)   # 16 small boxes, some near the top
        assert files[0] in str(e.value)
    monkeypatch.delenv(DECODER_ENV)
    ds = ImageFiles(files, [0, 1, 2], crop=top, output="uint8", on_error="skip")
    kw = dict(batch_size=4, sampler=[0, 1, 0, 2] * 6, seed=3)
    with DataLoader(ds, num_workers=0, **kw) as dl:
        ref = batches(dl)
        assert dl.stats.skipped == 12
    with DataLoader(ds, num_workers=2, **kw) as dl:
        assert_same_pairs(batches(dl), ref)
        assert dl.stats.skipped == 12
    assert (np.concatenate([y for _, y in ref]) != 0).all()


def test_skip_does_not_pass_off_running_out_of_descriptors_as_bad_files(folder):
    """EMFILE says the process is short of descriptors, not that the file is bad:
    it is raised with on_error="skip" too, and the file is not remembered as bad."""
    resource = pytest.importorskip("resource")
    ds = ImageFolder(folder, crop=CenterCrop(16), flip=0, on_error="skip")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
    try:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        with pytest.raises(OSError, match="Too many open files"):
            ds[0]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not ds._bad
    assert ds[0][0].shape == (3, 16, 16)


# --------------------------------------------------------------------------
# Memory in forked workers


def _memory(pid):
    """(resident bytes, bytes written by ``pid`` alone: its copies-on-write) of a process."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return tuple(int(fields[k].split()[0]) * 1024 for k in ("Rss", "Private_Dirty"))


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux /proc only")
def test_a_million_names_stay_shared_in_forked_workers(tmp_path):
    files = make_jpegs(tmp_path, 4, size=(48, 40), seed=1)
    n = 1_000_000
    # Long names, as real trees have them, each pointing at one of 4 real files
    # through a chain of ./ components.
    names = [os.path.join(os.path.dirname(files[i % 4]), "./" * (8 + i % 5),
                          os.path.basename(files[i % 4])) for i in range(n)]
    ds = ImageFiles(names, np.arange(n) % 10, crop=CenterCrop(16, resize=16), flip=0)
    del names
    index_bytes = ds._names.nbytes + ds.targets.nbytes
    assert index_bytes > 20 * 2**20
    # Every 250th sample: 4,000 reads spread over the whole index (its every page).
    sub = Subset(ds, np.arange(0, n, 250))
    with DataLoader(sub, batch_size=50, num_workers=2, multiprocessing_context="fork",
                    persistent_workers=True) as dl:
        it = iter(dl)
        next(it)
        pids = [p.pid for p in multiprocessing.active_children()
                if p.name.startswith("netcl_loader-worker")]
        assert len(pids) == 2
        before = {p: _memory(p) for p in pids}
        for _ in it:
            pass
        after = {p: _memory(p) for p in pids}
    rss = [after[p][0] - before[p][0] for p in pids]
    private = [after[p][1] - before[p][1] for p in pids]
    # Resident memory grows by the index pages the worker read (shared with the
    # parent, never copied) and its own buffers; a Python object per sample
    # would be copied page by page as its reference count changes.
    assert max(rss) < index_bytes, (rss, index_bytes)
    assert max(private) < index_bytes / 20, (private, index_bytes)


def test_image_files_checks_its_lists(folder):
    paths = [str(p) for p in sorted((folder / "cat").iterdir())]
    with pytest.raises(ValueError, match="8 paths but 3 labels"):
        ImageFiles(paths, [0, 1, 2])
    with pytest.raises(ValueError, match="single name"):
        ImageFiles(paths[0], [0])
    # Every refusal names the argument and the value.
    for labels in (["cat"] * 8, [0.5] * 8, [[0] * 4] * 2):
        with pytest.raises(ValueError, match=r"labels must be a sequence of integers") as e:
            ImageFiles(paths, labels)
        assert repr(labels)[:20] in str(e.value)
    assert ImageFiles(paths, np.arange(8.0)).targets.dtype == np.int64   # whole floats
    with pytest.raises(TypeError, match=r"paths\[1\] is None"):
        ImageFiles([paths[0], None], [0, 1])
    with pytest.raises(TypeError, match="paths must be a sequence of file names, got 5"):
        ImageFiles(5, [0])
    with pytest.raises(TypeError, match="root must be a folder name.*got 5"):
        ImageFolder(5)
    with pytest.raises(TypeError, match="shards must be a sequence of file names, got 5"):
        TarImages(5)
    ds = ImageFiles(paths, range(8), crop=CenterCrop(16), flip=0)
    assert len(ds) == 8 and ds.path(-1) == paths[-1]
    np.testing.assert_array_equal(ds[-1][0], ds[7][0])
    with pytest.raises(IndexError, match="index 8 is out of range"):
        ds[8]
    with pytest.raises(IndexError, match="out of range"):
        ds.gather_batch([0, 9], np.empty)


def test_spawned_workers_make_the_same_batches(folder):
    """Under spawn the dataset travels pickled (its arrays, not a file list)."""
    ds = ImageFolder(folder, crop=RandomResizedCrop(24), output="uint8")
    with DataLoader(ds, batch_size=6, shuffle=True, seed=2) as dl:
        ref = batches(dl)
    with DataLoader(ds, batch_size=6, shuffle=True, seed=2, num_workers=2,
                    multiprocessing_context="spawn") as dl:
        assert_same_pairs(batches(dl), ref)


def test_a_mean_or_std_on_the_0_255_scale_warns_once_naming_the_0_1_scale(folder):
    """``mean=(124, 116, 104)`` (0-255) where 0-1 is expected quietly gave images
    around -500: with float output, a mean or std above 1 warns once, at
    construction, naming the scale expected and the values divided by 255."""
    import warnings
    from netcl_loader.images import DetectionFiles
    with pytest.warns(UserWarning, match=r"mean=\(124.0, 116.0, 104.0\).*expected on the 0-1 "
                                         r"scale.*mean=\(0.486, 0.455, 0.408\)") as caught:
        ImageFolder(folder, crop=CenterCrop(16), mean=(124, 116, 104), std=(0.2, 0.2, 0.2))
    assert len(caught) == 1 and caught[0].filename == __file__  # the caller's line
    with pytest.warns(UserWarning, match=r"DetectionFiles: std=\(58.0, 57.0, 57.0\)") as caught:
        DetectionFiles([str(folder / "cat" / os.listdir(folder / "cat")[0])], [[[0, 0, 5, 5]]],
                       [[1]], mean=(0.5, 0.5, 0.5), std=(58, 57, 57))
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ImageFolder(folder, crop=CenterCrop(16), mean=(0.485, 0.456, 0.406), std=(1, 1, 1))
        ImageFolder(folder, crop=CenterCrop(16), mean=(124, 116, 104), std=(58, 57, 57),
                    output="uint8")  # not normalised: nothing to say


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_corrupt_image_error_names_the_fix_on_error_skip(bad_folder, num_workers):
    """The error for a bad file names the file and the fix: ``on_error="skip"``.  It
    prints under its public name, ``netcl_loader.images.ImageFileError``."""
    import traceback
    root, paths = bad_folder
    loader = DataLoader(ImageFolder(root, crop=CenterCrop(16), flip=0), batch_size=8,
                        shuffle=False, num_workers=num_workers, persistent_workers=False)
    with pytest.raises(ImageFileError) as e:
        list(loader)
    text = str(e.value)
    assert paths[1] in text and "empty" in text
    assert 'pass on_error="skip" to ImageFolder' in text
    shown = traceback.format_exception_only(type(e.value), e.value)[-1]
    assert shown.startswith("netcl_loader.images.ImageFileError: "), shown
