"""The resnet_sk trunk (SimCLR v2's ResNet with selective kernels): the selective kernel and
the shortcut against the formulas, the plain bottleneck ResNet at SK_RATIO 0, VISSL's
parameter names and shapes, the stages for feature evaluation, loading a checkpoint in VISSL's
layout, and the refusal of bad settings before launch."""
import copy
import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision
import yaml
from torch import nn
from torchvision.models.resnet import Bottleneck as TorchvisionBottleneck

from ssl_engine.checkpoint import load_weights_init
from ssl_engine.checkpoint.formats import model_key_from_vissl
from ssl_engine.config import load_config
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.models import build_model
from ssl_engine.models.trunks import check_trunk_config
from ssl_engine.models.trunks.resnet_sk import Bottleneck, Projection, SelectiveKernel

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])
EPS = 1e-5


def model_cfg(**settings) -> AttrDict:
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = "resnet_sk"
    cfg.TRUNK.RESNETS_SK.update(settings)
    return cfg


@functools.lru_cache(maxsize=None)
def meta_trunk(depth: int, width: int, sk_ratio: float) -> nn.Module:
    """The trunk on the meta device: names and shapes, no memory (shared between tests)."""
    with torch.device("meta"):
        return build_model(model_cfg(DEPTH=depth, WIDTH_MULTIPLIER=width,
                                     SK_RATIO=sk_ratio)).trunk


@pytest.fixture(autouse=True)
def one_thread():
    """Tensors this small compute faster on one thread than on several that must meet after
    each operation (many times faster on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def randomize_norms(module: nn.Module, seed: int) -> None:
    """Batch norms with random affine parameters and running statistics (eval mode then
    computes something other than the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.BatchNorm2d):
                n = layer.num_features
                layer.weight.copy_(torch.rand(n, generator=g) + 0.5)
                layer.bias.copy_(torch.randn(n, generator=g) * 0.1)
                layer.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                layer.running_var.copy_(torch.rand(n, generator=g) + 0.5)


def bn(x, layer: nn.BatchNorm2d):
    """Batch norm in evaluation, written out."""
    shape = (1, -1, 1, 1)
    scale = (layer.weight / torch.sqrt(layer.running_var + EPS)).view(shape)
    return (x - layer.running_mean.view(shape)) * scale + layer.bias.view(shape)


# ----------------------------------------------------------------- VISSL's names and shapes
def vissl_resnet_sk_state_shapes(depth, width, sk_ratio):
    """The state-dict keys (in order) and shapes of VISSL's resnet_sk trunk, from its module
    layout: net = [stem, stage x 4]; a stem of [conv, (bn, relu)] pairs and a max-pool; stages
    holding ``blocks``, each block a ``projection`` (the first one only: ``shortcut``, a 1x1
    convolution, preceded at SK_RATIO > 0 by a zero pad and an average pool; then ``bn``) and
    a residual branch ``net`` of 1x1, 3x3 or selective kernel (``main_conv``, ``mixing_conv``),
    1x1; every convolution but the mixing's last is followed by a (bn, relu or identity) pair
    (parameters only in the bn: ``<i>.0.*``)."""
    shapes = {}

    def conv(name, c_out, c_in, k):
        shapes[f"{name}.weight"] = (c_out, c_in, k, k)

    def norm(name, c):
        for suffix in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}.0.{suffix}"] = (c,)
        shapes[f"{name}.0.num_batches_tracked"] = ()

    stem = 64 * width // 2
    if sk_ratio > 0:
        conv("net.0.0", stem, 3, 3)
        norm("net.0.1", stem)
        conv("net.0.2", stem, stem, 3)
        norm("net.0.3", stem)
        conv("net.0.4", 2 * stem, stem, 3)
        norm("net.0.5", 2 * stem)
    else:
        conv("net.0.0", 2 * stem, 3, 7)
        norm("net.0.1", 2 * stem)
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    c_in = 64 * width
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks), start=1):
        p = planes * width
        for b in range(count):
            prefix = f"net.{stage}.blocks.{b}"
            if b == 0:
                shortcut = f"{prefix}.projection.shortcut" + (".2" if sk_ratio > 0 else "")
                conv(shortcut, 4 * p, c_in, 1)
                norm(f"{prefix}.projection.bn", 4 * p)
            conv(f"{prefix}.net.0", p, c_in if b == 0 else 4 * p, 1)
            norm(f"{prefix}.net.1", p)
            if sk_ratio > 0:
                mid = max(int(p * sk_ratio), 32)
                sk = f"{prefix}.net.2"
                conv(f"{sk}.main_conv.0", 2 * p, p, 3)
                norm(f"{sk}.main_conv.1", 2 * p)
                conv(f"{sk}.mixing_conv.0", mid, p, 1)
                norm(f"{sk}.mixing_conv.1", mid)
                conv(f"{sk}.mixing_conv.2", 2 * p, mid, 1)
                conv(f"{prefix}.net.3", 4 * p, p, 1)
                norm(f"{prefix}.net.4", 4 * p)
            else:
                conv(f"{prefix}.net.2", p, p, 3)
                norm(f"{prefix}.net.3", p)
                conv(f"{prefix}.net.4", 4 * p, p, 1)
                norm(f"{prefix}.net.5", 4 * p)
        c_in = 4 * p
    return shapes


