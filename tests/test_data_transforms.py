"""Transform pipelines built from TRANSFORMS lists."""
import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image, ImageFilter

from ssl_engine.data import build_transforms
from ssl_engine.utils.registry import UnknownNameError


@pytest.fixture
def image():
    pixels = np.random.default_rng(0).integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def run_seeded(transform, image, seed=3):
    torch.manual_seed(seed)
    return transform(image)


def test_torchvision_transforms_by_class_name_match_torchvision(image):
    specs = [
        {"name": "RandomResizedCrop", "size": 8, "scale": [0.2, 1.0], "interpolation": "bicubic"},
        {"name": "RandomHorizontalFlip"},
        {"name": "ToTensor"},
        {"name": "Normalize", "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2]},
    ]
    reference = T.Compose(
        [
            T.RandomResizedCrop(8, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize([0.5, 0.4, 0.3], [0.2, 0.2, 0.2]),
        ]
    )
    got = run_seeded(build_transforms(specs), image)
    assert got.shape == (3, 8, 8)
    assert torch.equal(got, run_seeded(reference, image))


def test_unknown_transform_suggests_closest():
    message = r"TRANSFORMS\[1\].*'RandomResizedCrp': did you mean 'RandomResizedCrop'"
    with pytest.raises(UnknownNameError, match=message):
        build_transforms([{"name": "ToTensor"}, {"name": "RandomResizedCrp", "size": 4}])


def test_bad_parameters_name_the_entry():
    message = r"TRANSFORMS\[0\] \(ImgReplicatePil\).*unexpected keyword"
    with pytest.raises(ValueError, match=message):
        build_transforms([{"name": "ImgReplicatePil", "num_copies": 2}])
    with pytest.raises(ValueError, match="every transform needs a 'name'"):
        build_transforms([{"size": 4}])


def test_replicate_then_each_view_is_augmented_independently(image):
    chain = build_transforms(
        [
            {"name": "ImgReplicatePil", "num_times": 3},
            {"name": "RandomResizedCrop", "size": 6},
            {"name": "ToTensor"},
        ]
    )
    views = run_seeded(chain, image)
    assert len(views) == 3 and all(v.shape == (3, 6, 6) for v in views)
    assert not torch.equal(views[0], views[1]) and not torch.equal(views[1], views[2])
    crop, to_tensor = T.RandomResizedCrop(6), T.ToTensor()
    torch.manual_seed(3)
    expected = [to_tensor(crop(image)) for _ in range(3)]
    assert all(torch.equal(v, e) for v, e in zip(views, expected))


def test_views_cannot_be_made_twice():
    with pytest.raises(ValueError, match=r"TRANSFORMS\[1\]: ImgReplicatePil after ImgReplicatePil"):
        build_transforms([{"name": "ImgReplicatePil"}, {"name": "ImgReplicatePil"}])


def test_color_distortion_is_simclr_jitter_and_grayscale(image):
    s = 0.5
    reference = T.Compose(
        [
            T.RandomApply([T.ColorJitter(0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)], p=0.8),
            T.RandomGrayscale(p=0.2),
        ]
    )
    chain = build_transforms([{"name": "ImgPilColorDistortion", "strength": s}])
    # VISSL's iBOT files add jitter keys VISSL never read (its transform took strength alone)
    ibot = build_transforms([{"name": "ImgPilColorDistortion", "strength": s, "brightness": 0.4,
                              "contrast": 0.4, "saturation": 0.2, "hue": 0.1}])
    for seed in range(6):
        got, expected = run_seeded(chain, image, seed), run_seeded(reference, image, seed)
        assert np.array_equal(np.asarray(got), np.asarray(expected))
        assert np.array_equal(np.asarray(run_seeded(ibot, image, seed)), np.asarray(expected))
    with pytest.raises(ValueError, match="brightnes"):
        build_transforms([{"name": "ImgPilColorDistortion", "brightnes": 0.4}])


def test_gaussian_blur_probability_and_radius(image):
    never = build_transforms([{"name": "ImgPilGaussianBlur", "p": 0.0}])
    assert np.array_equal(np.asarray(run_seeded(never, image)), np.asarray(image))
    always = build_transforms(
        [{"name": "ImgPilGaussianBlur", "p": 1.0, "radius_min": 1.5, "radius_max": 1.5}]
    )
    expected = image.filter(ImageFilter.GaussianBlur(radius=1.5))
    assert np.array_equal(np.asarray(run_seeded(always, image)), np.asarray(expected))


def test_solarize_inverts_bright_pixels(image):
    chain = build_transforms([{"name": "ImgPilRandomSolarize", "p": 1.0, "threshold": 128}])
    pixels = np.asarray(image)
    expected = np.where(pixels >= 128, 255 - pixels, pixels)
    assert np.array_equal(np.asarray(run_seeded(chain, image)), expected)
    never = build_transforms([{"name": "ImgPilRandomSolarize", "prob": 0.0}])
    assert np.array_equal(np.asarray(run_seeded(never, image)), pixels)


def multicrop_spec(total_num_crops):
    return {
        "name": "ImgPilToMultiCrop",
        "total_num_crops": total_num_crops,
        "num_crops": [2, 3],
        "size_crops": [8, 4],
        "crop_scales": [[0.5, 1.0], [0.1, 0.5]],
    }


def test_multicrop_sizes_and_counts(image):
    chain = build_transforms([multicrop_spec(5), {"name": "ToTensor"}])
    views = run_seeded(chain, image)
    assert [tuple(v.shape[1:]) for v in views] == [(8, 8)] * 2 + [(4, 4)] * 3
    with pytest.raises(ValueError, match="total_num_crops=4 but num_crops sum to 5"):
        build_transforms([multicrop_spec(4)])


@pytest.mark.parametrize("kernel, size, mode", [(3, 16, "RGB"), (5, 16, "RGB"), (3, 9, "L")])
def test_gaussian_blur_on_pil_images_equals_torchvision(kernel, size, mode):
    """The engine's GaussianBlur gives torchvision's 8-bit image (up to rounding: 1 level),
    reflected borders included, and draws sigma from torch's generator as torchvision does."""
    from ssl_engine.data.transforms import known_transforms

    fast = known_transforms()["GaussianBlur"](kernel, (0.1, 2.0))
    reference = T.GaussianBlur(kernel, (0.1, 2.0))
    rng = np.random.default_rng(0)
    for seed in range(10):
        image = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).convert(mode)
        torch.manual_seed(seed)
        expected, after_expected = np.asarray(reference(image)).astype(int), torch.rand(())
        torch.manual_seed(seed)
        got, after_got = np.asarray(fast(image)).astype(int), torch.rand(())
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() <= 1
        assert after_got == after_expected  # the same random draws


# ------------------------------------------------------------- VISSL's transforms by name
def test_random_solarize_draws_its_threshold_and_prob_is_another_name_of_p(image):
    pixels = np.asarray(image).astype(int)
    chain = build_transforms([{"name": "ImgPilRandomSolarize", "p": 1.0}])
    thresholds = set()
    for seed in range(8):
        out = np.asarray(run_seeded(chain, image, seed)).astype(int)
        inverted = out != pixels
        assert np.array_equal(out[inverted], 255 - pixels[inverted])
        # every inverted pixel is brighter than every kept one that differs from its inverse
        kept = ~inverted & (pixels != 255 - pixels)
        if inverted.any() and kept.any():
            assert pixels[inverted].min() > pixels[kept].max()
        thresholds.add(int(inverted.sum()))
    assert len(thresholds) > 3  # the threshold changes from draw to draw
    old_name = build_transforms([{"name": "ImgPilRandomSolarize", "prob": 0.0}])
    assert np.array_equal(np.asarray(run_seeded(old_name, image)), pixels)


def test_random_color_jitter_is_randomly_applied_simclr_jitter(image):
    s, p = 0.5, 0.6
    reference = T.RandomApply([T.ColorJitter(0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)], p=p)
    chain = build_transforms([{"name": "ImgPilRandomColorJitter", "strength": s, "p": p}])
    applied = 0
    for seed in range(8):
        got, expected = run_seeded(chain, image, seed), run_seeded(reference, image, seed)
        assert np.array_equal(np.asarray(got), np.asarray(expected))
        applied += not np.array_equal(np.asarray(got), np.asarray(image))
    assert 0 < applied < 8


def test_random_photometric_is_posterize_sharpness_solarize_autocontrast(image):
    from PIL import ImageEnhance, ImageOps

    chain = build_transforms([{"name": "ImgPilRandomPhotometric", "p": 1.0}])
    torch.manual_seed(5)
    torch.rand(())  # the draw that decides to apply
    bits = int(torch.randint(4, 9, ()).item())
    factor = 0.1 + 1.8 * torch.rand(()).item()
    threshold = int(torch.randint(0, 257, ()).item())
    expected = ImageOps.posterize(image, bits)
    expected = ImageOps.solarize(ImageEnhance.Sharpness(expected).enhance(factor), threshold)
    expected = ImageOps.autocontrast(expected)
    assert np.array_equal(np.asarray(run_seeded(chain, image, 5)), np.asarray(expected))
    never = build_transforms([{"name": "ImgPilRandomPhotometric", "p": 0.0}])
    assert np.array_equal(np.asarray(run_seeded(never, image)), np.asarray(image))


def test_to_tensor_and_raw_tensor(image):
    scaled = build_transforms([{"name": "ImgToTensor"}])(image)
    raw = build_transforms([{"name": "ImgPilToRawTensor"}])(image)
    assert torch.equal(scaled, T.ToTensor()(image))
    assert raw.dtype == torch.float32 and torch.equal(raw, torch.round(scaled * 255))
    assert raw.max() > 1.0


def test_rotate_sets_the_label_of_each_view(image):
    chain = build_transforms([{"name": "ImgReplicatePil", "num_times": 3},
                              {"name": "ImgRotatePil", "num_angles": 4}])
    torch.manual_seed(1)
    views, labels = chain.apply(image)
    assert len(views) == 3 and all(0 <= label < 4 for label in labels)
    for view, label in zip(views, labels):
        expected = image.rotate(90 * label)  # counter-clockwise, like torchvision
        assert np.array_equal(np.asarray(view), np.asarray(expected))
    assert chain.apply(image)[1] is not None
    assert build_transforms([{"name": "ToTensor"}]).apply(image)[1] is None


def test_multicrop_random_apply_uses_one_probability_per_view(image):
    chain = build_transforms([
        {"name": "ImgReplicatePil", "num_times": 2},
        {"name": "ImgPilMultiCropRandomApply", "prob": [0.0, 1.0],
         "transforms": [{"name": "ImgPilRandomSolarize", "p": 1.0, "threshold": 0}]},
    ])
    first, second = run_seeded(chain, image)
    assert np.array_equal(np.asarray(first), np.asarray(image))
    assert np.array_equal(np.asarray(second), 255 - np.asarray(image))
    with pytest.raises(ValueError, match="2 probabilities \\(prob\\) for 3 views"):
        chain.transforms[1]([image] * 3)


def test_resize_larger_side_and_to_rgb():
    wide = Image.new("L", (40, 10), color=7)
    resized = build_transforms([{"name": "ImgPilResizeLargerSide", "size": 20}])(wide)
    assert resized.size == (20, 5)
    rgb = build_transforms([{"name": "MNISTImgPil2RGB", "size": 44, "box": [2, 2]}])(wide)
    pixels = np.asarray(rgb)
    assert rgb.mode == "RGB" and rgb.size == (44, 44)
    assert (pixels[2:12, 2:42] == 7).all() and pixels[0].sum() == 0 and pixels[12:].sum() == 0
    assert build_transforms([{"name": "ImgPil2RGB"}])(wide).size == (40, 10)


def reference_lab(r, g, b):
    """CIE L*a*b* of one sRGB pixel, written out with the CIE constants (sRGB matrix of the
    IEC standard, D65 white as the sum of its rows, epsilon 216/24389, kappa 24389/27)."""
    def linear(v):
        v = v / 255
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
    rl, gl, bl = linear(r), linear(g), linear(b)
    x = 0.4124564 * rl + 0.3575761 * gl + 0.1804375 * bl
    y = 0.2126729 * rl + 0.7151522 * gl + 0.0721750 * bl
    z = 0.0193339 * rl + 0.1191920 * gl + 0.9503041 * bl
    eps, kappa = 216 / 24389, 24389 / 27

    def f(t):
        return t ** (1 / 3) if t > eps else (kappa * t + 16) / 116
    fx, fy, fz = f(x / 0.9504705), f(y / 1.0), f(z / 1.0888214)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def test_pil_to_lab_tensor_matches_the_cie_formulas():
    pixels = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (12, 200, 90), (250, 250, 5), (3, 4, 5),
              (128, 128, 128), (90, 30, 160)]
    image = Image.fromarray(np.array([pixels], dtype=np.uint8))  # 1 x 8 RGB
    lab = build_transforms([{"name": "ImgPil2LabTensor"}])(image)
    assert lab.dtype == torch.float32 and lab.shape == (3, 1, len(pixels))
    for column, rgb in enumerate(pixels):
        big_l, a, b = reference_lab(*rgb)
        # VISSL's encoding: L on OpenCV's 8-bit grid (steps of 100/255), centred at 0
        assert lab[0, 0, column].item() == pytest.approx(big_l - 50, abs=100 / 255 / 2 + 0.02)
        assert lab[1, 0, column].item() == pytest.approx(a, abs=0.5 + 0.02)
        assert lab[2, 0, column].item() == pytest.approx(b, abs=0.5 + 0.02)
    grid = lab[0] * 255 / 100 + 50 * 255 / 100  # back to the 8-bit L: whole numbers
    assert torch.allclose(grid, grid.round(), atol=1e-4)
    assert torch.equal(lab[1:], lab[1:].round())


