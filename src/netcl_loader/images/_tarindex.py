"""The index of a WebDataset-layout tar shard: each sample's byte offset, size and label."""
from __future__ import annotations

import os
import re
import tarfile

import numpy as np

from ._sources import _names_blob

__all__ = []

#: WebDataset's sample key and suffix, its ``tariterators.base_plus_ext``
#: regex exactly: the member name up to the first dot after its last slash
#: (directories included in the key), and everything after that dot.
_WDS_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: Members WebDataset's ``tariterators.tar_file_iterator`` skips: names matching
#: its ``skip_meta`` (``__...__`` at the start), and ``__*__`` at the top level.
_WDS_META = re.compile(r"__[^/]*__($|/)")
_TAR_IMAGE_EXTS = ("jpg", "jpeg", "png")
#: Version of the cached tar index (bumped when its layout or the grouping rule
#: changes: a cache of another version is rebuilt).  2: samples grouped as
#: WebDataset groups them (a key repeated later is a new sample).
_TAR_INDEX_VERSION = 2
#: The range of a ``.cls`` label (the labels are int64).
_INT64 = (-(1 << 63), (1 << 63) - 1)


class _TarIndex:
    """The byte offsets of one shard's samples (built with tarfile, cached beside it)."""

    @staticmethod
    def label(shard, tf, m):
        """The int64 label in ``.cls`` member ``m``, read as WebDataset's decoder
        reads one (``int`` of its text); ValueError naming the shard and the member."""
        try:
            text = tf.extractfile(m).read().decode("utf-8", "replace").strip()
        except (tarfile.TarError, OSError) as exc:
            raise ValueError(f"TarImages: {shard} is damaged: {m.name} cannot be "
                             f"read ({exc})") from None
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"TarImages: {shard}: {m.name} holds {text[:40]!r}, "
                             f"not an integer class label") from None
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"TarImages: {shard}: {m.name} holds the label {text[:40]}, "
                             f"outside int64 [{_INT64[0]}, {_INT64[1]}] (labels are int64)")
        return value

    @staticmethod
    def load(shard):
        st = os.stat(shard)
        stamp = np.array([st.st_size, st.st_mtime_ns, _TAR_INDEX_VERSION], np.int64)
        cache = shard + ".idx.npz"
        try:
            with np.load(cache) as z:
                if np.array_equal(z["stamp"], stamp):
                    return {k: z[k] for k in ("offset", "size", "label", "keys", "key_offsets",
                                              "ext")}
        except Exception:  # missing, stale layout or damaged (a zip error): rebuilt
            pass
        index = _TarIndex.build(shard)
        tmp = f"{cache}.{os.getpid()}.tmp.npz"
        try:
            np.savez(tmp, stamp=stamp, **index)
            os.replace(tmp, cache)   # atomic: a reader sees a whole index or none
        except OSError:
            # Not writable (or the cache's name is taken by a folder): the
            # index lives in memory only, and no temporary is left behind.
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return index

    @staticmethod
    def build(shard, fileobj=None):
        """The index of ``shard``: its samples grouped as WebDataset groups them
        (``tariterators.group_by_keys``): a sample is a run of consecutive
        members sharing a key, so a key seen again after another key starts a
        new sample (two shards appended into one read as both).

        ``fileobj``: the shard's bytes as a stream read once from start to end
        (a remote shard), ``shard`` then only its name in messages.  Members
        are taken in one pass, each ``.cls`` read as it comes, so the same
        code indexes a local file and a stream.
        """
        samples = []   # (key, {"image": (offset, size, ext), "cls": label}) in tar order
        seen = set()   # the suffixes of the current sample
        try:
            # Uncompressed only: samples are read by offset.
            tf = (tarfile.open(shard, "r:") if fileobj is None
                  else tarfile.open(fileobj=fileobj, mode="r|"))
        except tarfile.ReadError as exc:
            raise ValueError(f"TarImages: {shard} is not an uncompressed tar file ({exc}); "
                             f"samples are read by byte offset, so shards must not be "
                             f"compressed") from None
        with tf:
            for m in _members(tf, shard):   # headers: the images are not read
                name = m.name
                # What tar_file_iterator skips: other than regular files, and
                # WebDataset's metadata members (__...__).
                if not m.isreg() or _WDS_META.match(name) or (
                        "/" not in name and name.startswith("__") and name.endswith("__")):
                    continue
                match = _WDS_KEY.match(name)
                if match is None:
                    continue   # no suffix: no sample (WebDataset skips it too)
                key, ext = match.group(1), match.group(2).lower()
                if not samples or samples[-1][0] != key:
                    samples.append((key, {}))
                    seen.clear()
                if ext in seen:
                    raise ValueError(f"TarImages: {shard}: {name} repeats the suffix {ext!r} "
                                     f"within sample {key!r} (WebDataset refuses it too)")
                seen.add(ext)
                g = samples[-1][1]
                if ext in _TAR_IMAGE_EXTS:
                    if "image" in g:
                        raise ValueError(f"TarImages: {shard}: sample {key!r} has two images "
                                         f"(.{g['image'][2]} and {name}); one is expected")
                    g["image"] = (m.offset_data, m.size, ext)
                elif ext == "cls":
                    g["cls"] = _TarIndex.label(shard, tf, m)
        offsets, sizes, labels, keys, exts = [], [], [], [], []
        for key, g in samples:
            if "image" not in g and "cls" not in g:
                continue   # another kind of sample (no image, no label): not ours
            if "image" not in g or "cls" not in g:
                missing = "image (.jpg/.jpeg/.png)" if "image" not in g else "label (.cls)"
                raise ValueError(f"TarImages: {shard}: sample {key!r} has no {missing} (a "
                                 f"sample is a run of consecutive members sharing a key, as "
                                 f"WebDataset reads them)")
            off, size, ext = g["image"]
            offsets.append(off)
            sizes.append(size)
            labels.append(g["cls"])
            keys.append(key.encode("utf-8", "surrogateescape"))
            exts.append(_TAR_IMAGE_EXTS.index(ext))
        blob, key_offsets = _names_blob(keys)
        return {"offset": np.array(offsets, np.int64), "size": np.array(sizes, np.int64),
                "label": np.array(labels, np.int64), "keys": blob, "key_offsets": key_offsets,
                "ext": np.array(exts, np.int8)}


def _members(tf, shard):
    """The members of ``tf`` one by one; a damaged tar is a ValueError naming ``shard``."""
    it = iter(tf)
    while True:
        try:
            m = next(it)
        except StopIteration:
            return
        except tarfile.TarError as exc:
            raise ValueError(f"TarImages: {shard} is damaged: {exc} (a truncated or "
                             f"corrupt tar file)") from None
        yield m
