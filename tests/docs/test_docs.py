"""The documentation runs: every Python example in README.md and docs/*.md, and the API reference.

Each fenced ```python block of README.md and docs/*.md is one test
(``test_python_block[FILE#N-lineL]``): it is written to a script file and run
by the interpreter running the tests, in a subprocess with a timeout
(``BLOCK_TIMEOUT_SECONDS``), in a fresh folder holding the small data it
needs. A block runs as a script, so a block whose workers may be spawned
guards its loop with ``if __name__ == "__main__":``.

An HTML comment on the line before a block tells this test what the block
needs, in the words ``<!-- doc-test: ... -->``:

- ``setup=NAME``: a setup below makes the data the block's comments say a
  reader supplies (an image folder, a COCO tree, token files, an S3 store
  and an HTTP server on 127.0.0.1). It may prepend code that defines the
  names the block says are yours (``dataset``, ``model``, ...), and it may
  give values to top-level assignments of the block (``BUCKET = "s3://..."``
  lines, whose comment says the reader supplies them): each such line is
  replaced by the setup's value, and a setup naming a line the block lacks
  fails the test.
- ``needs=MODULE[,MODULE]``: the block is skipped, saying which, where a
  module it imports is not installed (``opencl``: pyopencl and a device
  that builds a program).
- ``skip REASON``: not run at all, with the reason (used for none today).

bash blocks are not run (they install system packages, build wheels, run
the suite or benchmarks); of them, this file checks that every ``pip
install`` line names only extras pyproject.toml defines and never installs
the package by name from an index (it is installed from its wheel or a
clone), and that the README's marked command blocks are where CI looks for
them. Signature blocks marked ``<!-- api: QUALIFIED.NAME -->`` must match
``inspect.signature`` of the real object: the parameter names, their kinds
and their defaults.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC_FILES = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
#: Seconds one block may run: the slowest (a Trainer's epoch, a store's
#: start) take 10-30 s on 2 busy cores.
BLOCK_TIMEOUT_SECONDS = 240
#: The README stays a front page; the rest lives in docs/.
README_MAX_LINES = 300

_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
_API = re.compile(r"^<!--\s*api:\s*([\w.]+)\s*-->\s*$")


class Block:
    def __init__(self, path, number, line, lang, code, before):
        self.path, self.number, self.line, self.lang = path, number, line, lang
        self.code, self.before = code, before

    @property
    def id(self):
        return f"{self.path}#{self.number}-line{self.line}"


def blocks(path):
    """The fenced blocks of a markdown file, each with the line before its fence."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        before = lines[start - 1] if start > 0 else ""
        out.append(Block(path, len(out) + 1, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n",
                         before))
        i = j + 1
    return out


def directives(block):
    """``{"setup": NAME, "needs": [...], "skip": REASON}`` from the comment before a block."""
    m = _DIRECTIVE.match(block.before.strip())
    if not m:
        return {}
    text = m.group(1)
    if text.startswith("skip"):
        return {"skip": text[4:].strip() or "no reason given"}
    out = {}
    for word in text.split():
        key, _, value = word.partition("=")
        if key == "setup":
            out["setup"] = value
        elif key == "needs":
            out["needs"] = value.split(",")
        else:
            raise ValueError(f"unknown doc-test directive {word!r} before {block.id}")
    return out


PYTHON_BLOCKS = [b for path in DOC_FILES for b in blocks(path) if b.lang == "python"]


# ----------------------------------------------------------------------------- what blocks need


def _opencl_missing():
    """None where an OpenCL device builds a program, else why not (an absent capability)."""
    if importlib.util.find_spec("pyopencl") is None:
        return "pyopencl is not installed (the pocl or opencl extra)"
    from conftest import _first_queue
    queue, why = _first_queue()
    return None if queue is not None else why


def _need(modules):
    for mod in modules:
        if mod == "opencl":
            why = _opencl_missing()
            if why:
                pytest.skip(f"the block needs an OpenCL device: {why}")
        elif importlib.util.find_spec(mod) is None:
            pytest.skip(f"the block needs {mod}, which is not installed")


class Setup:
    """What a setup hands the block: code put before it, values for its supplied
    assignments, environment variables."""

    def __init__(self, prelude="", supplied=None, env=None):
        self.prelude = textwrap.dedent(prelude)
        self.supplied = supplied or {}
        self.env = env or {}


SETUPS = {}


