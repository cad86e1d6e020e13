"""The SSL model: a trunk run on every input crop, then heads (chained, or one per evaluated
stage in feature evaluation)."""
import copy
import logging
from typing import Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from ssl_engine.models.feature_eval import (POOL_OPS_MAP, SETTINGS, FeatureEvalSettings,
                                            apply_pools, check_stages_named_once)
from ssl_engine.models.head_precision import float32_heads
from ssl_engine.models.heads.mlp import MLP
from ssl_engine.models.multi_input import (
    build_head_chains,
    chain_forward,
    check_mapping,
    head_keywords,
    is_chain_mapping,
    mapped_trunk_outputs,
    parse_chain_mapping,
    parse_mapping,
)
from ssl_engine.models.registry import MODEL_HEADS, MODEL_TRUNKS
from ssl_engine.models.state_dict import load_state_dict_strict

ModelInput = Union[torch.Tensor, Sequence[torch.Tensor], Dict[str, torch.Tensor]]
logger = logging.getLogger(__name__)
_WARNED_EXTRA = set()  # head entries whose ignored extra elements were already warned about


def build_head(index: int, entry) -> nn.Module:
    """One head from an entry ``[head_name, {params}]`` of MODEL.HEAD.PARAMS.  Elements after
    the params are ignored with a warning, as VISSL ignored them (a VISSL PIRL config writes
    ``["mlp", {"dims": [...]}, "use_relu": True]``, whose ``use_relu`` VISSL never read)."""
    where = f"MODEL.HEAD.PARAMS[{index}]"
    if (not isinstance(entry, (list, tuple)) or len(entry) < 2 or not isinstance(entry[0], str)
            or not isinstance(entry[1], (dict, type(None)))):
        raise ValueError(f"{where} must be [head_name, {{params}}], got {entry!r}")
    name, params, extra = entry[0], entry[1], list(entry[2:])
    if extra and repr(entry) not in _WARNED_EXTRA:
        _WARNED_EXTRA.add(repr(entry))
        logger.warning("%s ('%s'): %s after the params ignored, as VISSL ignored them (it read "
                       "the name and the params of a head only); put a setting inside the "
                       "params to apply it", where, name, extra)
    head_cls = MODEL_HEADS.get(name)
    params = dict(params or {})
    try:
        return head_cls(**params)
    except TypeError as error:
        raise ValueError(f"{where} ('{name}') has invalid params {params}: {error}") from None


DEFAULT_BN_EPS, DEFAULT_BN_MOMENTUM = 1e-5, 0.1  # torch's, and MODEL.HEAD's defaults


def set_head_batch_norms(heads: nn.Module, head_cfg) -> None:
    """MODEL.HEAD.BATCHNORM_EPS / BATCHNORM_MOMENTUM, when not at their defaults, on every
    batch norm of the heads (VISSL's heads build theirs with them)."""
    eps = float(head_cfg.get("BATCHNORM_EPS", DEFAULT_BN_EPS))
    momentum = float(head_cfg.get("BATCHNORM_MOMENTUM", DEFAULT_BN_MOMENTUM))
    if (eps, momentum) == (DEFAULT_BN_EPS, DEFAULT_BN_MOMENTUM):
        return
    if not eps > 0 or not 0 < momentum <= 1:
        raise ValueError(f"MODEL.HEAD.BATCHNORM_EPS={eps} must be > 0 and "
                         f"MODEL.HEAD.BATCHNORM_MOMENTUM={momentum} in (0, 1]")
    for module in heads.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eps, module.momentum = eps, momentum


