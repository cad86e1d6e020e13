"""Every log line is printed once: no module of ssl_engine logs through the root logger's
module-level functions (``logging.info(...)`` installs a second, default-format handler on the
root logger when it has none)."""
import ast
import logging
from pathlib import Path

import torch

from ssl_engine.config import load_config
from ssl_engine.trainer import SelfSupervisionTask

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "ssl_engine"
ROOT_LOGGER_CALLS = {"debug", "info", "warning", "warn", "error", "exception", "critical",
                     "log", "basicConfig"}


def root_logger_calls(source: str):
    """(line, function) of every ``logging.<function>(...)`` call in ``source``."""
    return [(node.lineno, node.func.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "logging"
            and node.func.attr in ROOT_LOGGER_CALLS]


def test_no_module_logs_through_the_root_logger():
    assert root_logger_calls("import logging\ndef f():\n    logging.info('x')\n") == [(3, "info")]
    assert root_logger_calls("logger = logging.getLogger(__name__)\nlogger.info('x')\n") == []
    found = {f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} logging.{name}"
             for path in sorted(PACKAGE_ROOT.rglob("*.py"))
             for line, name in root_logger_calls(path.read_text())}
    assert not found, sorted(found)


def test_auto_lr_scaling_installs_no_root_handler(tmp_path, caplog):
    """Composing a config with auto lr scaling and building its task leaves the root logger
    without handlers (pytest's own are taken off for the test)."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    for handler in saved_handlers:
        root.removeHandler(handler)
    try:
        _, cfg = load_config([
            "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={tmp_path}",
            "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale=true",
            "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.base_lr_batch_size=4"])
        SelfSupervisionTask.from_config(cfg, torch.device("cpu"))
        added = list(root.handlers)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)
    assert cfg.OPTIMIZER.param_schedulers.lr.start_value == 0.2  # 0.1 x batch 8 / 4: it scaled
    assert added == []
