"""netcl_loader: a fast, trustworthy data loader for training loops."""
from .dataloader import DataLoader, LoaderStats, WorkerError
from .datasets import ArrayDataset, Subset, random_split
from .gpu_batch import GpuBatch
from ._worker import WorkerInfo, get_worker_info

__version__ = "0.1.0"

__all__ = ["DataLoader", "ArrayDataset", "Subset", "random_split", "get_worker_info",
           "WorkerInfo", "GpuBatch", "WorkerError", "LoaderStats", "__version__"]