def scale_head_weights(heads: nn.Module, head_cfg) -> None:
    """MODEL.HEAD.PARAMS_MULTIPLIER, when not 1: the initial weights and biases of the linear
    layers of every mlp (and eval_mlp) head are multiplied by it, as VISSL's MLP heads do."""
    multiplier = float(head_cfg.get("PARAMS_MULTIPLIER", 1.0))
    if multiplier == 1.0:
        return
    with torch.no_grad():
        for mlp in (m for m in heads.modules() if isinstance(m, MLP)):
            for layer in (m for m in mlp.modules() if isinstance(m, nn.Linear)):
                layer.weight.mul_(multiplier)
                if layer.bias is not None:
                    layer.bias.mul_(multiplier)


def concat_crops(stage: str, features: List[torch.Tensor]) -> torch.Tensor:
    """The features of every crop along dim 0; crops must agree on the other dimensions."""
    shapes = {tuple(f.shape[1:]) for f in features}
    if len(shapes) > 1:
        raise ValueError(
            f"stage '{stage}' gives differently shaped features for the input crops "
            f"{sorted(shapes)}; request a pooled stage or feed crops of one resolution"
        )
    return torch.cat(features, dim=0)


def check_output_heads(indices, num_heads: int) -> List[int]:
    """MODEL.HEAD.OUTPUT_HEADS as a list of valid indices into the ``num_heads`` heads."""
    indices = [int(i) for i in indices]
    if not indices or (num_heads and any(not -num_heads <= i < num_heads for i in indices)):
        raise ValueError(f"config.MODEL.HEAD.OUTPUT_HEADS={indices} must list indices of the "
                         f"{num_heads} head(s) of config.MODEL.HEAD.PARAMS")
    return indices


def flatten_outputs(outputs) -> List[torch.Tensor]:
    """Head outputs as one list: a head with several outputs (a list, e.g. swav_head's
    embedding and prototype scores) contributes each of them in order."""
    flat: List[torch.Tensor] = []
    for output in outputs:
        flat.extend(output) if isinstance(output, (list, tuple)) else flat.append(output)
    return flat


def freeze(module: nn.Module) -> None:
    for param in module.parameters():
        param.requires_grad = False


