"""Hooks called by the trainer at every phase and step event (the contract: ``base.py``).

The list of hooks a run gets is assembled in ``ssl_engine/trainer/default_hooks.py``: it adds
the loss's own hooks, and losses sit above hooks."""
from ssl_engine.hooks.base import SSLClassyHookFunctions, SSLHook
from ssl_engine.hooks.checkpoint_hook import CheckpointHook
from ssl_engine.hooks.collapse_monitor_hook import CollapseMonitorHook
from ssl_engine.hooks.ema_model_hook import EmaModelHook
from ssl_engine.hooks.feature_report_hook import FeatureReportHook
from ssl_engine.hooks.frozen_params_hook import FrozenParamsHook
from ssl_engine.hooks.knn_hook import KnnEvalHook
from ssl_engine.hooks.log_hooks import LogLossLrEtaHook
from ssl_engine.hooks.memory_hooks import GpuStatsHook, MemorySummaryHook
from ssl_engine.hooks.perf_hooks import ModelComplexityHook, PerfStatsHook
from ssl_engine.hooks.registry import HOOK_REGISTRY, register_hook
from ssl_engine.hooks.run_report_hook import RunReportHook
from ssl_engine.hooks.tensorboard_hook import TensorboardHook

__all__ = ["CheckpointHook", "CollapseMonitorHook", "EmaModelHook", "FeatureReportHook", "FrozenParamsHook", "KnnEvalHook",
           "GpuStatsHook", "LogLossLrEtaHook", "MemorySummaryHook", "ModelComplexityHook", "PerfStatsHook", "RunReportHook",
           "SSLClassyHookFunctions",
           "SSLHook", "TensorboardHook", "HOOK_REGISTRY", "register_hook"]
