"""Train a small NumPy MLP on scikit-learn's bundled digits, fed by netcl_loader.

The digits (1797 greyscale 8x8 images of 0-9) ship with scikit-learn, so
nothing is downloaded.  A quarter is held out for testing; the rest is an
``ArrayDataset`` that a ``DataLoader`` with two worker processes shuffles and
batches each epoch.  The model (64 -> 64 ReLU -> 10 softmax) is trained with
minibatch SGD with momentum; it reaches about 97% test accuracy.

    python examples/train_digits.py            # 30 epochs
    python examples/train_digits.py --quick    # 8 epochs, still >= 90%
"""
import argparse
import time

import numpy as np

from netcl_loader import ArrayDataset, DataLoader

#: Share of the digits held out for the test accuracy.
TEST_FRACTION = 0.25


def load_split(seed):
    """(x_train, y_train, x_test, y_test): pixels scaled to [0, 1] as float32, labels int64."""
    from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


class MLP:
    """One hidden ReLU layer and a softmax output, trained by SGD with momentum."""

    def __init__(self, n_in, n_hidden, n_out, seed):
        rng = np.random.default_rng(seed)
        # He initialisation for the ReLU layer, Glorot-like for the output.
        self.params = {
            "w1": (rng.standard_normal((n_in, n_hidden)) * np.sqrt(2.0 / n_in)).astype(np.float32),
            "b1": np.zeros(n_hidden, np.float32),
            "w2": (rng.standard_normal((n_hidden, n_out))
                   * np.sqrt(1.0 / n_hidden)).astype(np.float32),
            "b2": np.zeros(n_out, np.float32),
        }
        self.velocity = {k: np.zeros_like(v) for k, v in self.params.items()}

    def forward(self, x):
        p = self.params
        hidden = np.maximum(x @ p["w1"] + p["b1"], 0.0)
        return hidden, hidden @ p["w2"] + p["b2"]

    def step(self, x, y, lr, momentum):
        """One SGD step on a batch; returns its mean cross-entropy loss."""
        p = self.params
        hidden, logits = self.forward(x)
        logits -= logits.max(axis=1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(-np.log(prob[rows, y] + 1e-12).mean())
        grad_logits = prob
        grad_logits[rows, y] -= 1.0
        grad_logits /= len(y)
        grad_hidden = grad_logits @ p["w2"].T
        grad_hidden[hidden <= 0] = 0.0
        grads = {"w2": hidden.T @ grad_logits, "b2": grad_logits.sum(axis=0),
                 "w1": x.T @ grad_hidden, "b1": grad_hidden.sum(axis=0)}
        for k, g in grads.items():
            v = self.velocity[k]
            v *= momentum
            v -= lr * g
            p[k] += v
        return loss

    def predict(self, x):
        return self.forward(x)[1].argmax(axis=1)


def parse_args(argv, description):
    """The options both digits examples take; returns (args, epochs)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="8 epochs instead of 30")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return args, args.epochs if args.epochs is not None else (8 if args.quick else 30)


def main(argv=None):
    args, epochs = parse_args(argv, __doc__.splitlines()[0])

    x_train, y_train, x_test, y_test = load_split(args.seed)
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of 8x8 pixels")
    model = MLP(x_train.shape[1], 64, 10, args.seed)
    t0 = time.perf_counter()
    with DataLoader(ArrayDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True,
                    num_workers=args.workers, seed=args.seed) as loader:
        for epoch in range(epochs):
            total, seen = 0.0, 0
            for xb, yb in loader:                   # float32 (B, 64), int64 (B,)
                total += model.step(xb, yb, args.lr, momentum=0.9) * len(yb)
                seen += len(yb)
            print(f"epoch {epoch + 1:2d}/{epochs}: loss {total / seen:.4f}", flush=True)
        print(f"loader: {loader.stats.summary()}")
    accuracy = float((model.predict(x_test) == y_test).mean())
    print(f"trained in {time.perf_counter() - t0:.1f} s")
    print(f"test accuracy: {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
