"""MODEL.WEIGHTS_INIT: start a model from a checkpoint of this engine or VISSL, or a plain
state dict.

A checkpoint's model state (``classy_state_dict -> base_model -> model -> {trunk, heads}``, of
this engine or of VISSL) maps onto the model's ``state_dict()`` keys ("trunk.<k>", "heads.<k>")
by itself: as in VISSL, REMOVE_PREFIX and APPEND_PREFIX are not applied to it.  The keys of a
plain state dict are mapped by REMOVE_PREFIX, then APPEND_PREFIX.  Either way VISSL's names
(``trunk._feature_blocks.<k>``, ``trunk.base_model._feature_blocks.<k>``, an eval_mlp's
``clf.clf.``) are then read as this engine's (``formats``).  Keys containing a
SKIP_LAYERS string, in this engine's or VISSL's spelling, are not loaded.  Model keys the file
lacks keep their initial values (e.g. the linear-evaluation heads of a pretraining checkpoint)
and are reported, as are file keys the model lacks.
"""
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Union

import torch
from torch import nn

from ssl_engine.checkpoint.formats import (FEATURE_BLOCKS, model_key_from_vissl, model_key_prefix,
                                          model_key_to_vissl)
from ssl_engine.checkpoint.io import load_checkpoint
from ssl_engine.checkpoint.layouts import adapt_to_model

logger = logging.getLogger(__name__)

WHERE = "MODEL.WEIGHTS_INIT"
MAX_LOGGED_NAMES = 10


class WeightsInitError(ValueError):
    """The weights file does not fit: not a state dict, no matching key, other shapes."""


@dataclass
class WeightsInitReport:
    """What ``load_weights_init`` did with every key, in file (or model) order."""

    params_file: str
    loaded: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"weights init from {self.params_file}:"]
        for title in ("loaded", "skipped", "missing", "unexpected"):
            names = getattr(self, title)
            shown = ", ".join(names[:MAX_LOGGED_NAMES])
            hidden = len(names) - MAX_LOGGED_NAMES
            more = f", ... ({hidden} more)" if hidden > 0 else ""
            lines.append(f"  {title} {len(names)}" + (f": {shown}{more}" if names else ""))
        return "\n".join(lines)


def _is_tensor_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and all(torch.is_tensor(v) for v in obj.values())


def _unnest(state: Any) -> Any:
    for key in ("base_model", "model"):
        if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
            state = state[key]
    return state


def is_model_state(state: Any) -> bool:
    """Whether ``state`` is (or holds under base_model/model) a ``{trunk, heads}`` model state."""
    state = _unnest(state)
    return isinstance(state, Mapping) and {"trunk", "heads"} <= set(state) and all(
        _is_tensor_dict(state[part]) for part in ("trunk", "heads"))


def flatten_engine_state(state: Mapping[str, Any], path: Any = "the file",
                         key_name: str = "") -> Dict[str, torch.Tensor]:
    """A state dict of tensors from either a plain state dict or a model state of this engine
    or VISSL (``{base_model: {model: {trunk, heads}}}`` or any part of it) as
    "trunk.<k>"/"heads.<k>". ``path`` and ``key_name`` (the STATE_DICT_KEY_NAME used) only word
    the error."""
    if is_model_state(state):
        state = _unnest(state)
        return {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in state[part].items()}
    if not _is_tensor_dict(state):
        if isinstance(state, Mapping):
            found = f"its keys: {[str(k) for k in list(state)[:MAX_LOGGED_NAMES]]}"
        else:
            found = f"it holds a {type(state).__name__}"
        under = f" under STATE_DICT_KEY_NAME '{key_name}'" if key_name else ""
        raise WeightsInitError(
            f"{WHERE}: {path} holds neither a state dict of tensors nor this engine's model "
            f"state{under} ({found}); set config.{WHERE}.STATE_DICT_KEY_NAME to the key that "
            "holds the weights (e.g. state_dict, model), or to '' for a plain state dict"
        )
    return dict(state)


def _nested_entry(contents: Any, key_name: Union[str, Sequence[str]]) -> Any:
    """``contents[key_name]``, or for a dotted name not among the file's keys the entry at
    that path (``classy_state_dict.ema_model``: the average of HOOKS.EMA_MODEL), or for a list
    of keys (VISSL's form, e.g. ``[loss, teacher]``) the entry at that path; None if absent."""
    if not key_name or not isinstance(contents, Mapping):
        return None
    if isinstance(key_name, str) and key_name in contents:
        return contents[key_name]
    parts = key_name.split(".") if isinstance(key_name, str) else [str(p) for p in key_name]
    for part in parts:
        if not isinstance(contents, Mapping) or part not in contents:
            return None
        contents = contents[part]
    return contents


