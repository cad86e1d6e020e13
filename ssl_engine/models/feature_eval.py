"""MODEL.FEATURE_EVAL_SETTINGS: which trunk stages are evaluated, how they are pooled, what is
frozen."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

from torch import Tensor, nn

SETTINGS = "MODEL.FEATURE_EVAL_SETTINGS"
POOL_OPS_MAP = f"{SETTINGS}.LINEAR_EVAL_FEAT_POOL_OPS_MAP"


def _as_tuples(value: Any) -> Any:
    """YAML lists inside pool-op arguments become tuples (e.g. output sizes [2, 2] -> (2, 2))."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(item) for item in value)
    return value


def build_pool_op(index: int, name: Any, args: Any) -> nn.Module:
    """``torch.nn.<name>(*args)``: the pooling applied to one evaluated stage."""
    where = f"{POOL_OPS_MAP}[{index}]"
    op_class = getattr(nn, name, None) if isinstance(name, str) else None
    if not (isinstance(op_class, type) and issubclass(op_class, nn.Module)):
        raise ValueError(f"{where}: '{name}' is not a torch.nn module (e.g. AdaptiveAvgPool2d)")
    if not isinstance(args, (list, tuple)):
        raise ValueError(f"{where}: the arguments of {name} must be a list, got {args!r}")
    try:
        return op_class(*_as_tuples(args))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: cannot build {name}{_as_tuples(args)}: {error}") from None


class PoolTooLarge(ValueError):
    """A pool op of LINEAR_EVAL_FEAT_POOL_OPS_MAP larger than the feature map of its stage."""


def apply_pools(stages: Sequence[str], pools: Sequence[nn.Module], outputs: Sequence[Tensor],
                image_size: Sequence[int]) -> List[Tensor]:
    """Entry i of the map: ``pools[i]`` applied to ``outputs[i]``, the output of ``stages[i]``
    for images of ``image_size`` (H, W)."""
    return [apply_pool(index, stage, pool, output, image_size)
            for index, (stage, pool, output) in enumerate(zip(stages, pools, outputs))]


def apply_pool(index: int, stage: str, pool: nn.Module, features: Tensor,
               image_size: Sequence[int]) -> Tensor:
    """``pool(features)``, the pool op of entry ``index`` of the map on ``stage``'s output for
    images of ``image_size`` (H, W); PoolTooLarge naming the entry and both sizes when the
    pool's window does not fit the feature map."""
    try:
        return pool(features)
    except RuntimeError as error:
        if "Output size is too small" not in str(error):
            raise
        height, width = features.shape[-2:]
        raise PoolTooLarge(
            f"config.{POOL_OPS_MAP}[{index}]: {pool} does not fit stage {stage}, whose feature "
            f"map is {height}x{width} for the {image_size[0]}x{image_size[1]} images given to "
            f"the model: use a window of at most {height}x{width}, or an adaptive pool "
            "(e.g. AdaptiveAvgPool2d) of the output size wanted") from None


def parse_pool_ops_map(entries: Any) -> List[Tuple[str, nn.Module]]:
    """``[[stage, [pool_op_name, [args]]], ...]`` -> ``[(stage, pool module), ...]``.  A stage
    may be listed more than once (pooled two ways, each entry with its own head), as VISSL's
    linear evaluations of several pooled shapes do."""
    parsed = []
    for index, entry in enumerate(entries or []):
        ok = (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)
              and isinstance(entry[1], (list, tuple)) and len(entry[1]) == 2)
        if not ok:
            raise ValueError(
                f"{POOL_OPS_MAP}[{index}] must be [stage, [pool_op_name, [args]]], "
                f"e.g. [res5, [AdaptiveAvgPool2d, [[1, 1]]]]; got {entry!r}"
            )
        stage, (name, args) = entry
        parsed.append((stage, build_pool_op(index, name, args)))
    return parsed


@dataclass
class FeatureEvalSettings:
    """The parsed MODEL.FEATURE_EVAL_SETTINGS (keys missing from the config take defaults)."""

    eval_mode_on: bool = False
    freeze_trunk_only: bool = False
    freeze_trunk_and_head: bool = False
    extract_trunk_features_only: bool = False
    should_flatten_feats: bool = True
    eval_trunk_and_head: bool = False
    assert_head_layer_shape_init: bool = True
    pool_ops: List[Tuple[str, nn.Module]] = field(default_factory=list)

    @classmethod
    def from_model_cfg(cls, model_cfg) -> "FeatureEvalSettings":
        cfg = model_cfg.get("FEATURE_EVAL_SETTINGS") or {}
        return cls(
            eval_mode_on=bool(cfg.get("EVAL_MODE_ON", False)),
            freeze_trunk_only=bool(cfg.get("FREEZE_TRUNK_ONLY", False)),
            freeze_trunk_and_head=bool(cfg.get("FREEZE_TRUNK_AND_HEAD", False)),
            extract_trunk_features_only=bool(cfg.get("EXTRACT_TRUNK_FEATURES_ONLY", False)),
            should_flatten_feats=bool(cfg.get("SHOULD_FLATTEN_FEATS", True)),
            eval_trunk_and_head=bool(cfg.get("EVAL_TRUNK_AND_HEAD", False)),
            assert_head_layer_shape_init=bool(cfg.get("ASSERT_HEAD_LAYER_SHAPE_INIT", True)),
            pool_ops=parse_pool_ops_map(cfg.get("LINEAR_EVAL_FEAT_POOL_OPS_MAP", [])),
        )

    @property
    def stages(self) -> List[str]:
        return [stage for stage, _ in self.pool_ops]

    @property
    def trunk_only(self) -> bool:
        """The model is a trunk feature extractor (EVAL_MODE_ON and EXTRACT_TRUNK_FEATURES_ONLY):
        it outputs trunk stages only, so the heads of MODEL.HEAD.PARAMS are not built (VISSL's
        model skips them then; a pretraining config's projector and predictor are not needed
        to extract its trunk's features)."""
        return self.eval_mode_on and self.extract_trunk_features_only

    @property
    def heads_per_stage(self) -> bool:
        """Each evaluated stage gets its own head (linear evaluation of several stages)."""
        return self.eval_mode_on and bool(self.pool_ops)


def check_stages_named_once(pool_ops) -> None:
    """Features named by stage (EXTRACT_TRUNK_FEATURES_ONLY) need each stage listed once in
    LINEAR_EVAL_FEAT_POOL_OPS_MAP: a second entry would replace the first's features."""
    entries: Dict[str, List[int]] = {}
    for index, (stage, _) in enumerate(pool_ops):
        entries.setdefault(stage, []).append(index)
    for stage, indices in entries.items():
        if len(indices) > 1:
            pools = ", ".join(f"[{i}] {pool_ops[i][1]}" for i in indices)
            raise ValueError(
                f"config.{POOL_OPS_MAP} lists {stage} {len(indices)} times ({pools}): with "
                f"config.{SETTINGS}.EXTRACT_TRUNK_FEATURES_ONLY=true the features are named by "
                f"stage, so only the last would be kept. List each stage once, or set "
                f"EXTRACT_TRUNK_FEATURES_ONLY=false with one head per entry")
