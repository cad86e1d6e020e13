"""RegNet trunk (MODEL.TRUNK.NAME regnet) built by classy_vision's model zoo.

MODEL.TRUNK.REGNET chooses the network in one of three ways, with VISSL's keys:

- ``name``: one of classy_vision's presets (regnet_y_400mf ... regnet_y_256gf, regnet_x_*,
  regnet_z_*), the other keys left at their defaults;
- ``name: null`` and the RegNet parameters ``depth, w_0, w_a, w_m, group_width`` (plus the
  optional block, stem, activation, squeeze-excitation and batch-norm keys): classy's
  ``RegNet.from_config``;
- ``name: anynet`` and the per-stage lists ``depths, widths, group_widths,
  bottleneck_multipliers, strides``: classy's ``AnyNet``.

The classy modules are held in ``_feature_blocks`` under the stage names, as VISSL's regnet
trunk holds them, so parameter names are VISSL's (``trunk._feature_blocks.res2.block1-0...``).

VISSL's FSDP RegNet (``regnet_fsdp``) splits each stage into block groups
(``stage_checkpoints``: the end of each group per stage; ``stage_checkpointing``: which are
activation-checkpointed): the same groups are checkpointed here when training (a stage
without boundaries is not; ``stage_groups``). Results do not depend on them; FSDP shards by
stage here, and VISSL's ``block<s>-part<g>`` checkpoint names read as these.

Outputs: ``conv1`` (stem), ``res2``.. (one per stage, usually res2..res5), ``avgpool``
([N, C, 1, 1]), ``flatten`` ([N, C], the default) and ``res5avg`` (the same [N, C] under the
resnet trunk's name).
"""
import logging
from typing import Any, Dict, List

import torch
from torch import nn

from ssl_engine.models.activation_checkpointing import checkpointed_segments, checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk

logger = logging.getLogger(__name__)

CONFIG = "config.MODEL.TRUNK.REGNET"
REGNET_KEYS = ("depth", "w_0", "w_a", "w_m", "group_width")
BLOCK_GROUP_KEYS = ("stage_checkpoints", "stage_checkpointing")  # VISSL's FSDP RegNet's
ANYNET_KEYS = ("depths", "widths", "group_widths", "bottleneck_multipliers", "strides")
# keys every way of building accepts, with their defaults (those of defaults.yaml and classy)
OPTION_DEFAULTS: Dict[str, Any] = {
    "bottleneck_multiplier": 1.0,
    "stem_type": "simple_stem_in",
    "stem_width": 32,
    "block_type": "res_bottleneck_block",
    "activation": "relu",
    "use_se": True,
    "se_ratio": 0.25,
    "bn_epsilon": 1e-5,
    "bn_momentum": 0.1,
}


def _classy():
    # inside: classy_vision loads only when one of its trunks is used
    from ssl_engine.utils.classy import classy_vision  # noqa: F401  (warnings filtered)
    from classy_vision.models import anynet, regnet
    from classy_vision.models import MODEL_REGISTRY

    return anynet, regnet, MODEL_REGISTRY


def regnet_presets() -> List[str]:
    """The RegNet names classy_vision registers (regnet_y_400mf, regnet_x_1.6gf, ...)."""
    _, _, registry = _classy()
    return sorted(name for name in registry if name.startswith("regnet_"))


def _error(key: str, value, why: str) -> ValueError:
    return ValueError(f"{CONFIG}.{key}={value!r} {why}")


def _set_keys(cfg, keys) -> List[str]:
    return [key for key in keys if cfg.get(key) not in (None, [])]


def _check_enum(cfg, key: str, enum) -> None:
    value = cfg.get(key, OPTION_DEFAULTS[key])
    names = [member.name.lower() for member in enum]
    if not isinstance(value, str) or value.lower() not in names:
        raise _error(key, value, f"is not one of {', '.join(names)}")


