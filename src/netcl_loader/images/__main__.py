"""``python -m netcl_loader.images index PATTERN``: write the index sidecar of each tar shard beside it."""
from __future__ import annotations

import argparse
import json
import sys

from ..remote.objects import SIDECAR_SUFFIX, Progress, infos_of, store_of
from ..remote.urls import is_remote, names_of, redact
from ._shards import build_remote_index, index_npz
from ._tarindex import _TarIndex


def index(patterns, endpoint_url=None, out=sys.stdout, storage_options=None):
    """Index every shard ``patterns`` name (brace ranges expanded) and write
    ``<shard>.idx.npz`` beside it.  Remote shards are read in one streaming
    pass each, with ``storage_options`` (fsspec's, as the datasets take them)
    and credentials from the store's usual environment and files
    (``endpoint_url`` for an S3-compatible store).  Returns the shards indexed."""
    names = names_of(patterns, "index", "PATTERN")
    local = [n for n in names if not is_remote(n)]
    remote = [n for n in names if is_remote(n)]
    for shard in local:
        _TarIndex.load(shard)   # written beside the shard, where TarImages reads it
        print(f"indexed {shard}", file=out)
    if remote:
        options = dict(storage_options or {})
        if endpoint_url:
            options["endpoint_url"] = endpoint_url
        store = store_of(remote, options, None, "index")
        infos, _ = infos_of(store, remote, with_sidecars=False)
        bar = Progress(sum(i.size for i in infos), f"indexing {len(infos)} shards")
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
    p.add_argument("--anon", action="store_true",
                   help="read without credentials (a public bucket): storage option anon=True")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="one of the filesystem's storage options, as the datasets' "
                        "storage_options take them; VALUE is read as JSON where it parses "
                        "(true, 3, {\"a\": 1}), else as text; repeat for several")
    args = parser.parse_args(argv)
    options = {"anon": True} if args.anon else {}
    for item in args.storage_option:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            parser.error(f"--storage-option {item!r}: expected KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    try:
        index(args.pattern, args.endpoint_url, storage_options=options)
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        print(f"netcl_loader.images index: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