@pytest.mark.parametrize("depth, width, sk_ratio", [(152, 3, 0.0625), (50, 2, 0.0625),
                                                    (50, 1, 0.0)])
def test_state_dict_has_vissl_keys_and_shapes(depth, width, sk_ratio):
    trunk = meta_trunk(depth, width, sk_ratio)
    ours = [(k, tuple(v.shape)) for k, v in trunk.state_dict().items()]
    assert ours == list(vissl_resnet_sk_state_shapes(depth, width, sk_ratio).items())


def test_simclr_v2_sizes():
    """SimCLR v2's parameter counts (its paper, table 1): ResNet-152 3x with selective kernels
    795M (the VISSL configs' model, 6144 features), ResNet-50 2x+SK 140M, ResNet-50 1x 24M."""
    def n_params(*settings):
        trunk = meta_trunk(*settings)
        return sum(p.numel() for p in trunk.parameters()), trunk.output_dim

    defaults = DEFAULT_MODEL_CFG.TRUNK.RESNETS_SK
    assert (defaults.DEPTH, defaults.WIDTH_MULTIPLIER, defaults.SK_RATIO) == (152, 3, 0.0625)
    assert n_params(152, 3, 0.0625) == (794_704_160, 6144)
    assert n_params(50, 2, 0.0625) == (140_306_048, 4096)
    with torch.device("meta"):
        resnet50 = torchvision.models.resnet50()
    assert n_params(50, 1, 0.0) == (
        sum(p.numel() for n, p in resnet50.named_parameters() if not n.startswith("fc.")), 2048)