class BaseSSLMultiInputOutputModel(nn.Module):
    """``trunk`` (MODEL.TRUNK.NAME) followed by ``heads`` (MODEL.HEAD.PARAMS).

    ``forward`` takes one batch [N, C, H, W] or a list of batches (multi-crop, any resolutions):
    the trunk runs on each, the outputs are concatenated along dim 0 in input order, and the
    heads run once on the result, one after the other.  It returns a list of outputs: those of
    the heads listed in MODEL.HEAD.OUTPUT_HEADS (default: the last head only), or the flattened
    trunk output when there are no heads.  Listing two heads gives a method both, e.g. the
    projection and the prediction of SimSiam.

    With MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON and a LINEAR_EVAL_FEAT_POOL_OPS_MAP, the trunk
    outputs the listed stages, each pooled and flattened; head i is applied to stage i and the
    list of the heads' outputs is returned (the pooled features themselves without heads).
    FREEZE_TRUNK_ONLY / FREEZE_TRUNK_AND_HEAD turn off the gradients of the trunk / of
    everything and keep those parts in eval mode even under ``train()``. With EVAL_MODE_ON and
    EXTRACT_TRUNK_FEATURES_ONLY the model is a trunk feature extractor: no head is built.

    With MODEL.MULTI_INPUT_HEAD_MAPPING, ``forward`` also takes a dict of named inputs (the
    masking collator's): see models/multi_input.py.
    """

    def __init__(self, model_cfg):
        super().__init__()
        self.trunk = MODEL_TRUNKS.get(model_cfg.TRUNK.NAME)(model_cfg)
        self.eval_settings = FeatureEvalSettings.from_model_cfg(model_cfg)
        head_params = [] if self.eval_settings.trunk_only else model_cfg.HEAD.PARAMS
        mapping = model_cfg.get("MULTI_INPUT_HEAD_MAPPING") or []
        # PIRL's form: one chain of heads per input; else iBOT's named inputs (multi_input.py)
        chains = is_chain_mapping(mapping)
        self.chain_mapping = (parse_chain_mapping(mapping, len(head_params))
                              if chains and head_params else [])
        self.input_mapping = [] if chains else parse_mapping(mapping)
        if self.chain_mapping:
            self.heads = build_head_chains(head_params, build_head)
        else:
            self.heads = nn.ModuleList(
                build_head(index, entry) for index, entry in enumerate(head_params)
            )
        set_head_batch_norms(self.heads, model_cfg.HEAD)
        scale_head_weights(self.heads, model_cfg.HEAD)
        self.output_heads = self._check_output_heads(model_cfg.HEAD.get("OUTPUT_HEADS", [-1]))
        self.feat_pools = nn.ModuleList(pool for _, pool in self.eval_settings.pool_ops)
        check_mapping(self.input_mapping, self.trunk, self.heads)
        self._check_eval_settings()
        if self.eval_settings.freeze_trunk_and_head:
            freeze(self)
        elif self.eval_settings.freeze_trunk_only:
            freeze(self.trunk)
        self.train()

    def _check_output_heads(self, indices) -> List[int]:
        return check_output_heads(indices, len(self.heads))

    def _check_eval_settings(self) -> None:
        stages = self.eval_settings.stages
        if not stages:
            return
        try:
            self.trunk.check_out_feat_keys(stages)
        except ValueError as error:
            raise ValueError(f"{POOL_OPS_MAP}: {error}") from None
        if self.eval_settings.extract_trunk_features_only:
            check_stages_named_once(self.eval_settings.pool_ops)
        if self.eval_settings.heads_per_stage and len(self.heads) not in (0, len(stages)):
            raise ValueError(
                f"MODEL.HEAD.PARAMS has {len(self.heads)} head(s) but {POOL_OPS_MAP} has "
                f"{len(stages)} stage(s) {stages}: with {SETTINGS}.EVAL_MODE_ON every stage "
                "needs its own head, in the same order"
            )

    def train(self, mode: bool = True) -> "BaseSSLMultiInputOutputModel":
        """As ``nn.Module.train``, but frozen parts stay in eval mode (their batch-norm
        statistics do not change)."""
        super().train(mode)
        if self.eval_settings.freeze_trunk_and_head:
            super().train(False)
        elif self.eval_settings.freeze_trunk_only:
            self.trunk.train(False)
        return self

    # ------------------------------------------------------------------ features
    def _stage_output_list(
        self, x: ModelInput, keys: Sequence[str], pools: Optional[Sequence[nn.Module]] = None
    ) -> List[torch.Tensor]:
        """The trunk's ``keys`` stages in order (each through its pool op if given), crops
        concatenated; a stage listed twice gives two entries."""
        batches = [x] if isinstance(x, torch.Tensor) else list(x)
        if not batches or not all(isinstance(batch, torch.Tensor) for batch in batches):
            raise TypeError("the model takes a Tensor or a non-empty list of Tensors")
        per_batch = []
        for batch in batches:
            outputs = self.trunk(batch, keys)
            if pools is not None:
                outputs = apply_pools(keys, pools, outputs, batch.shape[-2:])
            per_batch.append(outputs)
        return [concat_crops(key, [f[i] for f in per_batch]) for i, key in enumerate(keys)]

    def _stage_outputs(
        self, x: ModelInput, keys: Sequence[str], pools: Optional[Sequence[nn.Module]] = None
    ) -> Dict[str, torch.Tensor]:
        """``_stage_output_list`` by stage name (a stage listed twice: its last entry, as
        VISSL's features by name)."""
        return dict(zip(keys, self._stage_output_list(x, keys, pools)))

    def extract_features(
        self, x: ModelInput, out_feat_keys: Optional[Sequence[str]] = None
    ) -> Dict[str, torch.Tensor]:
        """Trunk stage outputs by name (default: the trunk's default output), crops concatenated."""
        return self._stage_outputs(x, self.trunk.check_out_feat_keys(out_feat_keys))

    def pooled_eval_features(self, x: ModelInput) -> Dict[str, torch.Tensor]:
        """The stages of LINEAR_EVAL_FEAT_POOL_OPS_MAP, each through its pool op (not flattened)."""
        return self._stage_outputs(x, self.eval_settings.stages, list(self.feat_pools))

    def forward(self, x: ModelInput) -> List[torch.Tensor]:
        if self.chain_mapping:
            return chain_forward(self.trunk, self.heads, self.chain_mapping, x)
        if isinstance(x, dict):
            return self._forward_named(x)
        if self.eval_settings.heads_per_stage:
            features = [torch.flatten(f, 1) for f in self._stage_output_list(
                x, self.eval_settings.stages, list(self.feat_pools))]
            if not self.heads:
                return features
            with float32_heads(features[0]) as run:
                return flatten_outputs(run(head, run.input(feature))
                                       for head, feature in zip(self.heads, features))
        (output,) = self.extract_features(x).values()
        if not self.heads:
            return [torch.flatten(output, 1)]
        head_outputs = []
        with float32_heads(output) as run:
            output = run.input(output)
            for index, head in enumerate(self.heads):
                if isinstance(output, (list, tuple)):
                    # a head of one output in a list (swav_head with num_clusters: [] gives
                    # [embedding]) feeds the next head that output, as VISSL's heads took it
                    if len(output) != 1:
                        raise ValueError(f"MODEL.HEAD.PARAMS[{index - 1}] gives several "
                                         "outputs: such a head (e.g. swav_head) must be the "
                                         "last one")
                    output = output[0]
                output = run(head, output)
                head_outputs.append(output)
        return flatten_outputs(head_outputs[index] for index in self.output_heads)

    def _forward_named(self, inputs: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        """The heads on the trunk's outputs for MULTI_INPUT_HEAD_MAPPING's inputs."""
        if not self.input_mapping:
            raise ValueError("the model got named inputs (a dict) but "
                             "config.MODEL.MULTI_INPUT_HEAD_MAPPING is empty")
        outputs, extras = mapped_trunk_outputs(self.trunk, self.input_mapping, inputs)
        if not self.heads:
            return outputs
        head_outputs = []
        with float32_heads(outputs[0]) as run:
            output = ([run.input(o) for o in outputs] if len(outputs) > 1
                      else run.input(outputs[0]))
            for head in self.heads:
                keywords = {k: extras[k] for k in head_keywords(head) if k in extras}
                output = run(head, output, **keywords)
                head_outputs.append(output)
        return flatten_outputs(head_outputs[index] for index in self.output_heads)

    def target_copy(self, num_heads: int) -> "BaseSSLMultiInputOutputModel":
        """A frozen copy of the trunk and the first ``num_heads`` heads that outputs the last
        of them: the momentum (target) network of BYOL or MoCo, which has no predictor."""
        target = copy.deepcopy(self)
        target.heads = nn.ModuleList(list(target.heads)[:num_heads])
        target.output_heads = [-1]
        freeze(target)
        return target

    def extract_layer_names(self) -> List[str]:
        """The names ``extract_layers`` returns, in order: trunk stages with
        EXTRACT_TRUNK_FEATURES_ONLY, else "heads" (one output) or "heads0", "heads1", ...; a
        model without heads outputs its trunk's (default or pooled eval) features under those
        names, as VISSL's extraction of a headless model did."""
        settings = self.eval_settings
        if settings.extract_trunk_features_only:
            return list(dict.fromkeys(settings.stages)) or [self.trunk.default_out_feat_key]
        if not self.heads:  # the model's output: the trunk's (VISSL extracted it as "heads")
            num_outputs = len(settings.stages) if settings.heads_per_stage else 1
            return ["heads"] if num_outputs == 1 else [f"heads{i}" for i in range(num_outputs)]
        heads = (list(self.heads) if settings.heads_per_stage
                 else [self.heads[index] for index in self.output_heads])
        num_outputs = sum(getattr(head, "num_outputs", 1) for head in heads)
        return ["heads"] if num_outputs == 1 else [f"heads{i}" for i in range(num_outputs)]

    def extract_layers(self, x: ModelInput) -> Dict[str, torch.Tensor]:
        """Named features for extraction (see ``extract_layer_names``); flattened to [N, D] with
        SHOULD_FLATTEN_FEATS.  Call it under ``torch.no_grad()`` in eval mode."""
        names = self.extract_layer_names()
        if not self.eval_settings.extract_trunk_features_only:
            layers = dict(zip(names, self.forward(x)))
        elif self.eval_settings.stages:
            layers = self.pooled_eval_features(x)
        else:
            layers = self.extract_features(x, names)
        if self.eval_settings.should_flatten_feats:
            layers = {name: torch.flatten(feature, 1) for name, feature in layers.items()}
        return layers

    # ------------------------------------------------------------------ state
    def get_classy_state(self) -> dict:
        return {"model": {"trunk": self.trunk.state_dict(), "heads": self.heads.state_dict()}}

    def set_classy_state(self, state: dict) -> None:
        """Load a ``get_classy_state()`` dict; any missing, extra or reshaped key raises."""
        model_state = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model_state, dict) or set(model_state) != {"trunk", "heads"}:
            found = sorted(model_state) if isinstance(model_state, dict) else sorted(state or {})
            raise ValueError(
                "model state must be {'model': {'trunk': ..., 'heads': ...}}, "
                f"found keys {found}"
            )
        load_state_dict_strict(self.trunk, model_state["trunk"], "trunk")
        load_state_dict_strict(self.heads, model_state["heads"], "heads")