def read_state(weights_cfg: Mapping[str, Any], mmap: bool = False,
               vissl_prefix: str = FEATURE_BLOCKS) -> Dict[str, torch.Tensor]:
    """The file's state dict in the model's key names: a model state's keys as they are, a
    plain state dict's mapped by REMOVE_PREFIX then APPEND_PREFIX; VISSL's names (the trunk's
    ``vissl_prefix``, ``base_model.``, eval_mlp's ``clf.clf.``) then read as this engine's.
    ``mmap=True`` maps the tensors instead of reading them (for checks)."""
    path = Path(str(weights_cfg.get("PARAMS_FILE")))
    if not path.is_file():
        what = "is a folder, not a weights file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"{WHERE}.PARAMS_FILE {path} {what}")
    contents = load_checkpoint(path, mmap=mmap)
    key_name = weights_cfg.get("STATE_DICT_KEY_NAME") or ""
    if not isinstance(key_name, str):  # VISSL's list of keys: a path into the file
        key_name = list(key_name)
    used_key = ""
    nested = _nested_entry(contents, key_name)
    if nested is not None:
        contents, used_key = nested, key_name if isinstance(key_name, str) else ".".join(key_name)
    elif key_name:
        logger.info("%s: %s has no key '%s'; using the whole file as the state dict",
                    WHERE, path, key_name)
    state = flatten_engine_state(contents, path, used_key)
    remove, append = weights_cfg.get("REMOVE_PREFIX") or "", weights_cfg.get("APPEND_PREFIX") or ""
    if is_model_state(contents):
        if remove or append:
            logger.info("%s: %s holds a model state (trunk and heads): REMOVE_PREFIX and "
                        "APPEND_PREFIX are not applied to it", WHERE, path)
        remove = append = ""
    mapped = {}
    for key, value in state.items():
        if remove and key.startswith(remove):
            key = key[len(remove):]
        mapped[model_key_from_vissl(append + key, vissl_prefix)] = value
    return mapped


def check_weights_file(weights_cfg: Mapping[str, Any]) -> None:
    """Before launch: PARAMS_FILE (when set) exists, loads weights-only and holds a state
    dict of tensors (under STATE_DICT_KEY_NAME, or as a whole). Raises FileNotFoundError,
    CheckpointError (unreadable, or refused as unsafe) or WeightsInitError."""
    if weights_cfg.get("PARAMS_FILE"):
        read_state(weights_cfg, mmap=True)


HEADS = "heads."
EVAL_TRUNK_AND_HEAD = "MODEL.FEATURE_EVAL_SETTINGS.EVAL_TRUNK_AND_HEAD"


def _skipped_by(key: str, skip_layers: Sequence[str], prefix: str) -> bool:
    return any(pattern in key or pattern in model_key_to_vissl(key, prefix)
               for pattern in skip_layers)


def check_heads_in_file(model: nn.Module, weights_cfg: Mapping[str, Any]) -> None:
    """Before an extraction of the heads' outputs: every head tensor of ``model`` (built on the
    meta device will do) is in PARAMS_FILE, else the features would come out of partly random
    heads (WeightsInitError naming the tensors). Head tensors SKIP_LAYERS names are accepted:
    the user asked for them to stay at their initial values."""
    settings = getattr(model, "eval_settings", None)
    heads = getattr(model, "heads", None)
    if (not weights_cfg.get("PARAMS_FILE") or not heads
            or settings is None or settings.extract_trunk_features_only):
        return
    prefix = model_key_prefix(model)
    state = read_state(weights_cfg, mmap=True, vissl_prefix=prefix)
    skip_layers = [str(s) for s in weights_cfg.get("SKIP_LAYERS") or [] if str(s)]
    missing = [key for key in model.state_dict() if key.startswith(HEADS) and key not in state
               and not key.endswith("num_batches_tracked")
               and not _skipped_by(key, skip_layers, prefix)]
    if missing:
        layers = list(dict.fromkeys(key.rsplit(".", 1)[0] for key in missing))
        shown = ", ".join(missing[:MAX_LOGGED_NAMES])
        hidden = len(missing) - MAX_LOGGED_NAMES
        more = f", ... ({hidden} more)" if hidden > 0 else ""
        raise WeightsInitError(
            f"config.{WHERE}.PARAMS_FILE={weights_cfg.get('PARAMS_FILE')} lacks {len(missing)} "
            f"head tensor(s) of the model ({shown}{more}): the extracted features would come "
            "out of partly random heads. Give config.MODEL.HEAD.PARAMS the heads the file was "
            "trained with, extract the trunk's features "
            "(config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true), or keep "
            f"those layers at their initial values with config.{WHERE}.SKIP_LAYERS="
            f"[{', '.join(skip_layers + layers)}]")


