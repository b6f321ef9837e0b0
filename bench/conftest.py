"""Benchmark collection: ``python -m pytest bench`` also runs the ``bench_*.py`` suites.

pytest collects only ``test_*.py`` files by default; the kernel benchmarks
live in ``bench_augment.py``, so this hook collects ``bench_*.py`` too, and one
command (with ``--benchmark-autosave`` / ``--benchmark-compare``) covers every
suite.  A ``bench_*.py`` script without test functions contributes nothing.  ``python -m pytest tests`` never looks in this directory.
"""
import pytest


def pytest_collect_file(file_path, parent):
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):  # named on the command line: pytest collects it
        return pytest.Module.from_parent(parent, path=file_path)
    return None
