"""The remote package's layering, read from the source: netcl_loader.remote imports nothing above it,
and the token datasets reach the object store through it, never through the image datasets."""
import ast
import os

import pytest

import netcl_loader

PACKAGE = os.path.dirname(os.path.abspath(netcl_loader.__file__))
#: Modules of the package that sit below everything (the compiled core imports them too).
BOTTOM = {"_errors"}


def imports_of(path):
    """``(line, level, module)`` of every import in ``path``, at any depth (lazy ones too)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, 0, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level and not node.module:   # from . import x, from .. import y
                out.extend((node.lineno, node.level, a.name) for a in node.names)
            else:
                out.append((node.lineno, node.level, node.module))
    return out


def modules_of(sub):
    folder = os.path.join(PACKAGE, sub)
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".py"))


@pytest.mark.parametrize("path", modules_of("remote"), ids=os.path.basename)
def test_remote_imports_only_itself_the_bottom_modules_and_outside_packages(path):
    for line, level, module in imports_of(path):
        where = f"{os.path.basename(path)}:{line} imports {'.' * level}{module}"
        top = module.split(".")[0]
        if level == 1:
            continue                                    # within netcl_loader.remote
        if level == 2:
            assert top in BOTTOM, where
        else:
            assert level == 0, where
            assert top != "torch", where
            if top == "netcl_loader":
                assert module.split(".")[1] in BOTTOM | {"remote"}, where


@pytest.mark.parametrize("path", modules_of("text"), ids=os.path.basename)
def test_text_reaches_the_store_through_remote_never_through_images(path):
    for line, level, module in imports_of(path):
        parts = module.split(".")
        if level == 2:
            above = parts[0]
        elif level == 0 and parts[0] == "netcl_loader" and len(parts) > 1:
            above = parts[1]
        else:
            above = None
        assert above != "images", f"{os.path.basename(path)}:{line} imports {module}"
