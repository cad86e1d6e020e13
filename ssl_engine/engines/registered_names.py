"""Before launch: every component the config names by a string is registered.

Collators, transforms, data sources, the trunk, heads, loss, optimizer, param schedulers,
meters, the train step, the task and the engine are looked up in their registries here, in
the launching process, after ``$SSL_ENGINE_PLUGINS`` were imported (so the user's own
components count). An unknown name is refused with one line: the key, the value and the
closest registered name. Called by ``ssl_engine.engines.prelaunch``.
"""
import difflib
import os
from typing import Callable, Dict, Iterable, Iterator, List, Tuple

from ssl_engine.data import COLLATOR_REGISTRY, DATASOURCE_REGISTRY
from ssl_engine.data.transforms import known_transforms
from ssl_engine.engines.registry import ENGINE_REGISTRY
from ssl_engine.losses import LOSS_REGISTRY
from ssl_engine.meters import METER_REGISTRY
from ssl_engine.models import MODEL_HEADS, MODEL_TRUNKS
from ssl_engine.optimizers.param_schedulers import param_scheduler_names
from ssl_engine.optimizers.ssl_optimizer import optimizer_names
from ssl_engine.trainer.train_steps import TRAIN_STEP_REGISTRY
from ssl_engine.utils.classy import TASK_REGISTRY
from ssl_engine.utils.errors import ConfigError

MAX_LISTED = 15  # registries longer than this (transforms) are not listed in the message

NameRef = Tuple[str, object]  # (the key as the user writes it, the name it holds)


def _registries() -> Dict[str, Tuple[str, Callable[[], Iterable[str]]]]:
    """kind -> (its plural for messages, a function giving its registered names)."""
    return {
        "collator": ("collators", COLLATOR_REGISTRY.names),
        "transform": ("transforms", known_transforms),
        "data source": ("data sources", DATASOURCE_REGISTRY.names),
        "model trunk": ("trunks", MODEL_TRUNKS.names),
        "model head": ("heads", MODEL_HEADS.names),
        "loss": ("losses", lambda: LOSS_REGISTRY),
        "optimizer": ("optimizers", optimizer_names),
        "param scheduler": ("param schedulers", param_scheduler_names),
        "meter": ("meters", lambda: METER_REGISTRY),
        "train step": ("train steps", TRAIN_STEP_REGISTRY.names),
        "task": ("tasks", lambda: TASK_REGISTRY),
        "engine": ("engines", ENGINE_REGISTRY.names),
    }


def _scheduler_refs(key: str, scheduler) -> Iterator[NameRef]:
    if not isinstance(scheduler, dict) or scheduler.get("name") is None:
        return  # weight_decay's name: null means a constant weight decay
    yield f"{key}.name", scheduler["name"]
    for index, sub in enumerate(scheduler.get("schedulers") or []):
        yield from _scheduler_refs(f"{key}.schedulers[{index}]", sub)


def _head_refs(entries, key: str) -> Iterator[NameRef]:
    for index, entry in enumerate(entries or []):
        if isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], str):
            yield f"{key}[{index}][0]", entry[0]
        elif isinstance(entry, (list, tuple)):  # a chain of heads (MULTI_INPUT_HEAD_MAPPING)
            yield from _head_refs(entry, f"{key}[{index}]")


def named_components(engine_name: str, cfg) -> Iterator[Tuple[str, str, object]]:
    """(kind, key, name) of every registered name ``cfg`` refers to, in config order."""
    for split in ("TRAIN", "TEST"):
        data, prefix = cfg.DATA[split], f"config.DATA.{split}"
        for index, source in enumerate(data.DATA_SOURCES or []):
            yield "data source", f"{prefix}.DATA_SOURCES[{index}]", source
        for index, spec in enumerate(data.TRANSFORMS or []):
            if isinstance(spec, dict) and "name" in spec:
                yield "transform", f"{prefix}.TRANSFORMS[{index}].name", spec["name"]
        yield "collator", f"{prefix}.COLLATE_FUNCTION", data.COLLATE_FUNCTION
    yield "model trunk", "config.MODEL.TRUNK.NAME", cfg.MODEL.TRUNK.NAME
    for key, name in _head_refs(cfg.MODEL.HEAD.PARAMS, "config.MODEL.HEAD.PARAMS"):
        yield "model head", key, name
    yield "loss", "config.LOSS.name", cfg.LOSS.name
    yield "optimizer", "config.OPTIMIZER.name", cfg.OPTIMIZER.name
    for which, scheduler in (cfg.OPTIMIZER.param_schedulers or {}).items():
        for key, name in _scheduler_refs(f"config.OPTIMIZER.param_schedulers.{which}", scheduler):
            yield "param scheduler", key, name
    for index, name in enumerate(cfg.METERS.names or []):
        yield "meter", f"config.METERS.names[{index}]", name
    yield "train step", "config.TRAINER.TRAIN_STEP_NAME", cfg.TRAINER.TRAIN_STEP_NAME
    yield "task", "config.TRAINER.TASK_NAME", cfg.TRAINER.TASK_NAME
    yield "engine", "engine_name", engine_name


def nearest_registered(name: str, known: List[str]) -> str:
    """The registered name most like ``name`` (always one, when any is registered): string
    similarity plus the share of ``name`` its common prefix covers, case ignored, so that
    ``sgd_fsdp`` gives ``sgd`` and ``default_collator`` gives ``default``."""
    wanted = str(name).lower()

    def score(candidate: str) -> float:
        other = candidate.lower()
        prefix = len(os.path.commonprefix([wanted, other]))
        return difflib.SequenceMatcher(None, wanted, other).ratio() + prefix / max(len(wanted), 1)

    return max(known, key=lambda candidate: (score(candidate), candidate), default="")


def unknown_name_message(kind: str, plural: str, key: str, name, known: List[str]) -> str:
    message = f"{key}={name}: no {kind} is registered under this name"
    suggestion = nearest_registered(name, known)
    if suggestion:
        message += f"; the closest registered one is '{suggestion}'"
    if len(known) <= MAX_LISTED:
        message += f" (registered {plural}: {', '.join(known) or 'none'})"
    return message


def check_registered_names(engine_name: str, cfg) -> None:
    """ConfigError (one line) for the first name in ``cfg`` that no registry knows."""
    registries, known = _registries(), {}
    for kind, key, name in named_components(engine_name, cfg):
        plural, names = registries[kind]
        if kind not in known:
            known[kind] = sorted(names())
        if name not in known[kind]:
            raise ConfigError(unknown_name_message(kind, plural, key, name, known[kind]))