def _check_options(cfg) -> None:
    anynet, _, _ = _classy()
    _check_enum(cfg, "stem_type", anynet.StemType)
    _check_enum(cfg, "block_type", anynet.BlockType)
    _check_enum(cfg, "activation", anynet.ActivationType)
    if int(cfg.get("stem_width", 32)) < 1:
        raise _error("stem_width", cfg.stem_width, "must be at least 1")
    se_ratio = cfg.get("se_ratio", 0.25)
    if cfg.get("use_se", True) and not 0 < float(se_ratio) <= 1:
        raise _error("se_ratio", se_ratio, "must be in (0, 1] when use_se is true")
    if float(cfg.get("bottleneck_multiplier", 1.0)) <= 0:
        raise _error("bottleneck_multiplier", cfg.bottleneck_multiplier, "must be > 0")


def _check_regnet_parameters(cfg) -> None:
    missing = [key for key in REGNET_KEYS if cfg.get(key) is None]
    if missing:
        raise ValueError(f"{CONFIG}: set name (one of {', '.join(regnet_presets())}) or all of "
                         f"{', '.join(REGNET_KEYS)}; missing: {', '.join(missing)}")
    if int(cfg.depth) < 1:
        raise _error("depth", cfg.depth, "must be at least 1")
    if int(cfg.w_0) < 8 or int(cfg.w_0) % 8:
        raise _error("w_0", cfg.w_0, "must be a positive multiple of 8")
    if float(cfg.w_a) < 0:
        raise _error("w_a", cfg.w_a, "must be >= 0")
    if float(cfg.w_m) <= 1:
        raise _error("w_m", cfg.w_m, "must be > 1")
    if int(cfg.group_width) < 1:
        raise _error("group_width", cfg.group_width, "must be at least 1")


def _check_anynet_parameters(cfg) -> None:
    lists = {key: cfg.get(key) for key in ANYNET_KEYS}
    bad = [key for key, value in lists.items() if not isinstance(value, (list, tuple)) or not value]
    if bad:
        raise ValueError(f"{CONFIG}.name='anynet' needs the non-empty per-stage lists "
                         f"{', '.join(ANYNET_KEYS)}; missing or empty: {', '.join(bad)}")
    lengths = {key: len(value) for key, value in lists.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{CONFIG}: the per-stage lists must have one entry per stage; "
                         f"their lengths are {lengths}")


def _check_stage_groups(trunk_cfg) -> None:
    delimiters = trunk_cfg.get("stage_checkpoints") or []
    flags = trunk_cfg.get("stage_checkpointing") or []
    for key, value, kind in (("stage_checkpoints", delimiters, int),
                             ("stage_checkpointing", flags, bool)):
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(stage, (list, tuple)) and all(
                    isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
                    for v in stage) for stage in value):
            raise _error(key, value, f"must be a list (one per stage) of lists of "
                                     f"{kind.__name__}s")
    for index, stage in enumerate(delimiters):
        if list(stage) != sorted(stage) or len(set(stage)) != len(stage) or \
                any(v < 1 for v in stage):
            raise _error("stage_checkpoints", delimiters, f"has stage {index} boundaries "
                         f"{list(stage)}: they must be increasing block counts >= 1")
        if index < len(flags) and flags[index] and len(flags[index]) != len(stage):
            raise _error("stage_checkpointing", flags, f"has {len(flags[index])} flags for "
                         f"stage {index}, whose stage_checkpoints has {len(stage)} groups")


