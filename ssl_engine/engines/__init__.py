"""Engines: the workflows the launcher runs by name (``engine_name=train`` ...).

An engine is a function ``engine(cfg, dist_run_id, checkpoint_path, checkpoint_folder,
hook_generator)`` registered with ``@register_engine(name)`` (from
``ssl_engine.engines.registry``); it runs in every process.
"""
from ssl_engine.engines.registry import ENGINE_REGISTRY, get_engine, register_engine  # noqa: F401
from ssl_engine.engines import train  # noqa: F401  (registers)
from ssl_engine.engines import extract_features  # noqa: F401  (registers)
from ssl_engine.engines import extract_label_predictions  # noqa: F401  (registers)
from ssl_engine.engines import extract_cluster  # noqa: F401  (registers)
