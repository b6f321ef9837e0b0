"""The digits example with a PyTorch model: batches become tensors by torch.from_numpy.

Same data, split and loader as ``train_digits.py``; the model is a
``torch.nn.Sequential`` MLP trained with ``torch.optim.SGD``.  The loader
yields NumPy arrays the caller owns, so ``torch.from_numpy`` wraps them
without a copy.

    python examples/train_digits_torch.py            # 30 epochs
    python examples/train_digits_torch.py --quick    # 8 epochs, still >= 90%
"""
import os
import sys
import time

from netcl_loader import ArrayDataset, DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import load_split, parse_args  # noqa: E402  (the same data, split, options)


def main(argv=None):
    args, epochs = parse_args(argv, __doc__.splitlines()[0])

    try:
        import torch
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
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    with DataLoader(ArrayDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True,
                    num_workers=args.workers, seed=args.seed) as loader:
        for epoch in range(epochs):
            model.train()
            total, seen = 0.0, 0
            for xb, yb in loader:
                x, y = torch.from_numpy(xb), torch.from_numpy(yb)   # no copy
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