def stage_groups(trunk_cfg, depths: List[int], with_checkpointing: bool
                 ) -> List[List[tuple]]:
    """VISSL's block groups of its FSDP RegNet: per stage, ``(start, end, checkpointed)``
    runs of blocks. ``stage_checkpoints[i]`` gives the end of each group of stage i (the
    stage's depth is added when it is missing) and ``stage_checkpointing[i]`` whether each is
    checkpointed (default: USE_ACTIVATION_CHECKPOINTING; the added last group too); a stage
    with no boundaries is one group, never checkpointed."""
    delimiters = trunk_cfg.get("stage_checkpoints") or []
    flags = trunk_cfg.get("stage_checkpointing") or []
    groups = []
    for index, depth in enumerate(depths):
        ends = list(delimiters[index]) if index < len(delimiters) else []
        checkpointed = list(flags[index]) if index < len(flags) and flags[index] else \
            [with_checkpointing] * len(ends)
        if ends and ends[-1] > depth:
            raise _error("stage_checkpoints", delimiters, f"has a boundary {ends[-1]} beyond "
                         f"the {depth} blocks of stage {index}")
        if not ends:
            ends, checkpointed = [depth], [False]
        elif ends[-1] != depth:
            ends.append(depth)
            checkpointed.append(with_checkpointing)
        starts = [0] + ends[:-1]
        groups.append(list(zip(starts, ends, checkpointed)))
    return groups


def parameters_beside_preset(trunk_cfg) -> List[str]:
    """The RegNet parameters (and options changed from their defaults) set beside a preset
    ``name``: VISSL built a preset from its name alone, so its configs that combine the two
    (its instance-retrieval model files over a base that gives other parameters) ran the
    preset.  ``clear_parameters_beside_preset`` does the same."""
    name = trunk_cfg.get("name")
    if not name or name == "anynet":
        return []
    return _set_keys(trunk_cfg, REGNET_KEYS + BLOCK_GROUP_KEYS) + [
        key for key, default in OPTION_DEFAULTS.items() if trunk_cfg.get(key, default) != default]


def clear_parameters_beside_preset(trunk_cfg) -> Dict[str, Any]:
    """Reset the keys ``parameters_beside_preset`` finds to their defaults; returns their
    values before."""
    cleared = {key: trunk_cfg[key] for key in parameters_beside_preset(trunk_cfg)}
    for key in cleared:
        trunk_cfg[key] = [] if key in BLOCK_GROUP_KEYS else OPTION_DEFAULTS.get(key)
    return cleared


def check_regnet_config(trunk_cfg) -> None:
    """Refuse an incomplete or invalid MODEL.TRUNK.REGNET (every message names the key)."""
    _check_stage_groups(trunk_cfg)
    name = trunk_cfg.get("name")
    if name == "anynet":
        stray = _set_keys(trunk_cfg, REGNET_KEYS)
        if stray:
            raise _error(stray[0], trunk_cfg[stray[0]], "is a RegNet parameter; name='anynet' "
                         f"takes {', '.join(ANYNET_KEYS)}")
        _check_anynet_parameters(trunk_cfg)
        _check_options(trunk_cfg)
        return
    stray = _set_keys(trunk_cfg, ANYNET_KEYS)
    if stray:
        raise _error(stray[0], trunk_cfg[stray[0]], "is only used with name='anynet'")
    if name:
        presets = regnet_presets()
        if name not in presets:
            raise _error("name", name, f"is not one of anynet, {', '.join(presets)}")
        changed = parameters_beside_preset(trunk_cfg)
        if changed:
            raise _error(changed[0], trunk_cfg[changed[0]],
                         f"cannot be combined with name={name!r} (the preset sets the whole "
                         "network); set name to null to give the parameters instead")
        return
    _check_regnet_parameters(trunk_cfg)
    _check_options(trunk_cfg)


def build_classy_regnet(trunk_cfg) -> nn.Module:
    """The classy_vision RegNet / AnyNet that MODEL.TRUNK.REGNET describes (checked by the
    trunk's ``check_config``)."""
    anynet, regnet, registry = _classy()
    name = trunk_cfg.get("name")
    if name and name != "anynet":
        return registry[name].from_config({"name": name})
    settings = {key: trunk_cfg.get(key, default) for key, default in OPTION_DEFAULTS.items()}
    if name == "anynet":
        settings.update({key: list(trunk_cfg[key]) for key in ANYNET_KEYS})
        return anynet.AnyNet.from_config(settings)
    settings.update({key: trunk_cfg[key] for key in REGNET_KEYS})
    return regnet.RegNet.from_config(settings)


