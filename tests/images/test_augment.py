"""netcl_loader.augment: flip, colour jitter and cutout in NumPy; the fused C image primitive."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netcl_loader import _image
from netcl_loader import augment as A

F32 = np.float32


def batch(*rows):
    """An NCHW float32 batch from nested lists."""
    return np.array(rows, dtype=F32)


# --------------------------------------------------------------------------
# flip_horizontal
# --------------------------------------------------------------------------

def test_flip_known_answer():
    x = np.arange(12, dtype=F32).reshape(2, 1, 2, 3)
    got = A.flip_horizontal(x, [1, 0])
    want = batch([[[2, 1, 0], [5, 4, 3]]], [[[6, 7, 8], [9, 10, 11]]])
    np.testing.assert_array_equal(got, want)
    assert got is not x
    np.testing.assert_array_equal(x, np.arange(12, dtype=F32).reshape(2, 1, 2, 3))


def test_flip_mask_is_nonzero_test_and_flips_every_channel():
    x = np.arange(2 * 2 * 1 * 2, dtype=F32).reshape(2, 2, 1, 2)
    got = A.flip_horizontal(x, np.array([0.5, 0.0]))
    want = batch([[[1, 0]], [[3, 2]]], [[[4, 5]], [[6, 7]]])
    np.testing.assert_array_equal(got, want)


def test_flip_into_out_and_in_place():
    x = np.arange(12, dtype=F32).reshape(2, 1, 2, 3)
    want = A.flip_horizontal(x, [0, 1])
    out = np.full_like(x, -1)
    assert A.flip_horizontal(x, [0, 1], out=out) is out
    np.testing.assert_array_equal(out, want)
    assert A.flip_horizontal(x, [0, 1], out=x) is x
    np.testing.assert_array_equal(x, want)


# --------------------------------------------------------------------------
# apply_color_jitter
# --------------------------------------------------------------------------

def test_color_jitter_known_answer():
    x = batch([[[1, 2], [3, 4]]], [[[1, 2], [3, 4]]], [[[-1, 0], [2, 3]]])
    # Sample 0: y = 2x = [2, 4, 6, 8], m = 5, out = (y - 5) * 0.5 + 5.
    # Sample 1: contrast 0 gives the mean everywhere: y = x, m = 2.5.
    # Sample 2: brightness 1, contrast 1 changes nothing.
    got = A.apply_color_jitter(x, [2.0, 1.0, 1.0], [0.5, 0.0, 1.0])
    want = batch([[[3.5, 4.5], [5.5, 6.5]]], [[[2.5, 2.5], [2.5, 2.5]]], [[[-1, 0], [2, 3]]])
    np.testing.assert_array_equal(got, want)


def test_color_jitter_mean_is_over_channels_and_not_clamped():
    x = batch([[[0.0]], [[1.0]]])            # C=2, H=W=1: per-sample mean 0.5
    got = A.apply_color_jitter(x, [4.0], [3.0])
    # y = [0, 4], m = 2, out = (y - 2) * 3 + 2 = [-4, 8]: no clamp to [0, 1].
    np.testing.assert_array_equal(got, batch([[[-4.0]], [[8.0]]]))


def test_color_jitter_in_place_matches_new():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 5, 6)).astype(F32)
    b, c = rng.uniform(0.5, 1.5, 4), rng.uniform(0.5, 1.5, 4)
    want = A.apply_color_jitter(x, b, c)
    A.apply_color_jitter(x, b, c, out=x)
    np.testing.assert_array_equal(x, want)


# --------------------------------------------------------------------------
# cutout
# --------------------------------------------------------------------------

def cut_mask(h, w, rows, cols):
    m = np.zeros((h, w), dtype=bool)
    m[rows, cols] = True
    return m


@pytest.mark.parametrize("center, size, rows, cols", [
    ((2, 2), 3, slice(1, 4), slice(1, 4)),     # odd size, inside: top-left (1, 1)
    ((2, 2), 2, slice(1, 3), slice(1, 3)),     # even size: side exactly 2, top-left (1, 1)
    ((3, 1), 4, slice(1, 5), slice(0, 3)),     # even size: top-left (1, -1), clipped left
    ((0, 0), 3, slice(0, 2), slice(0, 2)),     # partly outside: top-left (-1, -1)
    ((4, 4), 3, slice(3, 5), slice(3, 5)),     # partly outside bottom-right
    ((-1, 2), 4, slice(0, 1), slice(0, 4)),    # centre outside, one row inside
    ((10, 10), 3, slice(0, 0), slice(0, 0)),   # fully outside
    ((-2, 2), 3, slice(0, 0), slice(0, 0)),    # fully outside above: rows -3..-1
    ((2, 2), 1, slice(2, 3), slice(2, 3)),     # a single pixel
    ((2, 2), 99, slice(0, 5), slice(0, 5)),    # larger than the image
])
def test_cutout_known_answer(center, size, rows, cols):
    x = np.ones((1, 2, 5, 5), dtype=F32)
    got = A.cutout(x, np.array([center]), size, fill=-1.0)
    mask = cut_mask(5, 5, rows, cols)
    want = np.where(mask, F32(-1), F32(1))
    for ch in range(2):
        np.testing.assert_array_equal(got[0, ch], want)


def test_cutout_even_size_clears_exactly_size_squared_pixels():
    # netcl 0.4.4 cleared 2*(size//2)+1 pixels a side; the spec says `size`.
    x = np.ones((1, 1, 20, 20), dtype=F32)
    for size in (2, 4, 6, 7):
        assert (A.cutout(x, [[10, 10]], size) == 0).sum() == size * size


def test_cutout_per_sample_and_default_fill():
    x = np.ones((2, 1, 3, 3), dtype=F32)
    got = A.cutout(x, [[0, 0], [2, 2]], 1)
    want = np.ones_like(x)
    want[0, 0, 0, 0] = 0
    want[1, 0, 2, 2] = 0
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, np.ones_like(x))


def test_cutout_in_place():
    x = np.ones((1, 1, 3, 3), dtype=F32)
    assert A.cutout(x, [[1, 1]], 1, out=x, fill=5.0) is x
    assert x[0, 0, 1, 1] == 5 and x.sum() == 8 + 5


# --------------------------------------------------------------------------
# flip_jitter_cutout and parameter draws
# --------------------------------------------------------------------------

def test_fused_is_the_three_in_order():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 8, 9)).astype(F32)
    p = A.draw_params(rng, 5, 8, 9)
    want = A.cutout(A.apply_color_jitter(A.flip_horizontal(x, p.mask), p.brightness,
                                         p.contrast), p.centers, 3, fill=0.25)
    got = A.flip_jitter_cutout(x, *p, 3, fill=0.25)
    np.testing.assert_array_equal(got, want)
    A.flip_jitter_cutout(x, *p, 3, out=x, fill=0.25)
    np.testing.assert_array_equal(x, want)


def test_draw_params_reproducible_and_in_range():
    a = A.draw_params(np.random.default_rng(7), 500, 10, 20, flip_prob=0.3,
                      brightness=(0.5, 0.6), contrast=(2.0, 3.0))
    b = A.draw_params(np.random.default_rng(7), 500, 10, 20, flip_prob=0.3,
                      brightness=(0.5, 0.6), contrast=(2.0, 3.0))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert a.mask.dtype == np.uint8 and set(np.unique(a.mask)) == {0, 1}
    assert 0.2 < a.mask.mean() < 0.4
    assert a.brightness.dtype == F32 and np.all((a.brightness >= 0.5) & (a.brightness <= 0.6))
    assert np.all((a.contrast >= 2.0) & (a.contrast <= 3.0))
    assert a.centers.shape == (500, 2) and a.centers.dtype == np.int64
    assert a.centers[:, 0].min() >= 0 and a.centers[:, 0].max() == 9
    assert a.centers[:, 1].min() >= 0 and a.centers[:, 1].max() == 19


def test_draw_crops_inside_the_image():
    top, left, flip = A.draw_crops(np.random.default_rng(1), 300, 10, 12, 7, 12)
    assert top.min() == 0 and top.max() == 3
    assert np.all(left == 0)
    assert set(np.unique(flip)) == {0, 1}


@pytest.mark.parametrize("call, exc, match", [
    (lambda: A.draw_params(np.random.RandomState(0), 2, 3, 3), TypeError, "rng"),
    (lambda: A.draw_params(np.random.default_rng(), -1, 3, 3), ValueError, "n must be >= 0"),
    (lambda: A.draw_params(np.random.default_rng(), 2, 0, 3), ValueError,
     "height must be positive"),
    (lambda: A.draw_params(np.random.default_rng(), 2, 3, 3, flip_prob=2), ValueError,
     "flip_prob"),
    (lambda: A.draw_params(np.random.default_rng(), 2, 3, 3, brightness=(2, 1)), ValueError,
     "brightness"),
    (lambda: A.draw_params(np.random.default_rng(), 2, 3, 3, contrast=1.0), ValueError,
     "contrast"),
    (lambda: A.draw_crops(np.random.default_rng(), 2, 3, 3, 4, 3), ValueError, "must fit"),
])
def test_draw_validation(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# --------------------------------------------------------------------------
# Empty batches and validation of the three operations
# --------------------------------------------------------------------------

def test_empty_batch():
    x = np.zeros((0, 3, 4, 5), dtype=F32)
    p = A.draw_params(np.random.default_rng(), 0, 4, 5)
    assert A.flip_horizontal(x, []).shape == x.shape
    assert A.apply_color_jitter(x, [], []).shape == x.shape
    assert A.cutout(x, np.zeros((0, 2), np.int64), 2).shape == x.shape
    assert A.cutout(x, [], 2).shape == x.shape
    assert A.flip_jitter_cutout(x, *p, 2).shape == x.shape


X = np.zeros((2, 3, 4, 4), dtype=F32)
OK_MASK = [0, 1]
OK_FACTORS = [1.0, 1.0]
OK_CENTERS = [[1, 1], [2, 2]]


@pytest.mark.parametrize("call, exc, match", [
    # x
    (lambda: A.flip_horizontal(X.tolist(), OK_MASK), TypeError, "x must be a NumPy ndarray"),
    (lambda: A.flip_horizontal(X.astype(np.float64), OK_MASK), ValueError,
     "x must have dtype float32, got float64"),
    (lambda: A.apply_color_jitter(X[0], OK_FACTORS, OK_FACTORS), ValueError,
     r"x must be a 4-d NCHW batch, got 3 dimensions with shape \(3, 4, 4\)"),
    (lambda: A.cutout(X[None], OK_CENTERS, 2), ValueError, "x must be a 4-d NCHW batch, got 5"),
    # per-sample parameters
    (lambda: A.flip_horizontal(X, [1, 0, 1]), ValueError,
     r"mask must have shape \(2,\), one value per sample, got shape \(3,\)"),
    (lambda: A.flip_horizontal(X, [[1, 0]]), ValueError, r"mask must have shape \(2,\)"),
    (lambda: A.flip_horizontal(X, ["a", "b"]), ValueError, "mask must be numeric"),
    (lambda: A.apply_color_jitter(X, [1.0], OK_FACTORS), ValueError,
     r"brightness must have shape \(2,\), one value per sample, got shape \(1,\)"),
    (lambda: A.apply_color_jitter(X, OK_FACTORS, [1.0, 2.0, 3.0]), ValueError,
     r"contrast must have shape \(2,\)"),
    (lambda: A.apply_color_jitter(X, ["x", "y"], OK_FACTORS), ValueError,
     "brightness must be real numbers"),
    (lambda: A.cutout(X, [[1, 1]], 2), ValueError,
     r"centers must have shape \(2, 2\), one \(row, col\) per sample, got shape \(1, 2\)"),
    (lambda: A.cutout(X, [1, 2], 2), ValueError, r"centers must have shape \(2, 2\)"),
    (lambda: A.cutout(X, [[1, 1, 1], [2, 2, 2]], 2), ValueError, r"got shape \(2, 3\)"),
    (lambda: A.cutout(X, [[1.0, 1.0], [2.0, 2.0]], 2), ValueError,
     "centers must have an integer dtype, got float64"),
    # size and fill
    (lambda: A.cutout(X, OK_CENTERS, 0), ValueError, "size must be positive, got 0"),
    (lambda: A.cutout(X, OK_CENTERS, -3), ValueError, "size must be positive, got -3"),
    (lambda: A.cutout(X, OK_CENTERS, 2.5), TypeError, "size must be an int, got 2.5"),
    (lambda: A.cutout(X, OK_CENTERS, True), TypeError, "size must be an int"),
    (lambda: A.cutout(X, OK_CENTERS, 2, fill="0"), TypeError, "fill must be a real number"),
    # out
    (lambda: A.flip_horizontal(X, OK_MASK, out=np.zeros((2, 3, 4, 5), F32)), ValueError,
     r"out must be float32 with shape \(2, 3, 4, 4\) like x, "
     r"got float32 with shape \(2, 3, 4, 5\)"),
    (lambda: A.apply_color_jitter(X, OK_FACTORS, OK_FACTORS, out=np.zeros(X.shape)), ValueError,
     "out must be float32 .* got float64"),
    (lambda: A.cutout(X, OK_CENTERS, 2, out=np.zeros(X.shape, F32).tolist()), TypeError,
     "out must be a NumPy ndarray or None"),
    (lambda: A.flip_horizontal(X, OK_MASK, out=np.broadcast_to(F32(0), X.shape)), ValueError,
     "out must be writable"),
    # the fused call checks everything before writing
    (lambda: A.flip_jitter_cutout(X, OK_MASK, OK_FACTORS, OK_FACTORS, OK_CENTERS, 0), ValueError,
     "size must be positive"),
    (lambda: A.flip_jitter_cutout(X, OK_MASK, [1.0], OK_FACTORS, OK_CENTERS, 2), ValueError,
     "brightness"),
])
def test_validation(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_fused_validation_writes_nothing():
    x = np.ones((2, 1, 3, 3), dtype=F32)
    with pytest.raises(ValueError, match="centers"):
        A.flip_jitter_cutout(x, [1, 1], [2.0, 2.0], [1.0, 1.0], [[0, 0]], 2, out=x)
    np.testing.assert_array_equal(x, np.ones_like(x))


# --------------------------------------------------------------------------
# crop_flip_normalize: the fused C primitive
# --------------------------------------------------------------------------

def reference(images, top, left, height, width, flip, mean, std):
    """The NumPy pipeline the primitive replaces: crop, flip, cast, normalise, transpose."""
    mean = np.asarray(mean, dtype=F32)
    std = np.asarray(std, dtype=F32)
    out = []
    for img, t, l, f in zip(images, top, left, flip):
        win = img[t:t + height, l:l + width, :]
        if f:
            win = win[:, ::-1, :]
        out.append(((win.astype(F32) - mean) / std).transpose(2, 0, 1))
    return np.stack(out) if out else np.zeros((0, images.shape[-1], height, width), F32)


def small_image():
    """(H=2, W=3, C=2): channel 0 is 10*h + w, channel 1 is 100 + 10*h + w."""
    img = np.zeros((2, 3, 2), dtype=np.uint8)
    for h in range(2):
        for w in range(3):
            img[h, w] = (10 * h + w, 100 + 10 * h + w)
    return img


def test_crop_flip_normalize_known_answer():
    img = small_image()
    got = A.crop_flip_normalize(img, 0, 1, 2, 2, flip=True, mean=[1, 100], std=[1, 2])
    # Window columns 1..2, mirrored: ch0 [[2, 1], [12, 11]] - 1; ch1 ([[102, 101],
    # [112, 111]] - 100) / 2.
    want = np.array([[[1, 0], [11, 10]], [[1, 0.5], [6, 5.5]]], dtype=F32)
    assert got.dtype == F32 and got.shape == (2, 2, 2)
    np.testing.assert_array_equal(got, want)


def test_crop_flip_normalize_known_answer_batch_no_flip_defaults():
    imgs = np.stack([small_image(), small_image() + 1])
    got = A.crop_flip_normalize(imgs, [1, 0], [0, 2], 1, 1)
    # Defaults mean 0, std 1: a plain conversion. Image 0 pixel (1, 0),
    # image 1 pixel (0, 2) plus one.
    want = np.array([[[[10]], [[110]]], [[[3]], [[103]]]], dtype=F32)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(0, 4), h=st.integers(1, 17), w=st.integers(1, 17),
       c=st.integers(1, 6), layout=st.sampled_from(["contiguous", "bgr_view", "strided"]))
def test_crop_flip_normalize_equals_numpy_reference(data, n, h, w, c, layout):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    ch = data.draw(st.integers(1, h))
    cw = data.draw(st.integers(1, w))
    if layout == "strided":  # every other row and column of a bigger array
        images = rng.integers(0, 256, (n, 2 * h, 2 * w, c), dtype=np.uint8)[:, ::2, ::2]
    else:
        images = rng.integers(0, 256, (n, h, w, c), dtype=np.uint8)
        if layout == "bgr_view":
            images = images[..., ::-1]   # negative channel stride
    top, left, flip = A.draw_crops(rng, n, h, w, ch, cw)
    mean = rng.uniform(0, 255, c).astype(F32)
    std = rng.uniform(1, 80, c).astype(F32)
    got = A.crop_flip_normalize(images, top, left, ch, cw, flip, mean, std)
    want = reference(images, top, left, ch, cw, flip, mean, std)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # The lookup table reproduces NumPy's float32 arithmetic exactly.
    np.testing.assert_array_equal(got, want)
    # The single-image entry point gives the same images.
    for i in range(n):
        one = A.crop_flip_normalize(images[i], int(top[i]), int(left[i]), ch, cw, bool(flip[i]),
                                    mean, std)
        np.testing.assert_array_equal(one, want[i])


def test_crop_flip_normalize_single_image_and_scalars():
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)
    got = A.crop_flip_normalize(img, np.int64(2), 3, 5, 6, flip=np.bool_(True), mean=100.0,
                                std=50.0)
    want = reference(img[None], [2], [3], 5, 6, [True], [100.0] * 3, [50.0] * 3)[0]
    np.testing.assert_array_equal(got, want)


def test_crop_flip_normalize_writes_into_a_slot():
    """out may be a view into a larger shared buffer (a ring slot)."""
    rng = np.random.default_rng(6)
    imgs = rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    slot = bytearray(4096 + 3 * 3 * 4 * 5 * 4)
    out = np.frombuffer(slot, dtype=F32, count=3 * 3 * 4 * 5, offset=4096).reshape(3, 3, 4, 5)
    got = A.crop_flip_normalize(imgs, [0, 1, 4], [3, 0, 2], 4, 5, [1, 0, 1], out=out)
    assert got is out
    np.testing.assert_array_equal(out, reference(imgs, [0, 1, 4], [3, 0, 2], 4, 5, [1, 0, 1],
                                                 [0] * 3, [1] * 3))
    assert not any(slot[:4096])


def test_crop_flip_normalize_full_window_and_edges():
    rng = np.random.default_rng(8)
    imgs = rng.integers(0, 256, (2, 6, 7, 1), dtype=np.uint8)
    got = A.crop_flip_normalize(imgs, 0, 0, 6, 7, [1, 0])
    np.testing.assert_array_equal(got, reference(imgs, [0, 0], [0, 0], 6, 7, [1, 0], [0], [1]))
    got = A.crop_flip_normalize(imgs, [5, 0], [6, 0], 1, 1)
    np.testing.assert_array_equal(got[:, 0, 0, 0], [imgs[0, 5, 6, 0], imgs[1, 0, 0, 0]])


def test_crop_flip_normalize_empty_batch():
    imgs = np.zeros((0, 8, 8, 3), dtype=np.uint8)
    assert A.crop_flip_normalize(imgs, 0, 0, 4, 4).shape == (0, 3, 4, 4)
    out = np.zeros((0, 3, 4, 4), F32)
    assert A.crop_flip_normalize(imgs, [], [], 4, 4, [], out=out) is out


IMG = np.zeros((8, 10, 3), dtype=np.uint8)
IMGS = np.zeros((2, 8, 10, 3), dtype=np.uint8)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: A.crop_flip_normalize(IMG.tolist(), 0, 0, 2, 2), TypeError,
     "images must be a NumPy ndarray"),
    (lambda: A.crop_flip_normalize(IMG.astype(F32), 0, 0, 2, 2), ValueError,
     "images must have dtype uint8, got float32"),
    (lambda: A.crop_flip_normalize(IMG[0], 0, 0, 2, 2), ValueError,
     r"images must be one \(H, W, C\) image or an \(N, H, W, C\) batch, got 2 dimensions"),
    (lambda: A.crop_flip_normalize(IMGS[None], 0, 0, 2, 2), ValueError, "got 5 dimensions"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 0, 2), ValueError, "height must be positive, got 0"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, -1), ValueError, "width must be positive, got -1"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2.0, 2), TypeError, "height must be an int"),
    (lambda: A.crop_flip_normalize(IMG, -1, 0, 2, 2), ValueError,
     "crop window outside the image: top=-1 with height=2 needs 0 <= top <= 6"),
    (lambda: A.crop_flip_normalize(IMG, 7, 0, 2, 2), ValueError,
     "top=7 with height=2 needs 0 <= top <= 6 for an image of height 8"),
    (lambda: A.crop_flip_normalize(IMG, 0, 9, 2, 2), ValueError,
     "left=9 with width=2 needs 0 <= left <= 8 for an image of width 10"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 9, 2), ValueError, "top=0 with height=9"),
    (lambda: A.crop_flip_normalize(IMGS, [0, 7], 0, 2, 2), ValueError,
     "top=7 with height=2 for image 1 needs"),
    (lambda: A.crop_flip_normalize(IMGS, [0, 0, 0], 0, 2, 2), ValueError,
     r"top must be an int or have shape \(2,\), one per image, got shape \(3,\)"),
    (lambda: A.crop_flip_normalize(IMGS, 0, [0.0, 1.0], 2, 2), ValueError,
     "left must hold integers, got dtype float64"),
    (lambda: A.crop_flip_normalize(IMG, 0.5, 0, 2, 2), ValueError, "top must be an int, got 0.5"),
    (lambda: A.crop_flip_normalize(IMG, [0], 0, 2, 2), ValueError,
     r"top must be an int for one image, got shape \(1,\)"),
    (lambda: A.crop_flip_normalize(IMGS, 0, 0, 2, 2, flip=[1, 0, 1]), ValueError,
     r"flip must be a bool or have shape \(2,\), one per image, got shape \(3,\)"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, flip=[True]), ValueError,
     "flip must be a bool for one image"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, mean=[1, 2]), ValueError,
     r"mean must be a number or have 3 entries, one per channel, got shape \(2,\)"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, std=[1, 2, 3, 4]), ValueError,
     r"std must be a number or have 3 entries"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, mean=["a", "b", "c"]), ValueError,
     "mean must be real numbers"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, out=np.zeros((2, 2, 3), F32)), ValueError,
     r"out must be float32 with shape \(3, 2, 2\), got float32 with shape \(2, 2, 3\)"),
    (lambda: A.crop_flip_normalize(IMGS, 0, 0, 2, 2, out=np.zeros((3, 3, 2, 2), F32)),
     ValueError, r"with shape \(2, 3, 2, 2\), got float32 with shape \(3, 3, 2, 2\)"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, out=np.zeros((3, 2, 2))), ValueError,
     "out must be float32 .* got float64"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, out=np.zeros((3, 2, 4), F32)[..., ::2]),
     ValueError, "out must be a writable C-contiguous array, got a non-contiguous one"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, out=np.broadcast_to(F32(0), (3, 2, 2))),
     ValueError, "non-contiguous|read-only"),
    (lambda: A.crop_flip_normalize(IMG, 0, 0, 2, 2, out=[[0.0]]), TypeError,
     "out must be a NumPy ndarray"),
])
def test_crop_flip_normalize_validation(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("images", [IMG, IMGS])
def test_crop_flip_normalize_zero_std(images):
    with pytest.raises(ValueError, match=r"std must be non-zero in every channel, got "
                                         r"\[1.0, 0.0, 1.0\]"):
        A.crop_flip_normalize(images, 0, 0, 2, 2, std=[1, 0, 1])


def test_crop_flip_normalize_read_only_out():
    out = np.zeros((3, 2, 2), F32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="got a read-only one"):
        A.crop_flip_normalize(IMG, 0, 0, 2, 2, out=out)


def test_compiled_wrapper_refuses_out_of_bounds_windows():
    """The private entry point checks bounds itself: C never reads past an image."""
    top = np.array([7], np.int64)
    zero = np.zeros(1, np.int64)
    args = (np.zeros(1, np.uint8), np.zeros(3, F32), np.ones(3, F32))
    with pytest.raises(ValueError, match="outside"):
        _image.crop_flip_normalize_u8(IMGS[:1], top, zero, *args, np.zeros((1, 3, 2, 2), F32))
    with pytest.raises(ValueError, match="entries"):
        _image.crop_flip_normalize_u8(IMGS[:1], zero, zero, args[0], args[1][:2], args[2],
                                      np.zeros((1, 3, 2, 2), F32))
    with pytest.raises(ValueError, match="out has shape"):
        _image.crop_flip_normalize_u8(IMGS[:1], zero, zero, *args, np.zeros((1, 2, 2, 2), F32))
    mean, std = args[1], args[2]
    for top_, left_ in ((7, 0), (0, 9), (-1, 0), (0, -1)):
        with pytest.raises(ValueError, match="outside"):
            _image.crop_flip_normalize_one(IMG, top_, left_, False, mean, std,
                                           np.zeros((3, 2, 2), F32))
    with pytest.raises(ValueError, match="out has shape"):
        _image.crop_flip_normalize_one(IMG, 0, 0, False, mean, std, np.zeros((2, 2, 2), F32))


# --------------------------------------------------------------------------
# Windows whose bounds overflow 64-bit arithmetic (issue 10): each must be a
# ValueError naming the argument and its value, never a read outside the image.
# The cases run in a child process, so a segfault is a test failure with the
# case that caused it, not the end of the pytest run.
# --------------------------------------------------------------------------

_HUGE_STARTS = (2**63 - 3, 2**62, -2**63)

# (label, expression, text the ValueError must contain); `A` is augment, `_image`
# the compiled module, images are 8x8 with 3 channels, the window 4x4.
_OVERFLOW_CASES = [
    (f"{entry} {name}={v}", expr.format(v=v), f"{name}={v}")
    for v in _HUGE_STARTS
    for name in ("top", "left")
    for entry, expr in (
        ("batch", "A.crop_flip_normalize(np.zeros((1, 8, 8, 3), np.uint8), "
                  + ("np.array([{v}]), 0" if name == "top" else "0, np.array([{v}])") + ", 4, 4)"),
        ("batch-scalar", "A.crop_flip_normalize(np.zeros((2, 8, 8, 3), np.uint8), "
                         + ("{v}, 0" if name == "top" else "0, {v}") + ", 4, 4)"),
        ("one", "A.crop_flip_normalize(np.zeros((8, 8, 3), np.uint8), "
                + ("{v}, 0" if name == "top" else "0, {v}") + ", 4, 4)"),
        ("compiled-batch", "_image.crop_flip_normalize_u8(np.zeros((1, 8, 8, 3), np.uint8), "
                           + ("np.array([{v}]), np.zeros(1, np.int64)" if name == "top"
                              else "np.zeros(1, np.int64), np.array([{v}])")
                           + ", np.zeros(1, np.uint8), np.zeros(3, np.float32), "
                             "np.ones(3, np.float32), np.zeros((1, 3, 4, 4), np.float32))"),
        ("compiled-one", "_image.crop_flip_normalize_one(np.zeros((8, 8, 3), np.uint8), "
                         + ("{v}, 0" if name == "top" else "0, {v}")
                         + ", False, np.zeros(3, np.float32), np.ones(3, np.float32), "
                           "np.zeros((3, 4, 4), np.float32))"),
    )
] + [
    # Starts past int64 (uint64 arrays would wrap to negative values on a cast).
    ("batch uint64 top=2**63", "A.crop_flip_normalize(np.zeros((1, 8, 8, 3), np.uint8), "
     "np.array([2**63], np.uint64), 0, 4, 4)", f"top={2**63}"),
    ("batch-scalar top=2**64", "A.crop_flip_normalize(np.zeros((1, 8, 8, 3), np.uint8), "
     "2**64, 0, 4, 4)", f"top={2**64}"),
    ("one left=2**70", "A.crop_flip_normalize(np.zeros((8, 8, 3), np.uint8), 0, 2**70, 4, 4)",
     f"left={2**70}"),
    # A window larger than the image, at a start that is itself fine.
    ("batch window 9x4", "A.crop_flip_normalize(np.zeros((2, 8, 8, 3), np.uint8), 0, 0, 9, 4)",
     "top=0 with height=9 for image 0 needs height <= 8"),
    ("batch window 4x9", "A.crop_flip_normalize(np.zeros((2, 8, 8, 3), np.uint8), "
     "[0, 0], [0, 0], 4, 9)", "left=0 with width=9 for image 0 needs width <= 8"),
    ("one window 9x9", "A.crop_flip_normalize(np.zeros((8, 8, 3), np.uint8), 0, 0, 9, 9)",
     "top=0 with height=9 needs height <= 8"),
    ("compiled-batch window 9x4", "_image.crop_flip_normalize_u8("
     "np.zeros((1, 8, 8, 3), np.uint8), np.zeros(1, np.int64), np.zeros(1, np.int64), "
     "np.zeros(1, np.uint8), np.zeros(3, np.float32), np.ones(3, np.float32), "
     "np.zeros((1, 3, 9, 4), np.float32))", "top=0, left=0 of image 0 is outside its 8x8"),
    ("compiled-one window 4x9", "_image.crop_flip_normalize_one(np.zeros((8, 8, 3), np.uint8), "
     "0, 0, False, np.zeros(3, np.float32), np.ones(3, np.float32), "
     "np.zeros((3, 4, 9), np.float32))", "needs 4x9 <= 8x8"),
]

_OVERFLOW_CHILD = """
import json, sys
import numpy as np
from netcl_loader import _image
from netcl_loader import augment as A
for label, expr in json.loads(sys.argv[1]):
    print("START", label, flush=True)  # names the culprit should the next line crash
    try:
        eval(expr)
    except Exception as e:
        print("RESULT", json.dumps([label, type(e).__name__, str(e)]), flush=True)
    else:
        print("RESULT", json.dumps([label, None, ""]), flush=True)
