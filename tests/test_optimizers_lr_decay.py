"""OPTIMIZER.param_group_constructor=lr_decay: each parameter of a ViT gets the lr schedule
times decay^(depth - block) (embeddings: decay^(depth + 1), final norm and heads: 1), checked
against the lr the optimizer applies after a step, with the weight-decay exemptions of the
default constructor."""
from pathlib import Path

import pytest
import torch
import yaml

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.optimizers import build_optimizer, get_optimizer_param_groups
from ssl_engine.optimizers.lr_decay import layer_lr_scales

DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "config" / "defaults.yaml"


def vit_with_head(depth: int = 3):
    from ssl_engine.config import compose_config
    from ssl_engine.models import build_model

    vit = ("{IMAGE_SIZE: 8, PATCH_SIZE: 4, NUM_LAYERS: %d, NUM_HEADS: 2, HIDDEN_DIM: 8, "
           "MLP_DIM: 16, QKV_BIAS: true}" % depth)
    _, cfg = compose_config(["config=test/quick_dino_synthetic",
                             "config.MODEL.TRUNK.NAME=vision_transformer",
                             f"config.MODEL.TRUNK.VISION_TRANSFORMERS={vit}",
                             "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[8,5]}]]"])
    torch.manual_seed(0)
    return build_model(cfg.MODEL)


def expected_scale(name: str, decay: float, depth: int) -> float:
    """The rule written out for timm's ViT names under trunk.vit."""
    if name.startswith("heads.") or name.startswith("trunk.vit.norm."):
        return 1.0
    if name.startswith("trunk.vit.blocks."):
        block = int(name.split(".")[3])
        return decay ** (depth - block)
    assert name.split(".")[2] in ("cls_token", "pos_embed", "patch_embed"), name
    return decay ** (depth + 1)


def test_each_parameter_runs_at_its_layers_decayed_lr():
    depth, decay, base_lr = 3, 0.5, 0.4
    model = vit_with_head(depth)
    cfg = AttrDict(yaml.safe_load(DEFAULTS.read_text())["config"]["OPTIMIZER"])
    cfg.update(name="adamw", num_epochs=1, weight_decay=0.05, param_group_constructor="lr_decay",
               regularize_bias=False)
    cfg.layer_wise_lr_decay.decay = decay
    cfg.param_schedulers.lr = AttrDict({"name": "constant", "update_interval": "step",
                                        "value": base_lr})
    optimizer = build_optimizer(cfg, model)
    model(torch.randn(2, 3, 8, 8)).__getitem__(0).sum().backward()
    optimizer.step(where=0.0)
    names = {id(param): name for name, param in model.named_parameters()}
    seen = set()
    for group in optimizer.param_groups:
        for param in group["params"]:
            name = names[id(param)]
            seen.add(name)
            assert group["lr"] == pytest.approx(base_lr * expected_scale(name, decay, depth)), name
            exempt = name.endswith(".bias") or ".norm" in name
            assert group["weight_decay"] == (0.0 if exempt else 0.05), name
    assert seen == set(names.values())
    # 1 (heads, final norm), 3 blocks and the embeddings: 5 rates, decayed and not
    assert len({round(group["lr"], 9) for group in optimizer.param_groups}) == depth + 2


def test_lr_multipliers_multiply_the_decay_and_bad_settings_are_refused():
    model = vit_with_head(2)
    groups = get_optimizer_param_groups(model, 0.0, False, True, constructor="lr_decay",
                                        lr_decay=0.5, lr_multipliers=[["heads", 10.0]])
    multipliers = {id(p): g["lr_multiplier"] for g in groups for p in g["params"]}
    for name, param in model.named_parameters():
        expected = expected_scale(name, 0.5, 2) * (10.0 if name.startswith("heads") else 1.0)
        assert multipliers[id(param)] == pytest.approx(expected), name
    with pytest.raises(ValueError, match="cannot take the layer-wise lr decay"):
        get_optimizer_param_groups(model, 0.0, False, True, constructor="lr_decay",
                                   single_group=True)
    with pytest.raises(ValueError, match=r"layer_wise_lr_decay.decay must be in \(0, 1\]"):
        layer_lr_scales(["blocks.0.w"], 1.5)
    with pytest.raises(ValueError, match="needs a transformer trunk"):
        layer_lr_scales(["trunk.conv.weight", "heads.0.weight"], 0.9)
    with pytest.raises(ValueError, match="blocks inside stages"):
        layer_lr_scales(["trunk.layers.0.blocks.1.w"], 0.9)
