"""Split a model's trainable parameters into weight-decayed and not weight-decayed groups."""
import re
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch.nn as nn
from torch.nn.modules.batchnorm import _NormBase

from ssl_engine.optimizers.lr_decay import layer_lr_scales

# BatchNorm*, SyncBatchNorm and InstanceNorm* derive from _NormBase.
NORM_LAYER_TYPES = (_NormBase, nn.GroupNorm, nn.LayerNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


PARAM_GROUP_CONSTRUCTORS = ("default", "dino", "linear_eval_heads", "lr_decay")
HEAD_INDEX = re.compile(r"^(?:module\.)?heads\.(\d+)\.")


# VISSL's ViT parameter names -> those of the engine's (timm's) ViT
VISSL_VIT_NAMES = {"class_token": "cls_token", "pos_embedding": "pos_embed"}


def resolve_name_parts(model: nn.Module, parts: Sequence[str]) -> List[str]:
    """OPTIMIZER.non_regularized_parameters as name parts of ``model``: each must be part of
    some parameter's name; VISSL's ViT names (class_token, pos_embedding) read as the ViT's
    own (cls_token, pos_embed). ValueError for a part that names nothing."""
    names = [name for name, _ in model.named_parameters()]
    resolved = []
    for part in (str(p) for p in parts):
        if not any(part in name for name in names):
            alias = VISSL_VIT_NAMES.get(part)
            if alias is None or not any(alias in name for name in names):
                raise ValueError(f"config.OPTIMIZER.non_regularized_parameters: '{part}' is part "
                                 f"of no parameter name of the model (e.g. {names[:3]})")
            part = alias
        resolved.append(part)
    return resolved


def lr_multiplier_of(name: str, lr_multipliers: Sequence[Sequence]) -> float:
    """The multiplier of the first ``[prefix, multiplier]`` pair whose prefix starts the
    parameter's name (whole dotted components: ``heads.1`` matches ``heads.1.clf.0.weight``,
    not ``heads.10.weight``), else 1."""
    for prefix, multiplier in lr_multipliers:
        prefix = str(prefix).removeprefix("module.")
        if name == prefix or name.startswith(prefix + "."):
            return float(multiplier)
    return 1.0


def trainable_parameters(model: nn.Module) -> List[tuple]:
    """``(full name, own name, parameter, in a norm layer)`` of every parameter that requires
    gradients, each once (a parameter shared by several modules under its first name), in
    module order; ValueError when there is none."""
    found, seen = [], set()
    for prefix, module in model.named_modules():
        is_norm = isinstance(module, NORM_LAYER_TYPES)
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad and id(param) not in seen:
                seen.add(id(param))
                found.append((f"{prefix}.{name}" if prefix else name, name, param, is_norm))
    if not found:
        raise ValueError("the model has no parameter that requires gradients: nothing to optimize")
    return found


def get_optimizer_param_groups(
    model: nn.Module, weight_decay: Union[float, Callable[[float], float]],
    regularize_bn: bool, regularize_bias: bool, lr_multipliers: Sequence[Sequence] = (),
    single_group: bool = False, constructor: str = "default",
    linear_eval_heads: Sequence[Dict] = (), non_regularized: Sequence[str] = (),
    lr_decay: float = 0.9,
    separate_heads: bool = False, head_weight_decay: Optional[float] = None,
) -> List[Dict]:
    """``[{"params", "weight_decay", "lr_multiplier", "head"}, ...]`` for the parameters that
    require gradients.

    Norm-layer parameters (unless ``regularize_bn``) and every parameter named ``bias`` (unless
    ``regularize_bias``) get weight decay 0; the rest get ``weight_decay``, a number or a
    param scheduler (``where -> value``) that the optimizer evaluates before every step.
    Parameters named by ``lr_multipliers`` (OPTIMIZER.lr_multipliers) go to groups of their
    own whose learning rate is the schedule's times their multiplier; the groups at the
    schedule's own rate come first.  Empty groups are left out; a parameter shared by several
    modules is listed once.

    ``single_group`` (VISSL's OPTIMIZER.construct_single_param_group_only): one group of every
    trainable parameter at ``weight_decay``, norm layers and biases included; no multipliers.

    ``constructor`` (OPTIMIZER.param_group_constructor): ``default`` as above; ``dino`` (DINO's
    rule, VISSL's name) exempts every parameter whose name ends with ``.bias`` or contains
    ``norm``, whatever ``regularize_bn`` and ``regularize_bias`` say; ``linear_eval_heads``:
    see ``linear_eval_head_groups``; ``lr_decay``: as ``default``, with each parameter's lr
    multiplier also scaled by its layer's ``lr_decay`` power (``optimizers/lr_decay.py``,
    OPTIMIZER.layer_wise_lr_decay.decay).

    ``non_regularized`` (OPTIMIZER.non_regularized_parameters, e.g. ``[pos_embedding,
    class_token]``): a parameter whose name contains one of these strings gets no weight
    decay either (default and dino groups).

    ``separate_heads`` (OPTIMIZER.head_optimizer_params): the heads' parameters (``heads.*``)
    go to groups of their own, marked ``"head": True``, for their own lr schedule; with
    ``head_weight_decay`` (``use_different_wd``) their regularised ones decay by it instead.
    """
    if constructor not in PARAM_GROUP_CONSTRUCTORS:
        raise ValueError(f"config.OPTIMIZER.param_group_constructor={constructor!r} is not one "
                         f"of {', '.join(PARAM_GROUP_CONSTRUCTORS)}")
    separate_heads = separate_heads or head_weight_decay is not None
    if separate_heads and (single_group or constructor == "linear_eval_heads"):
        raise ValueError("config.OPTIMIZER.head_optimizer_params (use_different_lr / "
                         "use_different_wd) needs the default, dino or lr_decay param_group_constructor "
                         "and construct_single_param_group_only=false")
    if constructor == "linear_eval_heads" and not single_group:
        if lr_multipliers:
            raise ValueError("config.OPTIMIZER.param_group_constructor=linear_eval_heads sets "
                             "each head's lr (OPTIMIZER.linear_eval_heads): it cannot take "
                             f"config.OPTIMIZER.lr_multipliers={list(lr_multipliers)}")
        return linear_eval_head_groups(model, weight_decay, regularize_bn, regularize_bias,
                                       linear_eval_heads)
    if single_group:
        if constructor == "lr_decay":
            raise ValueError("config.OPTIMIZER.construct_single_param_group_only=true puts every "
                             "parameter in one group: it cannot take the layer-wise lr decay of "
                             "param_group_constructor=lr_decay")
        if lr_multipliers:
            raise ValueError("config.OPTIMIZER.construct_single_param_group_only=true puts every "
                             "parameter in one group: it cannot take "
                             f"config.OPTIMIZER.lr_multipliers={list(lr_multipliers)}")
        params = [param for _, _, param, _ in trainable_parameters(model)]
        return [{"params": params, "lr_multiplier": 1.0, "weight_decay":
                 weight_decay if callable(weight_decay) else float(weight_decay)}]
    non_regularized = resolve_name_parts(model, non_regularized)
    groups: Dict[tuple, List] = {}
    trainable = trainable_parameters(model)
    scales = (layer_lr_scales([full for full, *_ in trainable], lr_decay)
              if constructor == "lr_decay" else {})
    for full_name, name, param, is_norm in trainable:
        if constructor == "dino":
            exempt = full_name.endswith(".bias") or "norm" in full_name
        else:
            exempt = (is_norm and not regularize_bn) or (name == "bias" and not regularize_bias)
        exempt = exempt or any(str(part) in full_name for part in non_regularized)
        multiplier = lr_multiplier_of(full_name, lr_multipliers) * scales.get(full_name, 1.0)
        head = separate_heads and HEAD_INDEX.match(full_name) is not None
        groups.setdefault((multiplier != 1.0, multiplier, head, exempt), []).append(param)
    regularized = weight_decay if callable(weight_decay) else float(weight_decay)
    head_regularized = regularized if head_weight_decay is None else float(head_weight_decay)
    return [
        {"params": params, "lr_multiplier": multiplier, "head": head,
         "weight_decay": 0.0 if exempt else head_regularized if head else regularized}
        for (_, multiplier, head, exempt), params in sorted(groups.items(),
                                                            key=lambda item: item[0])
    ]


def linear_eval_head_groups(
    model: nn.Module, weight_decay: Union[float, Callable[[float], float]],
    regularize_bn: bool, regularize_bias: bool, settings: Sequence[Dict],
) -> List[Dict]:
    """VISSL's ``linear_eval_heads`` parameter groups: head ``i``'s parameters at the lr
    schedule times ``settings[i]["lr"]``, with ``settings[i]``'s ``weight_decay`` (default the
    optimizer's) and ``regularize_bn`` (default the optimizer's); biases follow
    ``regularize_bias``. Only the heads are optimized, as in VISSL: a trainable parameter
    outside them is refused (freeze the trunk, or use the default constructor)."""
    where = "config.OPTIMIZER.linear_eval_heads"
    outside = [name for name, param in model.named_parameters()
               if param.requires_grad and not HEAD_INDEX.match(name)]
    if outside:
        raise ValueError(f"config.OPTIMIZER.param_group_constructor=linear_eval_heads optimizes "
                         f"the heads only, but {len(outside)} trainable parameters are outside "
                         f"them (e.g. {outside[0]}): freeze the trunk "
                         "(MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY) or use the default "
                         "param_group_constructor")
    groups: Dict[tuple, List] = {}
    for full_name, name, param, is_norm in trainable_parameters(model):
        index = int(HEAD_INDEX.match(full_name).group(1))
        if index >= len(settings) or not isinstance(settings[index], dict) \
                or "lr" not in settings[index]:
            raise ValueError(f"{where} needs an entry {{lr: ..}} for head {index}; it has "
                             f"{len(settings)}: {list(settings)}")
        bn = bool(settings[index].get("regularize_bn", regularize_bn))
        exempt = (is_norm and not bn) or (name == "bias" and not regularize_bias)
        groups.setdefault((index, exempt), []).append(param)
    out = []
    for (index, exempt), params in sorted(groups.items(), key=lambda item: item[0]):
        decay = settings[index].get("weight_decay", weight_decay)
        decay = decay if callable(decay) else float(decay)
        out.append({"params": params, "weight_decay": 0.0 if exempt else decay,
                    "lr_multiplier": float(settings[index]["lr"])})
    return out