@register_model_trunk("regnet")
class RegNetTrunk(StagedTrunk):
    """Stages: conv1, res2..res5 (one per RegNet stage), avgpool, flatten (default), res5avg."""

    default_out_feat_key = "flatten"

    @classmethod
    def derive_config(cls, cfg) -> None:
        """A preset ``name`` beside its parameters: VISSL built the preset from the name alone;
        so does the engine, saying once which keys it ignores."""
        regnet = cfg.MODEL.TRUNK.get("REGNET")
        ignored = clear_parameters_beside_preset(regnet) if regnet else {}
        if ignored:
            logger.warning("config.MODEL.TRUNK.REGNET: %s ignored: name=%r is a preset that sets "
                           "the whole network (VISSL built it from the name alone too); set name "
                           "to null to build from the parameters",
                           ", ".join(f"{key}={value!r}" for key, value in ignored.items()),
                           regnet.get("name"))

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_regnet_config(model_cfg.TRUNK.REGNET)
        checkpointing_splits(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        model = build_classy_regnet(model_cfg.TRUNK.REGNET)
        blocks = [("conv1", model.stem)]
        width = stage_out_channels(model.stem, 3)
        self.stage_dims = {"conv1": width}
        for index, stage in enumerate(model.trunk_output.children()):
            name = f"res{index + 2}"
            blocks.append((name, stage))
            width = stage_out_channels(stage, width)
            self.stage_dims[name] = width
        self._feature_blocks = nn.ModuleDict(blocks)
        self.stage_dims.update(avgpool=width, flatten=width, res5avg=width)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.checkpoint_splits = checkpointing_splits(model_cfg)
        self.groups = None  # VISSL's block groups, when stage_checkpoints is set
        trunk_cfg = model_cfg.TRUNK.REGNET
        if trunk_cfg.get("stage_checkpoints"):
            depths = [len(stage) for stage in self.residual_stages()]
            self.groups = stage_groups(trunk_cfg, depths, self.checkpoint_splits > 0)

    def residual_stages(self) -> List[nn.Module]:
        return [block for name, block in self._feature_blocks.items() if name != "conv1"]

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the stages."""
        return self.residual_stages()

    def stages(self):
        stem = self._feature_blocks["conv1"]
        names = [name for name in self._feature_blocks if name != "conv1"]
        layers = self.residual_stages()
        checkpointing = self.training and torch.is_grad_enabled()
        if self.groups is not None and checkpointing:
            layers = [grouped_stage(list(layer), groups)
                      for layer, groups in zip(layers, self.groups)]
        elif self.checkpoint_splits and checkpointing:
            stem = checkpointed_segments([stem], 1)
            layers = [checkpointed_segments(list(layer), self.checkpoint_splits)
                      for layer in layers]
        return [
            ("conv1", stem),
            *zip(names, layers),
            ("avgpool", self.avgpool),
            ("flatten", lambda x: torch.flatten(x, 1)),
            ("res5avg", lambda x: x),
        ]


def grouped_stage(blocks: List[nn.Module], groups: List[tuple]):
    """A function running ``blocks`` as VISSL's block groups ``(start, end, checkpointed)``:
    a checkpointed group keeps only its input for the backward pass."""
    parts = [checkpointed_segments(blocks[start:end], 1) if checkpointed
             else nn.Sequential(*blocks[start:end]) for start, end, checkpointed in groups]

    def run(x: torch.Tensor) -> torch.Tensor:
        for part in parts:
            x = part(x)
        return x

    return run


def stage_out_channels(stage: nn.Module, in_channels: int) -> int:
    """Output channels of a classy stem or AnyStage: those of its last convolution."""
    convs = [module for module in stage.modules() if isinstance(module, nn.Conv2d)]
    return int(convs[-1].out_channels) if convs else in_channels
