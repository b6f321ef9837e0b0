"""Train a small NumPy classifier from a folder of JPEG files, fed by netcl_loader.images.

The script first writes an image folder in torchvision's layout
(``root/train/<class>/*.jpg``, ``root/test/<class>/*.jpg``) from the two
photos that scikit-learn ships (nothing is downloaded): random regions of
the "china" photo, of the "flower" photo, and of the "china" photo in grey,
re-encoded as JPEG.  ``ImageFolder`` with ``RandomResizedCrop`` and flips
feeds the training loop through a ``DataLoader`` with worker processes that
decode each file straight into the batch; the held-out folder is read with
the evaluation crop (``CenterCrop``).  The model is softmax regression on
the normalised 32x32 pixels, trained by SGD with momentum.

    python examples/train_images.py                  # 12 epochs, about 95% test accuracy
    python examples/train_images.py --quick          # 8 epochs on fewer images, about 90%
    python examples/train_images.py --root /tmp/imgs --workers 4
"""
import argparse
import os
import tempfile
import time

import numpy as np

from netcl_loader import DataLoader
from netcl_loader.images import CenterCrop, ImageFolder, RandomResizedCrop, decoder_info

#: Side of the square crops the model sees.
SIDE = 32
#: (width, height) of the generated files.
FILE_SIZE = (160, 120)


def write_folder(root, per_class_train, per_class_test, seed):
    """Write the train/test class folders under ``root`` (skipped if already there)."""
    from PIL import Image
    from sklearn.datasets import load_sample_images  # bundled with scikit-learn

    china, flower = load_sample_images().images
    sources = {"china": (china, "RGB"), "flower": (flower, "RGB"), "china_grey": (china, "L")}
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class_train), ("test", per_class_test)):
        for name, (photo, mode) in sources.items():
            folder = os.path.join(root, split, name)
            if os.path.isdir(folder) and len(os.listdir(folder)) == count:
                continue
            os.makedirs(folder, exist_ok=True)
            h, w = photo.shape[:2]
            for k in range(count):
                ch, cw = int(rng.integers(h // 3, h)), int(rng.integers(w // 3, w))
                top, left = int(rng.integers(0, h - ch)), int(rng.integers(0, w - cw))
                img = Image.fromarray(photo[top:top + ch, left:left + cw]).resize(FILE_SIZE)
                img.convert(mode).save(os.path.join(folder, f"{k:04d}.jpg"),
                                       quality=int(rng.integers(88, 96)))


class SoftmaxRegression:
    """A linear layer and a softmax, trained by SGD with momentum."""

    def __init__(self, n_in, n_out, seed):
        rng = np.random.default_rng(seed)
        self.w = (rng.standard_normal((n_in, n_out)) * 0.01).astype(np.float32)
        self.b = np.zeros(n_out, np.float32)
        self.vw, self.vb = np.zeros_like(self.w), np.zeros_like(self.b)

    def logits(self, x):
        return x.reshape(len(x), -1) @ self.w + self.b

    def step(self, x, y, lr, momentum=0.9):
        """One step on a batch; returns its mean cross-entropy."""
        flat = x.reshape(len(x), -1)
        z = self.logits(x)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(-np.log(p[rows, y] + 1e-12).mean())
        p[rows, y] -= 1.0
        p /= len(y)
        self.vw = momentum * self.vw - lr * (flat.T @ p)
        self.vb = momentum * self.vb - lr * p.sum(axis=0)
        self.w += self.vw
        self.b += self.vb
        return loss


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 epochs on fewer images")
    parser.add_argument("--root", default=None, help="where to write the image folder "
                        "(default: a temporary folder, removed afterwards)")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.0005)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    epochs = args.epochs if args.epochs is not None else (8 if args.quick else 12)
    per_class = (60, 30) if args.quick else (200, 60)

    with tempfile.TemporaryDirectory(prefix="netcl_loader-images-") as tmp:
        root = args.root or tmp
        write_folder(root, *per_class, seed=args.seed)
        train = ImageFolder(os.path.join(root, "train"),
                            crop=RandomResizedCrop(SIDE, scale=(0.35, 1.0)), flip=0.5)
        test = ImageFolder(os.path.join(root, "test"), crop=CenterCrop(SIDE), flip=0)
        print(f"{len(train)} training and {len(test)} test files in classes {train.classes}; "
              f"decoder: {decoder_info()[0]}")
        model = SoftmaxRegression(3 * SIDE * SIDE, len(train.classes), args.seed)
        t0 = time.perf_counter()
        with DataLoader(train, batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, seed=args.seed) as loader:
            for epoch in range(epochs):
                total, seen = 0.0, 0
                for images, labels in loader:       # float32 (B, 3, 32, 32), int64 (B,)
                    total += model.step(images, labels, args.lr) * len(labels)
                    seen += len(labels)
                print(f"epoch {epoch + 1:2d}/{epochs}: loss {total / seen:.4f}", flush=True)
            print(f"loader: {loader.stats.summary()}")
        correct = 0
        with DataLoader(test, batch_size=64, shuffle=False, num_workers=args.workers) as loader:
            for images, labels in loader:
                correct += int((model.logits(images).argmax(axis=1) == labels).sum())
        print(f"trained in {time.perf_counter() - t0:.1f} s")
        print(f"test accuracy: {correct / len(test):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
