"""Import classy_vision with its import-time deprecation warnings silenced here only."""
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import classy_vision  # noqa: F401
    from classy_vision.hooks import ClassyHook  # noqa: F401
    from classy_vision.losses import LOSS_REGISTRY, ClassyLoss, register_loss  # noqa: F401
    from classy_vision.tasks import TASK_REGISTRY, ClassyTask, register_task  # noqa: F401