def build_model(model_cfg) -> BaseSSLMultiInputOutputModel:
    """The SSL model described by ``cfg.MODEL``."""
    return BaseSSLMultiInputOutputModel(model_cfg)


def check_trainable(model: BaseSSLMultiInputOutputModel) -> None:
    """ValueError when no parameter of ``model`` requires gradients (a training run would have
    nothing to optimize), naming the MODEL.FEATURE_EVAL_SETTINGS that froze it."""
    if any(param.requires_grad for param in model.parameters()):
        return
    settings, key = model.eval_settings, f"config.{SETTINGS}"
    if settings.freeze_trunk_and_head:
        why = f"{key}.FREEZE_TRUNK_AND_HEAD=true freezes the whole model"
    elif settings.trunk_only:
        why = (f"{key}.FREEZE_TRUNK_ONLY=true freezes the trunk, and EVAL_MODE_ON=true with "
               "EXTRACT_TRUNK_FEATURES_ONLY=true builds no head (a trunk feature extractor, for "
               "engine_name=extract_features): set EXTRACT_TRUNK_FEATURES_ONLY=false to train "
               "the heads of config.MODEL.HEAD.PARAMS")
    elif settings.freeze_trunk_only:
        why = (f"{key}.FREEZE_TRUNK_ONLY=true freezes the trunk, and config.MODEL.HEAD.PARAMS "
               "has no head")
    else:
        why = "the model has no parameter"
    raise ValueError(f"nothing to train: no parameter of the model requires gradients ({why})")


def check_model_config(model_cfg) -> Optional[BaseSSLMultiInputOutputModel]:
    """Before launch: build the model on the meta device (no memory, no weights), so that every
    setting the model refuses (trunk settings, heads, the stages and pool ops of
    MODEL.FEATURE_EVAL_SETTINGS, the heads it evaluates) raises its ValueError here rather than
    in every process. Returns the model, for checks that need its layers; None when a trunk or
    head cannot be built on the meta device (one that reads tensor values while it is built):
    the processes then check as they build it."""
    try:
        with torch.device("meta"):
            return build_model(model_cfg)
    except (NotImplementedError, RuntimeError):  # meta tensors hold no values
        return None