def test_pil_to_lab_tensor_fixed_points():
    white_black_red = Image.fromarray(np.array([[(255, 255, 255), (0, 0, 0), (255, 0, 0)]],
                                               dtype=np.uint8))
    lab = build_transforms([{"name": "ImgPil2LabTensor"}])(white_black_red)
    # red is L 53.24, a 80.09, b 67.20: 8-bit L round(135.76) = 136 -> 136 * 100 / 255 - 50
    expected = torch.tensor([[50.0, -50.0, 136 * 100 / 255 - 50], [0, 0, 80], [0, 0, 67]])
    assert torch.allclose(lab[:, 0], expected, atol=1e-5)
    gray = build_transforms([{"name": "ImgPil2LabTensor"}])(white_black_red.convert("L"))
    assert torch.allclose(gray[1:], torch.zeros(2, 1, 3), atol=0.51)  # grey: a = b = 0
    with pytest.raises(TypeError, match="put it before any transform that makes tensors"):
        build_transforms([{"name": "ToTensor"}, {"name": "ImgPil2LabTensor"}])(white_black_red)


def coordinate_image(size=30):
    """[2, size, size]: channel 0 holds the row of each pixel, channel 1 its column."""
    rows, cols = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    return torch.stack([rows, cols]).float()


def test_patches_from_tensor_are_jittered_crops_of_their_grid_cells():
    torch.manual_seed(0)
    patches = build_transforms([{"name": "ImgPatchesFromTensor", "num_patches": 9,
                                 "patch_jitter": 4}])(coordinate_image(30))
    assert len(patches) == 9
    offsets = set()
    for index, patch in enumerate(patches):
        column, row = divmod(index, 3)  # listed column by column
        assert patch.shape == (2, 6, 6)  # cells of 10 pixels minus the jitter
        y, x = int(patch[0, 0, 0]), int(patch[1, 0, 0])
        assert 0 <= y - 10 * row < 4 and 0 <= x - 10 * column < 4
        offsets.add((y - 10 * row, x - 10 * column))
        assert torch.equal(patch[0], (y + torch.arange(6)).float()[:, None].expand(6, 6))
        assert torch.equal(patch[1], (x + torch.arange(6)).float()[None, :].expand(6, 6))
    assert len(offsets) > 1  # the offsets are drawn per cell
    with pytest.raises(ValueError, match="square number"):
        build_transforms([{"name": "ImgPatchesFromTensor", "num_patches": 8}])


