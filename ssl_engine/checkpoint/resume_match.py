"""Whether the checkpoint a run resumes from is a run of the model, method and task its config
trains, checked before launch (``check_resume_files``): a resume with another loss, another
trunk, a model of other shapes (a depth, a width, a head) or the other of the DDP and FSDP
tasks is refused in one line naming what differs, with the checkpoint's value and the config's,
instead of failing in every process once launched.

What differs is found in this order, the first difference being the one reported:
1. ``LOSS.name`` and ``MODEL.TRUNK.NAME``, read from the config a checkpoint of this engine is
   saved with (``config``); names registered for the same class count as the same;
2. the task: the FSDP task (``trainer/fsdp_task.py``) keeps the model and optimizer state in a
   ``<checkpoint>.sharded`` folder, which its checkpoint names in
   ``classy_state_dict -> optimizer -> sharded_checkpoint``; the DDP task keeps its optimizer
   state in the checkpoint itself. A task that writes the sharded folder (it has
   ``save_sharded``) resumes the first kind only, any other task the second only;
3. the model: the names and shapes of its tensors, built on the meta device
   (``check_model_config``), against the checkpoint's (mapped, not read), as the resume loads
   them; the MODEL.TRUNK and MODEL.HEAD settings that differ from the checkpoint's config are
   named with the first tensor that differs.

Everything else may change on a resume and is not compared: the number of processes, batch
sizes, epochs, data, the optimizer's and the schedules' settings, AMP, workers ...
"""
from pathlib import Path
from typing import Any, Iterator, List, Mapping, Optional, Tuple

from ssl_engine.checkpoint.formats import model_state_of
from ssl_engine.checkpoint.io import CheckpointError
from ssl_engine.models.base_ssl_model import check_model_config
from ssl_engine.models.registry import MODEL_TRUNKS
from ssl_engine.utils.classy import LOSS_REGISTRY, TASK_REGISTRY

SHARDED_STATE_KEY = "sharded_checkpoint"  # written by the FSDP task's get_classy_state
MODEL_SETTINGS = ("TRUNK", "HEAD")  # the MODEL sections named when the model differs
MAX_SETTINGS = 3  # differing settings named; the count says how many more there are

START_OVER = ("pick another config.CHECKPOINT.DIR for this config, or start over in it with "
              "config.CHECKPOINT.AUTO_RESUME=false config.CHECKPOINT.OVERWRITE_EXISTING=true")


def check_resume_match(cfg, checkpoint: Mapping[str, Any]) -> None:
    """Refuse (CheckpointError) a checkpoint of this engine that ``cfg`` cannot resume: another
    loss, trunk, task (DDP / FSDP) or model shapes than the config's."""
    saved = checkpoint.get("config")
    saved = saved if isinstance(saved, Mapping) else {}
    folder = f"config.CHECKPOINT.DIR={cfg.CHECKPOINT.DIR}"
    _check_name(folder, "loss", "LOSS.name", _get(saved, "LOSS.name"), cfg.LOSS.name,
                LOSS_REGISTRY.get)
    _check_name(folder, "trunk", "MODEL.TRUNK.NAME", _get(saved, "MODEL.TRUNK.NAME"),
                cfg.MODEL.TRUNK.NAME, _trunk_class)
    _check_task(cfg, folder, checkpoint, _get(saved, "TRAINER.TASK_NAME"))
    _check_model(cfg, folder, checkpoint, saved)


def _refusal(what: str, resume_with: str) -> CheckpointError:
    return CheckpointError(f"{what}: resume it with {resume_with}, {START_OVER}")


def _get(saved: Mapping[str, Any], path: str) -> Any:
    """The value at ``A.B.C`` of a saved config, None where it has none."""
    value: Any = saved
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _trunk_class(name: str):
    return MODEL_TRUNKS.get(name) if name in MODEL_TRUNKS.names() else None


def _check_name(folder: str, what: str, key: str, saved: Any, current: str, component) -> None:
    """Refuse a saved component name other than ``current`` (unless both name one class)."""
    if saved is None or saved == current:
        return
    saved_class = component(saved)
    if saved_class is not None and saved_class is component(current):
        return
    raise _refusal(f"{folder} holds a run of {what} {saved}, and this config trains {current}",
                   f"the config it was trained with (config.{key}={saved})")


# ------------------------------------------------------------------ the task: DDP or FSDP
def saved_sharded_state(checkpoint: Mapping[str, Any]) -> Optional[str]:
    """The name of the folder holding a checkpoint's sharded model and optimizer state (FSDP),
    None for a checkpoint that holds its optimizer state itself (DDP)."""
    state = checkpoint.get("classy_state_dict")
    optimizer = state.get("optimizer") if isinstance(state, Mapping) else None
    return optimizer.get(SHARDED_STATE_KEY) if isinstance(optimizer, Mapping) else None


def _task_kind(sharded: bool) -> str:
    return "FSDP" if sharded else "DDP"


