"""The digits example with a PyTorch model, fed by netcl_loader's PyTorch face.

Same data, split and options as ``train_digits.py``; the dataset is a
``torch.utils.data.TensorDataset`` and the model a ``torch.nn.Sequential`` MLP
trained with ``torch.optim.SGD``.  The loop is plain PyTorch: the only
netcl_loader line is the import of ``DataLoader``, which takes PyTorch's
arguments and yields torch tensors (collated by worker processes straight
into shared memory, and handed over without a copy).

    python examples/train_digits_torch.py            # 30 epochs
    python examples/train_digits_torch.py --quick    # 8 epochs, still >= 90%

Needs torch (the CPU build will do) and scikit-learn, besides netcl_loader.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import load_split, parse_args  # noqa: E402  (the same data, split, options)


def main(argv=None):
    args, epochs = parse_args(argv, __doc__.splitlines()[0])

    try:
        import torch
        from torch.utils.data import TensorDataset

        from netcl_loader.torch import DataLoader  # was: from torch.utils.data import DataLoader
    except ImportError as exc:
        print(f"train_digits_torch.py needs PyTorch, which is not importable ({exc}).\n"
              f"Install it (pip install torch), or run the NumPy version: "
              f"python examples/train_digits.py", file=sys.stderr)
        return 1
    torch.manual_seed(args.seed)
    # The model is tiny: more intra-op threads would only contend with the
    # loader's worker processes for the cores.
    torch.set_num_threads(1)

    x_train, y_train, x_test, y_test = load_split(args.seed)
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of 8x8 pixels")
    train = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    # PyTorch's arguments; the generator makes the shuffled order reproducible,
    # and persistent workers are kept from one epoch to the next.
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0,
                        generator=torch.Generator().manual_seed(args.seed))
    with loader:  # optional: ends the workers at once (else when the loader is collected)
        for epoch in range(epochs):
            model.train()
            total, seen = 0.0, 0
            for x, y in loader:                     # float32 (B, 64) and int64 (B,) tensors
                loss = loss_fn(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item() * len(y)
                seen += len(y)
            print(f"epoch {epoch + 1:2d}/{epochs}: loss {total / seen:.4f}", flush=True)
        print(f"loader: {loader.stats.summary()}")
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    accuracy = float((predicted == y_test).mean())
    print(f"trained in {time.perf_counter() - t0:.1f} s")
    print(f"test accuracy: {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
