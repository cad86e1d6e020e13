"""VISSL's FSDP component names (``regnet_fsdp``, ``swav_head_fsdp``, ``sgd_fsdp`` ...), read as
the engine's ordinary components.

VISSL builds these variants with fairscale's FSDP wrappers already inside them. The engine
shards a model after it is built (``self_supervision_fsdp_task``: torch's FSDP2, by trunk stage
or block, each head, the rest), so each name here builds the ordinary module: the same
parameters under the same names, and checkpoints that load into either spelling.

Outside the FSDP task the ordinary module runs replicated (DDP), as VISSL's FSDP variants can
run outside its FSDP task too (feature extraction of a frozen model, for one); training with
such a name and another task is warned about before launch.
"""
import functools
import logging
from typing import Dict, Iterator, Tuple

from ssl_engine.models.registry import MODEL_HEADS, MODEL_TRUNKS

logger = logging.getLogger(__name__)

FSDP_TASK = "self_supervision_fsdp_task"

FSDP_TRUNKS: Dict[str, str] = {
    "regnet_fsdp": "regnet",
    "vision_transformer_fsdp": "vision_transformer",
    # registered by trunks/xcit.py: VISSL's FSDP XCiT has NUM_LAYERS class-attention blocks
    "xcit_fsdp": "xcit",
}
FSDP_HEADS: Dict[str, str] = {
    "mlp_fsdp": "mlp",
    "eval_mlp_fsdp": "eval_mlp",
    "swav_head_fsdp": "swav_head",
    "dino_head_fsdp": "dino_head",
}
# VISSL's sgd_fsdp is SGD whose LARC computes norms over sharded parameters: the engine's LARC
# does so for every optimizer (optimizers/larc.py), so it is SGD
FSDP_OPTIMIZERS: Dict[str, str] = {"sgd_fsdp": "sgd"}


def ordinary_builder(kind: str, fsdp_name: str, ordinary_name: str, ordinary):
    """A callable registered under ``fsdp_name`` that builds ``ordinary`` (logging it) and
    offers its ``check_config`` and ``derive_config``."""

    @functools.wraps(ordinary, updated=())
    def build(*args, **kwargs):
        logger.info("%s %s: built as the ordinary %s (the same parameters and names; "
                    "TRAINER.TASK_NAME=%s shards it)", kind, fsdp_name, ordinary_name, FSDP_TASK)
        return ordinary(*args, **kwargs)

    for member in ("check_config", "derive_config"):
        if getattr(ordinary, member, None) is not None:
            setattr(build, member, getattr(ordinary, member))
    return build


def register_fsdp_names() -> None:
    """Register every FSDP trunk and head name as its ordinary component (idempotent)."""
    for registry, names, kind in ((MODEL_TRUNKS, FSDP_TRUNKS, "trunk"),
                                  (MODEL_HEADS, FSDP_HEADS, "head")):
        for fsdp_name, ordinary_name in names.items():
            if fsdp_name not in registry:
                registry.register(fsdp_name)(ordinary_builder(
                    kind, fsdp_name, ordinary_name, registry.get(ordinary_name)))


def fsdp_names_in(cfg) -> Iterator[Tuple[str, str]]:
    """(key, name) of every FSDP component name ``cfg`` uses."""
    if cfg.MODEL.TRUNK.NAME in FSDP_TRUNKS:
        yield "config.MODEL.TRUNK.NAME", cfg.MODEL.TRUNK.NAME
    for index, entry in enumerate(cfg.MODEL.HEAD.PARAMS or []):
        if isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], str) \
                and entry[0] in FSDP_HEADS:
            yield f"config.MODEL.HEAD.PARAMS[{index}][0]", entry[0]
    if cfg.OPTIMIZER.name in FSDP_OPTIMIZERS:
        yield "config.OPTIMIZER.name", cfg.OPTIMIZER.name


def warn_fsdp_names_without_fsdp_task(engine_name: str, cfg) -> bool:
    """Before launch: a training run naming FSDP components under another task is warned that
    its model is replicated, not sharded. True when warned."""
    if engine_name != "train" or cfg.TRAINER.TASK_NAME == FSDP_TASK:
        return False
    used = [f"{key}={name}" for key, name in fsdp_names_in(cfg)]
    if not used:
        return False
    logger.warning("%s: with config.TRAINER.TASK_NAME=%s these build the ordinary components, "
                   "replicated on every process (not sharded); set "
                   "config.TRAINER.TASK_NAME=%s to shard the model",
                   ", ".join(used), cfg.TRAINER.TASK_NAME, FSDP_TASK)
    return True