def _check_task(cfg, folder: str, checkpoint: Mapping[str, Any], saved_task: Any) -> None:
    task_class = TASK_REGISTRY.get(cfg.TRAINER.TASK_NAME)
    if task_class is None:  # an unknown task is refused before this check
        return
    shards = getattr(task_class, "save_sharded", None) is not None
    sharded = saved_sharded_state(checkpoint)
    if shards != bool(sharded):
        saved_kind = _task_kind(bool(sharded))
        held = (f"its model and optimizer state sharded in {sharded}" if sharded
                else "its optimizer state in the checkpoint, no sharded folder")
        saved_name = f" {saved_task}" if saved_task else ""
        raise _refusal(
            f"{folder} holds a run of the {saved_kind} task{saved_name} ({held}), and this "
            f"config trains with the {_task_kind(shards)} task {cfg.TRAINER.TASK_NAME}",
            f"config.TRAINER.TASK_NAME={saved_task}" if saved_task
            else f"a {saved_kind} task (config.TRAINER.TASK_NAME)")
    if sharded and not (Path(cfg.CHECKPOINT.DIR) / sharded).is_dir():
        raise CheckpointError(
            f"the latest checkpoint of {folder} keeps its model and optimizer state in the "
            f"folder {sharded} beside it, which is missing: the checkpoint cannot be resumed "
            f"without it; {START_OVER}")


# ------------------------------------------------------------------ the model's tensors
def _shape(tensor: Any) -> Tuple[int, ...]:
    return tuple(getattr(tensor, "shape", ()))


def _tensor_differences(model_state: Mapping[str, Mapping[str, Any]],
                        saved_state: Mapping[str, Any]) -> List[str]:
    """Every tensor of the model that the checkpoint lacks or holds in another shape, then
    every tensor of the checkpoint that the model lacks, in the model's order."""
    differences, extra = [], []
    for part in ("trunk", "heads"):
        expected, saved = model_state[part], saved_state.get(part) or {}
        for key, tensor in expected.items():
            if key not in saved:
                differences.append(f"{part}.{key} {_shape(tensor)} only in this config's model")
            elif _shape(saved[key]) != _shape(tensor):
                differences.append(f"{part}.{key}: {_shape(saved[key])} in the checkpoint, "
                                   f"{_shape(tensor)} in this config's model")
        extra += [f"{part}.{key} {_shape(saved[key])} only in the checkpoint"
                  for key in saved if key not in expected]
    return differences + extra


def _tensors_said(differences: List[str]) -> str:
    if len(differences) == 1:
        return f"1 tensor differs, {differences[0]}"
    return f"{len(differences)} tensors differ, the first {differences[0]}"


def _differences(saved: Any, current: Any, path: str) -> Iterator[Tuple[str, Any, Any]]:
    """(path, saved value, current value) of the settings that differ: mappings compared key by
    key (keys the saved one lacks are not compared), lists of the same length that hold
    mappings or lists item by item, anything else as a whole."""
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        for key, value in current.items():
            if key in saved:
                yield from _differences(saved[key], value, f"{path}.{key}")
    elif (isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple))
          and len(saved) == len(current)
          and any(isinstance(v, (Mapping, list, tuple)) for v in [*saved, *current])):
        for index, (old, new) in enumerate(zip(saved, current)):
            yield from _differences(old, new, f"{path}[{index}]")
    elif _plain(saved) != _plain(current):
        yield path, saved, current


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _override(value: Any) -> str:
    """``value`` as a command-line override writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{_override(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override(item) for item in value) + "]"
    return str(value)


def setting_differences(saved: Mapping[str, Any], model_cfg) -> List[Tuple[str, Any, Any]]:
    """(key, saved value, config value) of the MODEL.TRUNK and MODEL.HEAD settings that differ
    from a saved config's (settings it does not have are not compared)."""
    differences = []
    for section in MODEL_SETTINGS:
        saved_section = _get(saved, f"MODEL.{section}")
        if isinstance(saved_section, Mapping):
            differences += _differences(saved_section, model_cfg[section],
                                        f"config.MODEL.{section}")
    return differences


def _count(items: List[Any], shown: int, what: str) -> str:
    more = len(items) - shown
    return f" (and {more} more {what})" if more > 0 else ""


def _check_model(cfg, folder: str, checkpoint: Mapping[str, Any],
                 saved: Mapping[str, Any]) -> None:
    model = check_model_config(cfg.MODEL)
    if model is None:  # not built on the meta device: the processes compare as they load
        return
    saved_state = model_state_of(checkpoint, f"the latest checkpoint of {folder}")
    tensors = _tensor_differences(model.get_classy_state()["model"], saved_state)
    if not tensors:
        return
    settings = setting_differences(saved, cfg.MODEL)
    if not settings:
        raise _refusal(f"{folder} holds a run of another model ({_tensors_said(tensors)})",
                       "the model settings it was trained with")
    named = settings[:MAX_SETTINGS]
    said = "; ".join(f"{key} is {_override(old)} there and {_override(new)} here"
                     for key, old, new in named) + _count(settings, len(named), "settings")
    as_overrides = len(settings) <= MAX_SETTINGS and all("[" not in key for key, _, _ in settings)
    resume_with = (" ".join(f"{key}={_override(old)}" for key, old, _ in settings)
                   if as_overrides else "the model settings it was trained with")
    raise _refusal(f"{folder} holds a run of another model ({said}; {_tensors_said(tensors)})",
                   resume_with)
