"""The hooks a run gets: the engine's own, chosen by the config, then the loss's, then the
registered hooks named in HOOKS.EXTRA_HOOKS, then the experiment trackers. The engines pass
``default_hook_generator`` to the trainer unless a caller gives its own generator."""
import os
from typing import List

from ssl_engine.config import ConfigError
from ssl_engine.hooks import (CheckpointHook, CollapseMonitorHook, EmaModelHook,
                              FeatureReportHook, FrozenParamsHook, GpuStatsHook, KnnEvalHook,
                              LogLossLrEtaHook, MemorySummaryHook, ModelComplexityHook,
                              PerfStatsHook, RunReportHook, SSLHook, TensorboardHook)
from ssl_engine.hooks.flops_hook import FlopsHook
from ssl_engine.hooks.mlflow_hook import MlflowHook
from ssl_engine.hooks.online_probe_hook import OnlineLinearProbeHook
from ssl_engine.hooks.registry import HOOK_REGISTRY
from ssl_engine.hooks.wandb_hook import WandbHook
from ssl_engine.losses import loss_class
from ssl_engine.models.ema import ema_model_enabled


def default_hook_generator(cfg) -> List[SSLHook]:
    """The hooks every run gets: the step timings (HOOKS.PERF_STATS, on by default), logging,
    checkpoints (when training), then TensorBoard, the online k-NN evaluation, the final
    feature report, the online linear probe (HOOKS.ONLINE_LINEAR_PROBE), the collapse monitor
    (self-supervised training) and temporarily frozen
    parameters when asked, the model's flops (HOOKS.MODEL_COMPLEXITY), the average of the
    weights (HOOKS.EMA_MODEL), the memory summary (HOOKS.MEMORY_SUMMARY) and the GPU report
    (HOOKS.LOG_GPU_STATS), the run report (HOOKS.RUN_REPORT), then the loss's own,
    then the registered hooks named in HOOKS.EXTRA_HOOKS, then the experiment trackers."""
    hooks: List[SSLHook] = []
    perf = cfg.HOOKS.PERF_STATS
    if perf.MONITOR_PERF_STATS or perf.ROLLING_BTIME_FREQ > 0:  # first: it times the others
        hooks.append(PerfStatsHook(cfg.CHECKPOINT.DIR, perf.PERF_STAT_FREQUENCY,
                                   perf.ROLLING_BTIME_FREQ, perf.SYNCHRONIZE_GPU))
    if perf.MONITOR_PERF_STATS:  # before the log hook: its lines show TFLOP/s and MFU
        hooks.append(FlopsHook(cfg.CHECKPOINT.DIR))
    hooks.append(LogLossLrEtaHook(cfg.LOG_FREQUENCY, cfg.CHECKPOINT.DIR))
    if not cfg.TEST_ONLY:
        hooks.append(CheckpointHook(cfg.CHECKPOINT.DIR, cfg.CHECKPOINT.CHECKPOINT_FREQUENCY,
                                    cfg.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY,
                                    cfg.CHECKPOINT.SAVE_ON_SIGTERM))
    tb = cfg.HOOKS.TENSORBOARD_SETUP
    if tb.USE_TENSORBOARD:
        hooks.append(TensorboardHook(os.path.join(cfg.CHECKPOINT.DIR, tb.EXPERIMENT_LOG_DIR or ""),
                                     cfg.LOG_FREQUENCY, tb.FLUSH_EVERY_N_MIN, tb.LOG_PARAMS))
    if cfg.HOOKS.KNN_EVAL.USE_KNN_EVAL:
        hooks.append(KnnEvalHook(cfg))
    if cfg.HOOKS.FEATURE_REPORT.ENABLED:
        hooks.append(FeatureReportHook(cfg))
    if cfg.HOOKS.ONLINE_LINEAR_PROBE.ENABLED and not cfg.TEST_ONLY:
        hooks.append(OnlineLinearProbeHook(cfg))
    monitor = cfg.HOOKS.COLLAPSE_MONITOR
    if monitor.ENABLED and not cfg.TEST_ONLY and not cfg.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON:
        hooks.append(CollapseMonitorHook(monitor.MIN_EMBEDDING_STD))
    if cfg.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP and not cfg.TEST_ONLY:
        hooks.append(FrozenParamsHook(cfg.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP))
    if cfg.HOOKS.MODEL_COMPLEXITY.COMPUTE_COMPLEXITY:
        hooks.append(ModelComplexityHook(cfg.HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE,
                                         cfg.CHECKPOINT.DIR))
    if ema_model_enabled(cfg):
        hooks.append(EmaModelHook.from_config(cfg))
    memory = cfg.HOOKS.MEMORY_SUMMARY
    if memory.PRINT_MEMORY_SUMMARY or memory.DUMP_MEMORY_ON_EXCEPTION:
        hooks.append(MemorySummaryHook(memory.PRINT_MEMORY_SUMMARY, memory.LOG_ITERATION_NUM,
                                       memory.DUMP_MEMORY_ON_EXCEPTION))
    if cfg.HOOKS.LOG_GPU_STATS:
        hooks.append(GpuStatsHook())
    if cfg.HOOKS.RUN_REPORT.ENABLED and not cfg.TEST_ONLY:  # last: it reads what others wrote
        hooks.append(RunReportHook(cfg))
    return hooks + loss_hooks(cfg) + extra_hooks(cfg) + tracker_hooks(cfg)


def extra_hooks(cfg) -> List[SSLHook]:
    """One ``cls(cfg)`` per name in HOOKS.EXTRA_HOOKS, from the hooks registered with
    ``register_hook``."""
    hooks = []
    for index, name in enumerate(cfg.HOOKS.EXTRA_HOOKS):
        hook_cls = HOOK_REGISTRY.get(name) if name in HOOK_REGISTRY else None
        if hook_cls is None:
            known = ", ".join(HOOK_REGISTRY.names()) or "(none)"
            raise ConfigError(f"config.HOOKS.EXTRA_HOOKS[{index}]: no hook is registered as "
                              f"'{name}' (register_hook; import its module with "
                              f"SSL_ENGINE_PLUGINS). Registered hooks: {known}")
        hooks.append(hook_cls(cfg))
    return hooks


def loss_hooks(cfg) -> List[SSLHook]:
    """The hooks the loss of ``cfg.LOSS.name`` works with (its ``build_hooks``), e.g. the one
    that runs and updates a momentum target network."""
    return list(loss_class(cfg.LOSS.name).build_hooks())


def tracker_hooks(cfg) -> List[SSLHook]:
    """The experiment trackers switched on (HOOKS.MLFLOW, HOOKS.WANDB): last, so that they log
    what every other hook has written to metrics.json and the run folder."""
    return [hook(cfg) for key, hook in (("MLFLOW", MlflowHook), ("WANDB", WandbHook))
            if cfg.HOOKS[key].ENABLED]
