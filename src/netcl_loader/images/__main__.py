"""``python -m netcl_loader.images index PATTERN``: write the index sidecar of each tar shard beside it."""
from __future__ import annotations

import argparse
import sys

from .._urls import is_remote, redact
from ._remote import (SIDECAR_SUFFIX, _Progress, build_remote_index, index_npz, infos_of,
                      names_of, store_of)
from ._tarindex import _TarIndex


def index(patterns, endpoint_url=None, out=sys.stdout):
    """Index every shard ``patterns`` name (brace ranges expanded) and write
    ``<shard>.idx.npz`` beside it.  Remote shards are read in one streaming
    pass each, with credentials from the store's usual environment and files
    (``endpoint_url`` for an S3-compatible store).  Returns the shards indexed."""
    names = names_of(patterns, "index", "PATTERN")
    local = [n for n in names if not is_remote(n)]
    remote = [n for n in names if is_remote(n)]
    for shard in local:
        _TarIndex.load(shard)   # written beside the shard, where TarImages reads it
        print(f"indexed {shard}", file=out)
    if remote:
        options = {"endpoint_url": endpoint_url} if endpoint_url else None
        store = store_of(remote, options, None, "index")
        infos, _ = infos_of(store, remote, with_sidecars=False)
        bar = _Progress(sum(i.size for i in infos), f"indexing {len(infos)} shards")
        try:
            for info in infos:
                data = index_npz(build_remote_index(store, info, progress=bar), info.version)
                store.sync(store.put, info.url + SIDECAR_SUFFIX, data)
                print(f"indexed {redact(info.url)}", file=out)
        finally:
            bar.close()
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m netcl_loader.images",
        description="Tools for image datasets.  index: write the index sidecar "
                    "(<shard>.idx.npz) of each WebDataset tar shard beside it, local or in "
                    "object storage, so that TarImages reads no shard at construction.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("index", help="write the index sidecars of tar shards")
    p.add_argument("pattern", nargs="+", help="shard paths or URLs; brace ranges expand "
                                              "(s3://bucket/train/shard-{000000..000127}.tar)")
    p.add_argument("--endpoint-url", default=None,
                   help="the endpoint of an S3-compatible store")
    args = parser.parse_args(argv)
    try:
        index(args.pattern, args.endpoint_url)
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        print(f"netcl_loader.images index: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