# ----------------------------------------------------------------- the blocks, by formula
@pytest.mark.parametrize("stride, size", [(1, 5), (2, 7)])
def test_selective_kernel_follows_the_formula(stride, size):
    """Two 3x3 branches (the two halves of one convolution's output channels), each through
    batch norm + ReLU; the mixing weights are a softmax over the two branches of a per-channel
    logit computed from the spatial mean of their sum (1x1 conv, batch norm, ReLU, 1x1 conv)."""
    torch.manual_seed(0)
    c = 6
    sk = SelectiveKernel(c, stride, sk_ratio=0.5).eval()  # max(3, 32): 32 mixing channels
    randomize_norms(sk, seed=1)
    x = torch.randn(3, c, size, size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = sk(x)
        w_main = sk.main_conv[0].weight
        bn_main = sk.main_conv[1][0]
        a = F.relu(bn(F.conv2d(x, w_main[:c], stride=stride, padding=1), _slice(bn_main, 0, c)))
        b = F.relu(bn(F.conv2d(x, w_main[c:], stride=stride, padding=1),
                      _slice(bn_main, c, 2 * c)))
        s = (a + b).mean(dim=(2, 3), keepdim=True)
        z = F.relu(bn(F.conv2d(s, sk.mixing_conv[0].weight), sk.mixing_conv[1][0]))
        logits = F.conv2d(z, sk.mixing_conv[2].weight)
        weight_a = torch.sigmoid(logits[:, :c] - logits[:, c:])  # softmax of two
        expected = weight_a * a + (1 - weight_a) * b
    assert sk.mixing_conv[0].out_channels == 32
    assert tuple(out.shape) == (3, c, (size - 1) // stride + 1, (size - 1) // stride + 1)
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out, a) and not torch.allclose(out, b)


def _slice(layer: nn.BatchNorm2d, start: int, end: int) -> nn.BatchNorm2d:
    part = nn.BatchNorm2d(end - start, eps=layer.eps).eval()
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(part, name).copy_(getattr(layer, name)[start:end])
    return part


def test_selective_kernel_projection_average_pools_before_its_convolution():
    """The shortcut with selective kernels: pad one zero row/column at the bottom/right,
    average 2x2 windows at the block's stride, 1x1 convolution, batch norm; an odd input keeps
    the 3x3 branch's output size."""
    torch.manual_seed(0)
    proj = Projection(4, 8, stride=2, sk_ratio=0.0625).eval()
    randomize_norms(proj, seed=3)
    x = torch.randn(2, 4, 7, 7, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        padded = torch.zeros(2, 4, 8, 8)
        padded[:, :, :7, :7] = x
        pooled = padded.unfold(2, 2, 2).unfold(3, 2, 2).mean(dim=(-1, -2))  # [2, 4, 4, 4]
        expected = bn(F.conv2d(pooled, proj.shortcut[2].weight), proj.bn[0])
        torch.testing.assert_close(proj(x), expected)
        block = Bottleneck(4, 2, stride=2, sk_ratio=0.0625, project=True).eval()
        randomize_norms(block, seed=5)
        torch.testing.assert_close(block(x), F.relu(block.projection(x) + block.net(x)))
    assert tuple(block(x).shape) == (2, 8, 4, 4)


def test_without_selective_kernels_a_block_is_torchvisions_bottleneck():
    torch.manual_seed(0)
    ours = Bottleneck(16, 8, stride=2, sk_ratio=0, project=True).eval()
    randomize_norms(ours, seed=6)
    reference = TorchvisionBottleneck(16, 8, stride=2, downsample=nn.Sequential(
        nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))).eval()
    reference.load_state_dict(
        {_torchvision_block_key(k): v for k, v in ours.state_dict().items()})
    x = torch.randn(2, 16, 9, 9, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x))


def _torchvision_block_key(key: str) -> str:
    names = {"net.0": "conv1", "net.1.0": "bn1", "net.2": "conv2", "net.3.0": "bn2",
             "net.4": "conv3", "net.5.0": "bn3", "projection.shortcut": "downsample.0",
             "projection.bn.0": "downsample.1"}
    prefix, _, suffix = key.rpartition(".")
    return f"{names[prefix]}.{suffix}"


def test_without_selective_kernels_the_trunk_is_torchvisions_resnet50():
    """SK_RATIO 0: the 7x7 stem and bottleneck stages of torchvision's ResNet-50, key for key
    and shape for shape (its blocks compute the same: the test above)."""
    trunk = meta_trunk(50, 1, 0.0)
    with torch.device("meta"):
        reference = torchvision.models.resnet50()
    stem = {"net.0.0": "conv1", "net.0.1.0": "bn1"}
    renamed = {}
    for key, value in trunk.state_dict().items():
        if key.startswith("net.0."):
            prefix, _, suffix = key.rpartition(".")
            renamed[f"{stem[prefix]}.{suffix}"] = tuple(value.shape)
        else:
            _, stage, _, block, rest = key.split(".", 4)
            renamed[f"layer{stage}.{block}.{_torchvision_block_key(rest)}"] = tuple(value.shape)
    assert renamed == {k: tuple(v.shape) for k, v in reference.state_dict().items()
                       if not k.startswith("fc.")}
    assert isinstance(trunk.net[0][0], nn.Conv2d) and trunk.net[0][0].kernel_size == (7, 7)


# ----------------------------------------------------------------- the whole trunk in a model
@pytest.fixture(scope="module")
def sk50_model():
    """ResNet-50 1x with selective kernels, set to extract every stage (res4 pooled)."""
    cfg = model_cfg(DEPTH=50, WIDTH_MULTIPLIER=1, SK_RATIO=0.0625)
    pools = {"res4": ["AdaptiveAvgPool2d", [[1, 1]]]}
    cfg.FEATURE_EVAL_SETTINGS.update(
        EVAL_MODE_ON=True, FREEZE_TRUNK_ONLY=True, EXTRACT_TRUNK_FEATURES_ONLY=True,
        SHOULD_FLATTEN_FEATS=False,
        LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[stage, pools.get(stage, ["Identity", []])] for stage in
                                       ("conv1", "res2", "res3", "res4", "res5", "res5avg")])
    torch.manual_seed(0)
    return build_model(cfg).eval()