def setup(name, needs=()):
    def register(fn):
        SETUPS[name] = (contextlib.contextmanager(fn), tuple(needs))
        return fn
    return register


@setup("torch_dataset", needs=["torch"])
def _torch_dataset(folder):
    yield Setup("""
        import torch
        from torch.utils.data import TensorDataset
        dataset = TensorDataset(torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,)))
        """)


@setup("torch_model", needs=["torch", "accelerate"])
def _torch_model(folder):
    yield Setup("""
        import torch
        from torch.utils.data import TensorDataset
        ds = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """)


@setup("hf_trainer", needs=["torch", "transformers", "accelerate"])
def _hf_trainer(folder):
    yield Setup("""
        import torch
        import transformers

        class TinyConfig(transformers.PretrainedConfig):
            model_type = "doc_tiny"

        class Tiny(transformers.PreTrainedModel):
            config_class = TinyConfig

            def __init__(self, config):
                super().__init__(config)
                self.lin = torch.nn.Linear(4, 1)

            def forward(self, x, labels=None):
                pred = self.lin(x).squeeze(-1)
                return {"loss": ((pred - labels) ** 2).mean(), "logits": pred}

        class Pairs(torch.utils.data.Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, i):
                x = torch.randn(4, generator=torch.Generator().manual_seed(i))
                return {"x": x, "labels": float(x.sum())}

        model, ds, ds_eval = Tiny(TinyConfig()), Pairs(), Pairs()
        args = transformers.TrainingArguments(
            output_dir="trainer-out", per_device_train_batch_size=8, num_train_epochs=1,
            dataloader_num_workers=2, save_strategy="no", report_to="none", use_cpu=True,
            disable_tqdm=True)
        """)


@setup("gpu", needs=["opencl"])
def _gpu(folder):
    yield Setup("""
        import numpy as np
        from netcl_loader import ArrayDataset
        dataset = ArrayDataset(np.random.default_rng(0).random((512, 3, 16, 16), dtype=np.float32),
                               np.arange(512))

        def step(x, y):       # a real step enqueues kernels on the queue, after x.events
            doubled = (2 * x).get()   # a kernel on the queue: runs after the upload
            assert doubled.shape[1:] == (3, 16, 16) and len(y) == x.shape[0]
        """)


@setup("image_folder", needs=["PIL"])
def _image_folder(folder):
    from images_util import make_jpegs
    for k, cls in enumerate(["cat", "dog"]):
        make_jpegs(os.path.join(folder, "train", cls), 12, size=(96, 72), seed=k)
    yield Setup()


@setup("token_file")
def _token_file(folder):
    import numpy as np
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(1, 1000, size=rng.integers(20, 400)), 0) for _ in range(500)]
    np.concatenate(docs).astype(np.uint16).tofile(os.path.join(folder, "train.bin"))
    yield Setup()


@setup("wider", needs=["PIL", "torch"])
def _wider(folder):
    from detection_trees import make_wider
    make_wider(os.path.join(folder, "WIDER"), split="train")
    yield Setup()


@setup("coco", needs=["PIL", "torch"])
def _coco(folder):
    from detection_trees import make_coco
    root = os.path.join(folder, "coco")
    make_coco(root)
    os.rename(os.path.join(root, "images"), os.path.join(root, "train2017"))
    os.rename(os.path.join(root, "annotations", "instances.json"),
              os.path.join(root, "annotations", "instances_train2017.json"))
    yield Setup()


def _shard(path, jpegs, first_label):
    with tarfile.open(path, "w") as tf:
        for k, jpeg in enumerate(jpegs):
            for suffix, data in ((".jpg", open(jpeg, "rb").read()),
                                 (".cls", str(first_label + k).encode())):
                info = tarfile.TarInfo(f"{k:06d}{suffix}")
                info.size = len(data)
                import io
                tf.addfile(info, io.BytesIO(data))


