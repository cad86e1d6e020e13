"""Helpers of the export/import parity tests: a trunk of the engine with random weights (norms,
biases, batch-norm statistics and layer scales drawn too, so that a wrongly loaded tensor
shows), its features, and the largest difference of two feature tensors."""
import copy
from pathlib import Path

import torch
import yaml

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model

ROOT = Path(__file__).resolve().parents[1]
with open(ROOT / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])
TOLERANCE = 1e-5  # float32, max abs difference


def model_cfg(trunk: str, section: str = None, **settings) -> AttrDict:
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = trunk
    if section:
        cfg.TRUNK[section].update(settings)
    return cfg


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Draw the tensors that start at constants (norms, biases, statistics, layer scales)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            if not tensor.is_floating_point():
                continue
            last = name.rsplit(".", 1)[-1]
            if last in ("running_var",) or (tensor.dim() == 1 and last in (
                    "weight", "gamma", "gamma1", "gamma2", "gamma3", "gamma_1", "gamma_2")):
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
            elif last in ("bias", "running_mean", "q_bias", "v_bias"):
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.1)


def engine_model(cfg: AttrDict, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(cfg)
    randomize(model.trunk, seed + 1)
    return model.eval()


def images(n: int, size: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def plain_forward(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return net(x)


def both_ways(cfg: AttrDict, library: str, x: torch.Tensor, tmp_path: Path,
              net_forward=plain_forward, engine_key: str = None):
    """The largest feature differences (export, import) between the engine's trunk and its
    ``library`` counterpart:

    - export: the trunk's weights written by ``export_model`` to a safetensors file, loaded
      into the counterpart built as the description says (``load_strict``);
    - import: the counterpart's own state dict (new random weights), saved as the library
      saves it (``torch.save`` of ``state_dict()``), loaded into the engine's model by
      MODEL.WEIGHTS_INIT with no prefix: every trunk tensor is loaded."""
    from safetensors.torch import load_file

    from ssl_engine.checkpoint.export import export_model
    from ssl_engine.checkpoint.weights_init import load_weights_init

    model = engine_model(cfg, seed=0)
    out = tmp_path / f"{library}.safetensors"
    description = export_model(model.get_classy_state()["model"], cfg, library, out)
    net = counterpart_net(description)
    net.load_state_dict(load_file(str(out)), strict=description["load_strict"])
    keys = [engine_key] if engine_key else None
    with torch.no_grad():
        export_diff = max_diff(model.trunk(x, keys)[0].flatten(1), net_forward(net, x).flatten(1))

    fresh = net  # new weights for the way back: every tensor moved, norms redrawn
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for tensor in fresh.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.01 * torch.randn(tensor.shape, generator=generator))
    randomize(fresh, 12)
    saved = tmp_path / f"{library}_own.pth"
    torch.save(fresh.state_dict(), saved)
    imported = model  # every trunk tensor is overwritten (checked below)
    report = load_weights_init(imported, {"PARAMS_FILE": str(saved), "STATE_DICT_KEY_NAME": ""})
    with torch.no_grad():
        import_diff = max_diff(imported.trunk(x, keys)[0].flatten(1),
                               net_forward(fresh, x).flatten(1))
    trunk_keys = [f"trunk.{k}" for k in imported.trunk.state_dict()]
    assert [k for k in trunk_keys if k not in report.loaded] == [], report.summary()
    return export_diff, import_diff, description


def counterpart_net(description) -> torch.nn.Module:
    """The counterpart as the export's description says to build it, classifier removed."""
    import functools  # noqa: F401  (the description's torchvision calls use it)

    import timm  # noqa: F401
    import torchvision  # noqa: F401

    net = eval(description["build"])  # the very line a user is told to run
    for name in ("fc", "classifier"):
        if description["library"] == "torchvision" and hasattr(net, name):
            setattr(net, name, torch.nn.Identity())
    return net.eval()