def test_stages_by_name_for_extraction_and_evaluation(sk50_model):
    """One forward through the feature extraction of every stage."""
    trunk = sk50_model.trunk
    assert trunk.stage_names == ["conv1", "res2", "res3", "res4", "res5", "res5avg"]
    assert trunk.default_out_feat_key == "res5avg" and trunk.output_dim == 2048
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        stages = sk50_model.extract_layers(x)
    assert {k: tuple(v.shape) for k, v in stages.items()} == {
        "conv1": (2, 64, 16, 16), "res2": (2, 256, 16, 16), "res3": (2, 512, 8, 8),
        "res4": (2, 1024, 1, 1), "res5": (2, 2048, 2, 2), "res5avg": (2, 2048)}
    assert trunk.stage_dims == {k: v.shape[1] for k, v in stages.items()}
    torch.testing.assert_close(stages["res5avg"], stages["res5"].mean(dim=(2, 3)))
    assert all(torch.isfinite(v).all() and v.std() > 0 for v in stages.values())
    # the three-convolution stem: 3 -> 32 (stride 2) -> 32 -> 64, then the max-pool
    assert [m.out_channels for m in trunk.net[0] if isinstance(m, nn.Conv2d)] == [32, 32, 64]


def test_a_checkpoint_in_vissls_layout_loads_as_it_is(sk50_model, tmp_path):
    """Trunk keys as VISSL names them (``net.*``, here the stem and res2) load unrenamed
    through MODEL.WEIGHTS_INIT; the keys the file lacks are reported missing."""
    shapes = vissl_resnet_sk_state_shapes(50, 1, 0.0625)
    g = torch.Generator().manual_seed(9)
    trunk = {k: (torch.randn(s, generator=g) if s else torch.tensor(3))
             for k, s in shapes.items() if k.startswith(("net.0.", "net.1."))}
    path = tmp_path / "vissl.torch"
    torch.save({"classy_state_dict": {"base_model": {"model": {"trunk": trunk, "heads": {}}}}},
               path)
    report = load_weights_init(sk50_model, {"PARAMS_FILE": str(path),
                                                 "STATE_DICT_KEY_NAME": "classy_state_dict"})
    assert report.loaded == [f"trunk.{k}" for k in trunk] and not report.unexpected
    assert all(model_key_from_vissl(f"trunk.{k}") == f"trunk.{k}" for k in shapes)
    state = sk50_model.trunk.state_dict()
    for key, value in trunk.items():
        assert torch.equal(state[key], value), key
    assert "trunk.net.2.blocks.0.projection.shortcut.2.weight" in report.missing


# ----------------------------------------------------------------- settings
@pytest.mark.parametrize("settings, message", [
    ({"DEPTH": 34}, r"RESNETS_SK.DEPTH must be one of \[50, 101, 152\], got 34"),
    ({"WIDTH_MULTIPLIER": 1.5}, "RESNETS_SK.WIDTH_MULTIPLIER must be a whole number >= 1"),
    ({"WIDTH_MULTIPLIER": 0}, "RESNETS_SK.WIDTH_MULTIPLIER must be a whole number >= 1"),
    ({"SK_RATIO": -0.1}, "RESNETS_SK.SK_RATIO must be a number >= 0"),
])
def test_bad_settings_are_refused_without_building(settings, message):
    cfg = model_cfg(**settings)
    with pytest.raises(ValueError, match=message):
        check_trunk_config(cfg)
    with pytest.raises(ValueError, match=message):
        build_model(cfg)


def test_the_launcher_accepts_the_trunk_and_checks_its_settings(tmp_path):
    _, cfg = load_config(["config=test/quick_simclr_synthetic",
                          "config.MODEL.TRUNK.NAME=resnet_sk", f"config.CHECKPOINT.DIR={tmp_path}"])
    check_before_launch("train", cfg)  # registered names, trunk settings
    cfg.MODEL.TRUNK.RESNETS_SK.DEPTH = 200
    with pytest.raises(ValueError, match="RESNETS_SK.DEPTH must be one of"):
        check_before_launch("train", cfg)