"""


@pytest.mark.slow
def test_crop_windows_that_overflow_int64_are_value_errors_in_a_child():
    import json
    import subprocess
    import sys
    cases = [(label, expr) for label, expr, _ in _OVERFLOW_CASES]
    proc = subprocess.run([sys.executable, "-c", _OVERFLOW_CHILD, json.dumps(cases)],
                          capture_output=True, text=True, timeout=120)
    started = [ln[6:] for ln in proc.stdout.splitlines() if ln.startswith("START ")]
    assert proc.returncode == 0, (f"child died with code {proc.returncode} during case "
                                  f"{started[-1] if started else None!r}: {proc.stderr[-2000:]}")
    results = {r[0]: r[1:] for r in (json.loads(ln[7:]) for ln in proc.stdout.splitlines()
                                     if ln.startswith("RESULT "))}
    assert len(results) == len(_OVERFLOW_CASES)
    for label, _, text in _OVERFLOW_CASES:
        exc, msg = results[label]
        assert exc == "ValueError", f"{label}: expected ValueError, got {exc}: {msg}"
        assert text in msg, f"{label}: {text!r} not in {msg!r}"
        if "window" not in label:
            # Names what would be right, not only what was wrong.
            assert "needs" in msg and "<=" in msg, f"{label}: {msg!r}"
