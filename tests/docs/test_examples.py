"""The training examples run, in their quick form, and reach 90% test accuracy on the digits."""
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
ACCURACY = re.compile(r"^test accuracy: ([\d.]+)$", re.M)
EPOCH = re.compile(r"^epoch +(\d+)/(\d+): loss ([\d.]+)$", re.M)
RUN_SECONDS = 300

# Every test runs an example in a child interpreter.
pytestmark = pytest.mark.slow

pytest.importorskip("sklearn", reason="the examples use scikit-learn's bundled digits "
                                      "(the 'test' extra installs it)")


def _run(script, *args, prelude=None):
    path = str(EXAMPLES / script)
    if prelude is None:
        cmd = [sys.executable, path, *args]
    else:
        cmd = [sys.executable, "-c",
               f"{prelude}\nimport runpy, sys\nsys.argv = [{path!r}, *{list(args)!r}]\n"
               f"runpy.run_path({path!r}, run_name='__main__')"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_SECONDS,
                          cwd=EXAMPLES.parent)


def _check_training(out):
    assert out.returncode == 0, out.stdout + out.stderr
    epochs = EPOCH.findall(out.stdout)
    assert epochs, out.stdout
    assert [int(e[0]) for e in epochs] == list(range(1, int(epochs[0][1]) + 1))
    losses = [float(e[2]) for e in epochs]
    assert losses[-1] < losses[0] / 4, losses   # it learns
    accuracy = ACCURACY.search(out.stdout)
    assert accuracy, out.stdout
    assert float(accuracy.group(1)) >= 0.90, out.stdout


def test_numpy_mlp_reaches_90_percent():
    _check_training(_run("train_digits.py", "--quick"))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_model_reaches_90_percent():
    _check_training(_run("train_digits_torch.py", "--quick"))


def test_torch_example_says_what_to_install_without_torch():
    hide_torch = "import sys; sys.modules['torch'] = None"
    out = _run("train_digits_torch.py", "--quick", prelude=hide_torch)
    assert out.returncode == 1
    assert "needs PyTorch" in out.stderr and "pip install torch" in out.stderr
    assert "train_digits.py" in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("PIL") is None, reason="Pillow is not installed "
                    "(the 'images' extra installs it)")
def test_image_folder_example_learns():
    out = _run("train_images.py", "--quick")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "decoder: " in out.stdout
    losses = [float(e[2]) for e in EPOCH.findall(out.stdout)]
    assert len(losses) == 8 and losses[-1] < losses[0] / 2, out.stdout
    accuracy = ACCURACY.search(out.stdout)
    assert accuracy and float(accuracy.group(1)) >= 0.80, out.stdout   # chance: 1/3