def test_shuffle_img_patches_orders_by_a_drawn_permutation_and_labels_it(tmp_path):
    perms = np.array([[2, 3, 1, 4], [4, 3, 2, 1], [1, 2, 3, 4]])  # 1-based, as VISSL's files
    np.save(tmp_path / "perms.npy", perms)
    chain = build_transforms([
        {"name": "ImgPatchesFromTensor", "num_patches": 4, "patch_jitter": 1},
        {"name": "ShuffleImgPatches", "perm_file": str(tmp_path / "perms.npy")}])
    image = torch.arange(2 * 8 * 8, dtype=torch.float32).reshape(2, 8, 8)
    seen = set()
    for seed in range(12):
        torch.manual_seed(seed)
        patches = chain.transforms[0](image)
        torch.manual_seed(seed)
        puzzle, labels = chain.apply(image)
        (label,) = labels
        seen.add(label)
        assert puzzle.shape == (4, 2, 3, 3)
        for position, source in enumerate(perms[label] - 1):
            assert torch.equal(puzzle[position], patches[source])
    assert seen == {0, 1, 2}
    np.save(tmp_path / "bad.npy", np.array([[0, 0, 1, 2]]))
    with pytest.raises(ValueError, match="must be a permutation of 0..3"):
        build_transforms([{"name": "ShuffleImgPatches", "perm_file": str(tmp_path / "bad.npy")}])