def _check_heads_loaded(report: WeightsInitReport, targets: Mapping[str, torch.Tensor]) -> None:
    """EVAL_TRUNK_AND_HEAD: every head tensor of the model comes from the file."""
    loaded = set(report.loaded)
    # a batch norm's step counter is no weight (SKIP_LAYERS leaves it out by default)
    missing = [key for key in targets if key.startswith(HEADS) and key not in loaded
               and not key.endswith("num_batches_tracked")]
    if missing:
        shown = ", ".join(missing[:MAX_LOGGED_NAMES])
        raise WeightsInitError(
            f"config.{EVAL_TRUNK_AND_HEAD}=true evaluates the heads with the weights of "
            f"{report.params_file}, but {len(missing)} head tensor(s) are not loaded from it "
            f"(absent, skipped or reshaped): {shown}; give config.MODEL.HEAD.PARAMS the heads "
            f"the file was trained with, or set {EVAL_TRUNK_AND_HEAD}=false to evaluate new "
            "heads on the loaded trunk")


def load_weights_init(model: nn.Module, weights_cfg: Mapping[str, Any]) -> WeightsInitReport:
    """Copy the matching tensors of ``weights_cfg["PARAMS_FILE"]`` into ``model`` and report.

    ``weights_cfg`` is MODEL.WEIGHTS_INIT (missing keys: no prefixes, no skipped layers).

    Raises FileNotFoundError for a missing file, CheckpointError for one that cannot be loaded
    weights-only, WeightsInitError (a ValueError) when the file is no state dict, when a key
    has another shape in the file than in the model (naming the key and both shapes) or when
    no key matched at all.

    The model's MODEL.FEATURE_EVAL_SETTINGS (``model.eval_settings``) adds two checks:
    EVAL_TRUNK_AND_HEAD=true requires every head tensor to come from the file (the heads are
    evaluated with the file's weights); ASSERT_HEAD_LAYER_SHAPE_INIT=false leaves head keys of
    another shape at their initial values (reported as skipped) instead of refusing the file.
    """
    if not weights_cfg.get("PARAMS_FILE"):
        raise WeightsInitError(f"{WHERE}.PARAMS_FILE is empty: nothing to load")
    prefix = model_key_prefix(model)
    state, layout = adapt_to_model(read_state(weights_cfg, vissl_prefix=prefix), model)
    if layout:  # a timm, torchvision or VISSL ViT file, named from its keys
        logger.info("%s: %s is in the %s layout: read as the trunk's keys", WHERE,
                    weights_cfg.get("PARAMS_FILE"), layout)
    skip_layers = [str(s) for s in weights_cfg.get("SKIP_LAYERS") or [] if str(s)]
    targets = model.state_dict()
    report = WeightsInitReport(str(weights_cfg.get("PARAMS_FILE")))
    report.missing = [key for key in targets if key not in state]
    for key in state:
        if _skipped_by(key, skip_layers, prefix):
            report.skipped.append(key)
        elif key in targets:
            report.loaded.append(key)
        else:
            report.unexpected.append(key)

    settings = getattr(model, "eval_settings", None)
    if settings is not None and not settings.assert_head_layer_shape_init:
        # FEATURE_EVAL_SETTINGS.ASSERT_HEAD_LAYER_SHAPE_INIT=false: reshaped head keys are
        # left at their initial values instead of refused
        reshaped_heads = [key for key in report.loaded if key.startswith(HEADS)
                          and tuple(state[key].shape) != tuple(targets[key].shape)]
        for key in reshaped_heads:
            logger.info("%s: %s has shape %s in the file and %s in the model: not loaded "
                        "(ASSERT_HEAD_LAYER_SHAPE_INIT=false)", WHERE, key,
                        tuple(state[key].shape), tuple(targets[key].shape))
        report.loaded = [key for key in report.loaded if key not in reshaped_heads]
        report.skipped += reshaped_heads
    if settings is not None and settings.eval_trunk_and_head:
        _check_heads_loaded(report, targets)
    reshaped = [
        f"{key}: file {tuple(state[key].shape)} vs model {tuple(targets[key].shape)}"
        for key in report.loaded
        if tuple(state[key].shape) != tuple(targets[key].shape)
    ]
    if reshaped:
        raise WeightsInitError(
            f"{WHERE}: {report.params_file} does not fit the model; shape mismatches "
            f"({len(reshaped)}): " + "; ".join(reshaped)
            + " (use SKIP_LAYERS to leave such keys out)"
        )
    if not report.loaded:
        raise WeightsInitError(
            f"{WHERE}: no key of {report.params_file} matches the model. File keys (after "
            f"prefixes): {list(state)[:5]}; model keys: {list(targets)[:5]}; "
            "set APPEND_PREFIX / REMOVE_PREFIX (e.g. APPEND_PREFIX=trunk. for a torchvision file)"
        )
    with torch.no_grad():
        for key in report.loaded:
            targets[key].copy_(state[key])
    logger.info(report.summary())
    return report
