"""The layer rule of docs/architecture.md, checked against every import in the package.

The table in the document is the rule: a part (a top-level module or a subpackage
taken whole) imports only parts of lower layers; layer 0 (the compiled core and
what it shares) may import within itself.  Imports inside functions count.
"""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "src", "netcl_loader")
DOC = os.path.join(ROOT, "docs", "architecture.md")


def layers():
    """{part: layer} from the document's table (rows ``| N | `a` `b` | job |``)."""
    out = {}
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
            if m:
                for part in re.findall(r"`([^`]+)`", m.group(2)):
                    out[part] = int(m.group(1))
    return out


def parts():
    """The package's parts: top-level modules (Python or Cython) and subpackages."""
    out = set()
    for name in os.listdir(PACKAGE):
        path = os.path.join(PACKAGE, name)
        stem, ext = os.path.splitext(name)
        if ext in (".py", ".pyx"):
            out.add(stem)
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            out.add(name)
    return out


def sources():
    """``(part, path)`` of every Python and Cython source in the package."""
    for folder, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith((".py", ".pyx")):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, PACKAGE).split(os.sep)
                yield os.path.splitext(rel[0])[0], path


def _module_of(path):
    rel = os.path.relpath(path, PACKAGE)
    names = ["netcl_loader"] + os.path.splitext(rel)[0].split(os.sep)
    return names[:-1] if names[-1] == "__init__" else names, names[-1] == "__init__"


def imported_parts(path, module=None):
    """``(line, part)`` for every import of the package's parts in ``path`` (read as
    ``module``, a list of names, when given)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".pyx"):  # Cython: its Python-level imports, by line
        found = []
        for i, line in enumerate(text.splitlines(), 1):
            m = re.match(r"\s*from\s+(\.+|netcl_loader\.)(\w+)", line)
            if m:
                found.append((i, m.group(2)))
        return found
    if module is None:
        module, is_package = _module_of(path)
    else:
        is_package = False
    found = []
    for node in ast.walk(ast.parse(text, path)):
        if isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
            names = [None] * len(targets)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            else:
                target = node.module.split(".")
            targets = [target] * len(node.names)
            names = [a.name for a in node.names]
        else:
            continue
        for target, name in zip(targets, names):
            if target[0] != "netcl_loader":
                continue
            if len(target) > 1:
                found.append((node.lineno, target[1]))
            elif name in parts():     # from netcl_loader import dataloader
                found.append((node.lineno, name))
            else:                     # from netcl_loader import DataLoader: the package root
                found.append((node.lineno, "__init__"))
    return found


def test_every_part_has_a_layer():
    missing = sorted(parts() - set(layers()))
    assert not missing, f"parts of the package missing from docs/architecture.md's layer table: {missing}"
    gone = sorted(set(layers()) - parts())
    assert not gone, f"docs/architecture.md's layer table names parts that do not exist: {gone}"


def violations(part, path, module=None):
    table = layers()
    mine = table[part]
    wrong = []
    for line, other in imported_parts(path, module):
        if other == part:
            continue
        theirs = table.get(other)
        allowed = theirs is not None and (theirs < mine or theirs == mine == 0)
        if not allowed:
            wrong.append(f"{os.path.relpath(path, PACKAGE)}:{line} imports {other} "
                         f"(layer {theirs}) from layer {mine}")
    return wrong


@pytest.mark.parametrize("part,path", sorted(sources()),
                         ids=lambda v: os.path.relpath(v, PACKAGE) if os.sep in str(v) else v)
def test_imports_follow_the_layers(part, path):
    wrong = violations(part, path)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("source,expected", [
    ("from ..dataloader import DataLoader\n", ["imports dataloader (layer 4) from layer 1"]),
    ("def f():\n    import netcl_loader.torch.loader\n", ["imports torch (layer 5) from layer 1"]),
    ("from netcl_loader import DataLoader\n", ["imports __init__ (layer 6) from layer 1"]),
    ("from .. import images\n", ["imports images (layer 3) from layer 1"]),
    ("from .._ring import READY\nfrom .order import numbered\nimport numpy\n", []),
])
def test_the_rule_catches_imports_against_it(tmp_path, source, expected):
    """The check itself, on a module written as if it sat in the engine."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    wrong = violations("engine", str(path), module=["netcl_loader", "engine", "probe"])
    assert [w.split(" ", 1)[1] for w in wrong] == expected


#: Parts held to less than their layer allows: object storage knows nothing of the
#: loader (it imports these parts of the package only).
ONLY = {"remote": {"_errors"}}


@pytest.mark.parametrize("part,path", sorted(p for p in sources() if p[0] in ONLY),
                         ids=lambda v: os.path.relpath(v, PACKAGE) if os.sep in str(v) else v)
def test_remote_imports_nothing_of_the_package_but_errors(part, path):
    wrong = [f"{os.path.relpath(path, PACKAGE)}:{line} imports {other}"
             for line, other in imported_parts(path) if other != part and other not in ONLY[part]]
    assert not wrong, "\n".join(wrong)