def test_shuffle_img_patches_unreachable_url_says_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="download it and set perm_file to the local .npy"):
        build_transforms([{"name": "ShuffleImgPatches",
                           "perm_file": "http://127.0.0.1:9/perms.npy"}])


def test_rand_augment_with_vissls_arguments_is_timms_and_with_torchvisions_is_torchvisions():
    import random

    from timm.data.auto_augment import rand_augment_transform
    from torchvision.transforms import RandAugment as TorchvisionRandAugment

    from ssl_engine.data.transforms import known_transforms

    rand_augment = known_transforms()["RandAugment"]
    image = Image.fromarray(np.random.RandomState(0).randint(0, 256, (24, 24, 3), np.uint8))
    ours = rand_augment(magnitude=9, magnitude_std=0.5, increasing_severity=True, num_layers=3)
    timms = rand_augment_transform("rand-m9-n3-mstd0.5-inc1", None)
    outputs = []
    for transform in (ours, timms):
        random.seed(5)
        np.random.seed(5)
        outputs.append([np.asarray(transform(image)) for _ in range(6)])
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, np.asarray(image)) for a in outputs[0])
    assert isinstance(rand_augment(num_ops=2, magnitude=9).transform, TorchvisionRandAugment)
    with pytest.raises(ValueError, match="weight_choice"):
        rand_augment(magnitude=9, weight_choice=1)  # only table 0 (tests/test_rand_augment_weights)