@setup("object_storage", needs=["PIL", "s3fs", "aiohttp", "boto3"])
def _object_storage(folder):
    """SeaweedFS (S3, signing enforced) and nginx on 127.0.0.1, holding four
    shards, two files and a two-class folder."""
    for tool in ("weed", "nginx"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            pytest.skip(f"the block needs a local {tool} to stand in for the reader's store")
    from images_util import make_jpegs
    import remote_util
    jpegs = make_jpegs(os.path.join(folder, "jpegs"), 16, size=(96, 72))
    served = os.path.join(folder, "served")
    os.makedirs(os.path.join(served, "train"))
    for s in range(4):
        _shard(os.path.join(served, "train", f"shard-{s:06d}.tar"), jpegs[4 * s:4 * s + 4], 4 * s)
    with remote_util.SeaweedFS() as weed, remote_util.Nginx(served) as http:
        for name in sorted(os.listdir(os.path.join(served, "train"))):
            weed.put_file(f"train/{name}", os.path.join(served, "train", name))
        weed.put_file("img/0001.jpg", jpegs[0])
        weed.put_file("img/0002.jpg", jpegs[1])
        for k, cls in enumerate(["a", "b"]):
            weed.put_file(f"folder/{cls}/x{k}.jpg", jpegs[2 + k])
        yield Setup(supplied={"BUCKET": f"s3://{weed.bucket}", "ENDPOINT": weed.url,
                              "HTTP": http.url, "CACHE": os.path.join(folder, "cache")},
                    env={"AWS_ACCESS_KEY_ID": remote_util.ACCESS_KEY,
                         "AWS_SECRET_ACCESS_KEY": remote_util.SECRET_KEY})


def _supply(code, supplied, block):
    for name, value in supplied.items():
        pattern = re.compile(rf"^{name} = .*$", re.M)
        assert pattern.search(code), f"{block.id} has no line '{name} = ...' for its setup to supply"
        code = pattern.sub(f"{name} = {value!r}  # supplied by tests/docs/test_docs.py", code,
                           count=1)
    return code


# ----------------------------------------------------------------------------- the tests


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block(block, tmp_path):
    d = directives(block)
    if "skip" in d:
        pytest.skip(f"{block.id} is marked skip: {d['skip']}")
    _need(d.get("needs", ()))
    setup_name = d.get("setup")
    if setup_name is not None:
        assert setup_name in SETUPS, f"{block.id} names an unknown setup {setup_name!r}"
        make, needs = SETUPS[setup_name]
        _need(needs)
        ctx = make(str(tmp_path))
    else:
        ctx = contextlib.nullcontext(Setup())
    with ctx as s:
        script = tmp_path / "block.py"
        code = _supply(block.code, s.supplied, block)
        script.write_text((s.prelude + "\n" if s.prelude else "") + code)
        env = dict(os.environ, **s.env)
        env["MPLBACKEND"] = "Agg"
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT_SECONDS)
    assert proc.returncode == 0, (
        f"{block.id} exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-5000:]}")


def test_every_python_block_is_collected():
    """The README's quick start and swap are among the blocks run, so a change
    of the fence syntax cannot silently run none."""
    readme = [b for b in PYTHON_BLOCKS if b.path == "README.md"]
    assert len(readme) >= 2
    assert len(PYTHON_BLOCKS) >= 12


def _extras():
    try:
        import tomllib
    except ImportError:   # Python 3.10: the table's keys, read as text
        with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
            table = f.read().split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        return set(re.findall(r"^([\w-]+)\s*=", table, re.M))
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return set(tomllib.load(f)["project"]["optional-dependencies"])


def test_install_lines_name_only_defined_extras():
    """Every ``pip install`` line of a bash block installs this package from its
    wheel or a clone, with extras pyproject.toml defines."""
    extras = _extras()
    seen = 0
    for path in DOC_FILES:
        for b in blocks(path):
            if b.lang != "bash":
                continue
            for line in b.code.splitlines():
                if "pip install" not in line:
                    continue
                assert not re.search(r"netcl[-_]loader\[", line.replace(".whl[", "")), (
                    f"{b.id}: the package is not on an index; install it from its wheel or a "
                    f"clone: {line.strip()}")
                for group in re.findall(r"(?:\.whl\)?|[\"' ]\.)\[([\w,\-]+)\]", line):
                    seen += 1
                    unknown = set(group.split(",")) - extras
                    assert not unknown, (f"{b.id}: extras {sorted(unknown)} are not in "
                                         f"pyproject.toml ({sorted(extras)}): {line.strip()}")
    assert seen >= 3   # the install page's wheel and source lines, the README's commands


