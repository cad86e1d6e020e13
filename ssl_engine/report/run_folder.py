"""What a run folder (CHECKPOINT.DIR) holds, read back for the report and the comparison of
runs: the rows of metrics.json, the composed config (``config.yaml``, or the one a checkpoint
keeps), the checkpoints and the log. Works on a finished run, one in progress, one killed
mid-way (a half-written last line is skipped) and one made before the report existed."""
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from ssl_engine.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from ssl_engine.utils.io import json_objects

logger = logging.getLogger(__name__)
MAX_NAMED_LINES = 10  # skipped lines of metrics.json named in the warning
CONFIG_NAME = "config.yaml"  # the composed config, written by the run report hook at the start
PROBE_PREFIX = "online_probe"


def read_rows(path: Path) -> List[dict]:
    """The JSON objects of metrics.json, one a line; lines that do not parse are skipped, with
    one warning naming them (but for a last line without its newline: the half-written line of
    a run in progress or killed, skipped silently)."""
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.splitlines()
    rows, skipped = [], []
    for number, line in enumerate(lines, start=1):
        row = json_objects([line])
        if row:
            rows += row
        elif line.strip() and not (number == len(lines) and not text.endswith("\n")):
            skipped.append(number)
    if skipped:
        shown = ", ".join(str(n) for n in skipped[:MAX_NAMED_LINES])
        hidden = len(skipped) - MAX_NAMED_LINES
        more = f", ... ({hidden} more)" if hidden > 0 else ""
        logger.warning("%s: skipped %d line(s) that are not JSON objects (line %s%s); the "
                       "steps they held are left out", path, len(skipped), shown, more)
    return rows


def _number(value: Any) -> Optional[float]:
    """``value`` as a finite float (a dict: its ``top1``), else None."""
    if isinstance(value, dict):
        value = value.get("top1")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class RunFolder:
    """A run folder's contents; every attribute is empty where the folder lacks the file."""

    folder: Path
    rows: List[dict] = field(default_factory=list)
    config: Dict[str, Any] = field(default_factory=dict)  # the composed config (its ``config``)
    config_source: str = ""  # the file the config was read from
    checkpoints: List[Path] = field(default_factory=list)
    log: Optional[Path] = None

    @property
    def name(self) -> str:
        return self.folder.name or str(self.folder)

    def train_steps(self) -> List[dict]:
        """The progress rows of training steps, in order, one per iteration (a resumed run's
        repeated rows: the last one wins)."""
        by_iteration = {}
        for row in self.rows:
            if row.get("phase") == "train" and isinstance(row.get("iteration"), int):
                by_iteration[row["iteration"]] = row
        return [by_iteration[key] for key in sorted(by_iteration)]

    def series(self, key: str, group: Optional[str] = None) -> Dict[str, List[float]]:
        """{"x": iterations, "y": values} of a train-step field (or of ``row[group][key]``)."""
        xs, ys = [], []
        for row in self.train_steps():
            value = row.get(group, {}).get(key) if group else row.get(key)
            value = _number(value)
            if value is not None:
                xs.append(row["iteration"])
                ys.append(value)
        return {"x": xs, "y": ys}

    def group_keys(self, group: str) -> List[str]:
        """The keys of a group field (loss_terms, monitor) over the train steps, in order."""
        keys: Dict[str, None] = {}
        for row in self.train_steps():
            keys.update(dict.fromkeys(row.get(group) or {}))
        return list(keys)

    def knn_per_epoch(self) -> Dict[int, float]:
        """{train phase: k-NN top-1 %} of the online k-NN evaluation."""
        return {int(row["knn"].get("train_phase_idx", i)): float(row["knn"]["top1"])
                for i, row in enumerate(r for r in self.rows if isinstance(r.get("knn"), dict))}

    def probe_per_epoch(self) -> Dict[str, Dict[int, float]]:
        """{name: {train phase: accuracy %}} of every ``online_probe*`` value the rows hold:
        a top-level key, or one in a phase end's ``metrics_avg``."""
        found: Dict[str, Dict[int, float]] = {}
        for index, row in enumerate(self.rows):
            phase = row.get("train_phase_idx", index)
            candidates = dict(row)
            if row.get("phase_end"):
                candidates.update(row.get("metrics_avg") or {})
            for key, value in candidates.items():
                if not key.startswith(PROBE_PREFIX):
                    continue
                if isinstance(value, dict) and "train_phase_idx" in value:
                    phase = value["train_phase_idx"]
                number = _number(value)
                if number is not None and isinstance(phase, int):
                    found.setdefault(key, {})[phase] = number
        return found

    def feature_report(self) -> Optional[dict]:
        """The last ``feature_report`` row's content, or None."""
        reports = [row["feature_report"] for row in self.rows
                   if isinstance(row.get("feature_report"), dict)]
        return reports[-1] if reports else None

    def phase_ends(self, phase: str = "train") -> List[dict]:
        return [row for row in self.rows if row.get("phase_end") == phase]

    def wall_seconds(self) -> Optional[float]:
        """The summed time of the phases completed, or None when none completed."""
        times = [row.get("phase_time_seconds") for row in self.rows if row.get("phase_end")]
        times = [t for t in times if isinstance(t, (int, float))]
        return float(sum(times)) if times else None

    def epochs_done(self) -> int:
        return len({row.get("train_phase_idx") for row in self.phase_ends()})

    def method(self) -> str:
        """The loss's name, from the config (``-`` when no config was found)."""
        return str((self.config.get("LOSS") or {}).get("name") or "-")


def _config_from_checkpoint(checkpoints: List[Path]) -> Optional[dict]:
    for path in reversed(checkpoints):
        try:
            state = load_checkpoint(path, mmap=True)
        except (CheckpointError, OSError, RuntimeError, ValueError):
            continue
        config = state.get("config") if isinstance(state, dict) else None
        if isinstance(config, dict):
            return config
    return None


def read_run_folder(folder) -> RunFolder:
    """Everything the report reads from ``folder``; raises FileNotFoundError when it is no
    folder, never for a missing file inside."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder (give a run's CHECKPOINT.DIR)")
    run = RunFolder(folder, rows=read_rows(folder / "metrics.json"))
    run.checkpoints = list_checkpoints(folder)
    log = folder / "log.txt"
    run.log = log if log.is_file() else None
    config_file = folder / CONFIG_NAME
    if config_file.is_file():
        loaded = yaml.safe_load(config_file.read_text()) or {}
        run.config, run.config_source = loaded.get("config", loaded), str(config_file)
    else:
        config = _config_from_checkpoint(run.checkpoints)
        if config is not None:
            run.config = config
            run.config_source = str(run.checkpoints[-1])
    return run
