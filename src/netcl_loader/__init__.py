"""netcl_loader: a fast, trustworthy data loader for training loops."""
try:
    from . import _collate, _ring  # noqa: F401  the compiled core
except ImportError as exc:  # pragma: no cover - a broken install
    raise ImportError(
        f"netcl_loader's compiled extension could not be imported ({exc}). Remedy: reinstall "
        f"the package where a C compiler is available (pip install --force-reinstall "
        f"--no-binary netcl-loader netcl-loader, or pip install . from a clone).") from exc

from .engine.worker_info import WorkerInfo, get_worker_info
from ._errors import CollateError
from .dataloader import DataLoader, LoaderStats, LoaderTimeout, WorkerError
from .datasets import ArrayDataset, Subset, random_split
from .gpu_batch import GpuBatch
from .remote import Retry

__version__ = "0.1.0"

__all__ = ["DataLoader", "ArrayDataset", "Subset", "random_split", "get_worker_info",
           "WorkerInfo", "GpuBatch", "WorkerError", "LoaderTimeout", "CollateError", "LoaderStats",
           "Retry", "tune",
           "__version__"]


def __getattr__(name):
    # tune() is re-exported on first use, not at import: `python -m
    # netcl_loader.tune` runs the module as __main__, and runpy warns when
    # the package has imported it before.
    if name == "tune":
        from .tune import tune
        globals()["tune"] = tune  # replaces the submodule the import bound here
        return tune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