def test_readme_marked_commands_are_where_ci_reads_them():
    """Each marker line is followed at once by its ```bash fence (CI's awk takes
    the first ``` block after the test command's marker)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    for marker in ("main-command", "test-command", "wheel-command", "windows-command"):
        at = [i for i, line in enumerate(lines) if line.strip() == f"<!-- {marker} -->"]
        assert len(at) == 1, f"README.md has {len(at)} '<!-- {marker} -->' markers"
        assert lines[at[0] + 1] == "```bash", f"'<!-- {marker} -->' is not followed by ```bash"


def test_readme_is_a_front_page():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        n = len(f.read().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail to docs/"


def test_relative_links_resolve():
    for path in DOC_FILES:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            file = target.split("#")[0]
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(path), file))
            assert os.path.exists(full), f"{path} links to {target}, which does not exist"


def test_readme_links_every_docs_page():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        linked = set(re.findall(r"\]\((docs/[\w-]+\.md)[#)]", f.read()))
    pages = {p for p in DOC_FILES if p.startswith("docs")}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def test_asan_file_list_matches_ci():
    """docs/install.md names the test files .ci/asan runs by default."""
    with open(os.path.join(ROOT, ".ci", "asan")) as f:
        script = f.read()
    m = re.search(r"set -- (.*?)\nfi", script, re.S)
    ci = re.findall(r"tests/\S+\.py", m.group(1))
    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"<!-- asan-files -->(.*?)<!-- /asan-files -->", text, re.S)
    assert m, "docs/install.md has no <!-- asan-files --> list"
    assert re.findall(r"tests/\S+?\.py", m.group(1)) == ci


# ----------------------------------------------------------------------------- the API reference


def _api_blocks():
    out = []
    for path in DOC_FILES:
        for b in blocks(path):
            m = _API.match(b.before.strip())
            if m:
                out.append((m.group(1), b))
    return out


API_BLOCKS = _api_blocks()
#: What the reference must cover, at least.
API_REQUIRED = {"netcl_loader.DataLoader", "netcl_loader.torch.DataLoader", "netcl_loader.tune",
                "netcl_loader.images.TarImages", "netcl_loader.images.ImageFolder",
                "netcl_loader.images.DetectionFiles", "netcl_loader.text.TokenFiles"}


def _resolve(qualname):
    mod, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def test_api_reference_covers_the_public_entry_points():
    assert API_REQUIRED <= {q for q, _ in API_BLOCKS}


@pytest.mark.parametrize("qualname,block", API_BLOCKS, ids=[q for q, _ in API_BLOCKS])
def test_api_signature_matches_the_code(qualname, block):
    if qualname.startswith("netcl_loader.torch."):
        pytest.importorskip("torch")
    obj = _resolve(qualname)
    name = qualname.rpartition(".")[2]
    text = " ".join(line.strip() for line in block.code.splitlines())
    assert text.startswith(name + "("), f"{block.id}: the signature must start with {name}("
    fn = ast.parse(f"def {text[:-1].rstrip()}) -> None: pass".replace(f"def {name}(", "def f(", 1))
    args = fn.body[0].args
    doc = []   # (name, kind, default source or None)
    pos = args.posonlyargs + args.args
    defaults = [None] * (len(pos) - len(args.defaults)) + args.defaults
    for a, d in zip(pos, defaults):
        doc.append((a.arg, "POSITIONAL_OR_KEYWORD", d))
    if args.vararg:
        doc.append((args.vararg.arg, "VAR_POSITIONAL", None))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        doc.append((a.arg, "KEYWORD_ONLY", d))
    if args.kwarg:
        doc.append((args.kwarg.arg, "VAR_KEYWORD", None))
    real = [p for p in inspect.signature(obj).parameters.values()]
    assert [n for n, _, _ in doc] == [p.name for p in real], (
        f"{block.id}: documented parameters differ from {qualname}'s")
    ns = vars(importlib.import_module(qualname.rpartition(".")[0]))
    for (n, kind, d), p in zip(doc, real):
        kind_real = "POSITIONAL_OR_KEYWORD" if p.kind == p.POSITIONAL_ONLY else p.kind.name
        assert kind == kind_real, f"{block.id}: {n} is {kind_real}, documented {kind}"
        if p.default is inspect.Parameter.empty:
            assert d is None, f"{block.id}: {n} has no default, documented {ast.unparse(d)}"
            continue
        assert d is not None, f"{block.id}: {n} defaults to {p.default!r}, documented none"
        value = eval(compile(ast.Expression(d), block.id, "eval"), dict(ns))
        assert repr(value) == repr(p.default), (
            f"{block.id}: {n} defaults to {p.default!r}, documented {ast.unparse(d)}")
