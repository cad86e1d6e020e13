"""Import classy_vision with its import-time deprecation warnings silenced here only: the
engine's modules take classy_vision's names from here."""
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import classy_vision  # noqa: F401
    from classy_vision.hooks import ClassyHook  # noqa: F401
    from classy_vision.losses import LOSS_REGISTRY, ClassyLoss, register_loss  # noqa: F401
    from classy_vision.meters import (  # noqa: F401
        METER_REGISTRY,
        AccuracyMeter,
        ClassyMeter,
        PrecisionAtKMeter,
        RecallAtKMeter,
        register_meter,
    )
    from classy_vision.optim import (  # noqa: F401
        OPTIMIZER_REGISTRY,
        ClassyOptimizer,
        register_optimizer,
    )
    from classy_vision.optim.param_scheduler import (  # noqa: F401
        ClassyParamScheduler,
        CompositeParamScheduler,
        ConstantParamScheduler,
        CosineParamScheduler,
        LinearParamScheduler,
        MultiStepParamScheduler,
        ParamScheduler,
        StepParamScheduler,
        UpdateInterval,
    )
    from classy_vision.tasks import TASK_REGISTRY, ClassyTask, register_task  # noqa: F401
