"""Where a training run stands, and how a resumed run continues when its settings changed.

A run's position is counted in samples, not in iterations: the epoch, and how much of the
epoch's global order (``data/sampler.py``) the ranks together have consumed. A checkpoint holds
that position beside the settings it was counted with (``RunSettings``: processes, batch per
process, gradient accumulation, epochs, samples per epoch). A run resumed with the same
settings continues exactly as before. A run resumed with other settings:

- continues the same global order from the same sample (nothing skipped or repeated);
- continues its lr, weight-decay, momentum and loss schedules from the same fraction of the run,
  counted in epochs (``SchedulePosition``); with another number of epochs, the schedules span the
  new number (``CHECKPOINT.RESUME_SCHEDULE=rescale``, the default: the lr jumps to its value at
  the new fraction) or keep the old length (``keep``: past the old end they hold their end
  values);
- says in one log line what changed and how it continues.

A checkpoint already at or past the end of a shortened run is not resumed at all: the launch
ends before any process starts (``check_resume_schedule``), nothing trained.
"""
import logging
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, List, Mapping, Optional

from ssl_engine.config import ConfigError
from ssl_engine.data.sampler import StatefulDistributedSampler

logger = logging.getLogger(__name__)

SCHEDULE_MODES = ("rescale", "keep")


class RunAlreadyComplete(Exception):
    """The checkpoint to resume from is at or past the end of the run the config asks for: the
    launch ends with this message and exit code 0, nothing trained."""


@dataclass(frozen=True)
class RunSettings:
    """The settings a run's position in iterations depends on."""

    world_size: int
    batch_size: int  # per process
    accumulation_steps: int
    num_epochs: int
    epoch_samples: int  # the training data set's size
    drop_last: bool

    @classmethod
    def from_state(cls, state: Optional[Mapping[str, Any]]) -> Optional["RunSettings"]:
        if not state:
            return None
        return cls(**{f.name: state[f.name] for f in fields(cls)})

    @classmethod
    def of_config(cls, config, world_size: int, accumulation_steps: int,
                  train_size: int) -> "RunSettings":
        """The settings of a run of ``config`` (``train_size``: 0 without training data)."""
        train = config.DATA.TRAIN
        return cls(world_size=world_size, batch_size=int(train.BATCHSIZE_PER_REPLICA),
                   accumulation_steps=accumulation_steps,
                   num_epochs=int(config.OPTIMIZER.num_epochs), epoch_samples=train_size,
                   drop_last=bool(train.DROP_LAST))

    def state(self) -> Dict[str, Any]:
        return asdict(self)

    def batches_per_epoch(self) -> int:
        """Batches of each process in one epoch."""
        if not self.epoch_samples or not self.batch_size:
            return 0
        per_rank = StatefulDistributedSampler(self.epoch_samples, self.batch_size,
                                              drop_last=self.drop_last, rank=0,
                                              world_size=self.world_size).num_samples
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def updates_per_epoch(self) -> int:
        """Optimizer updates in one epoch: a last, shorter group of micro-batches still makes
        one."""
        return -(-self.batches_per_epoch() // self.accumulation_steps)

    def changes(self, other: "RunSettings") -> Dict[str, tuple]:
        """{setting: (this value, other value)} for the settings that differ."""
        return {f.name: (getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)}


@dataclass
class SchedulePosition:
    """Maps the run's iterations to the schedules' iterations. Every schedule of the run (lr,
    weight decay, a momentum target's, a loss's) reads ``iteration`` of ``length``. A new run,
    and a run resumed with its settings, has origin 0 and the run's length: the schedules read
    the run's own iterations. A run resumed with other settings starts its schedules at
    ``origin_schedule_iteration`` (its position in the new units) at its iteration
    ``origin_iteration``."""

    epochs: int  # the number of epochs the schedules span
    origin_iteration: int = 0
    origin_schedule_iteration: int = 0

    def iteration(self, run_iteration: int) -> int:
        return run_iteration - self.origin_iteration + self.origin_schedule_iteration

    def length(self, updates_per_epoch: int) -> int:
        return updates_per_epoch * self.epochs

    def run_length(self, updates_per_epoch: int, num_epochs: int) -> int:
        """The run's total updates: those before the origin, and the rest at the new rate."""
        return (self.origin_iteration + updates_per_epoch * num_epochs
                - self.origin_schedule_iteration)

    def state(self) -> Dict[str, int]:
        return asdict(self)


def position_state(settings: RunSettings, phase: Mapping[str, Any], sampler,
                   batches: int) -> Dict[str, Any]:
    """What a checkpoint holds of the run's position: its settings, its phase, and the samples
    of the phase's global order consumed after ``batches`` batches of ``sampler`` (None: the
    phase is complete)."""
    samples = 0 if sampler is None else sampler.samples_consumed(batches)
    return {**settings.state(), "samples_in_phase": samples, "phase_epoch": phase["epoch"],
            "phase_train": phase["train"]}


def epochs_done(state: Mapping[str, Any]) -> float:
    """The epochs a task state (``get_classy_state``) has trained, a fraction for a checkpoint
    inside an epoch; None when the state does not count samples (an earlier version's)."""
    position = state.get("position")
    if state["phase_complete"]:
        return float(state["train_phase_idx"] + 1)
    if not position:
        return None
    return state["train_phase_idx"] + position["samples_in_phase"] / max(
        position["epoch_samples"], 1)


def phase_index(phases: List[Dict], epoch: int, train: bool) -> int:
    """The index in ``phases`` of the last phase at or before (``epoch``, train or test); -1
    when none is."""
    key = (epoch, 0 if train else 1)
    index = -1
    for i, phase in enumerate(phases):
        if (phase["epoch"], 0 if phase["train"] else 1) <= key:
            index = i
    return index


def check_resume_schedule(cfg, checkpoint: Optional[Mapping[str, Any]]) -> None:
    """Before launch: refuse an unknown CHECKPOINT.RESUME_SCHEDULE, and end the launch (exit 0)
    when the checkpoint is at or past the end of a run shortened by OPTIMIZER.num_epochs."""
    mode = cfg.CHECKPOINT.get("RESUME_SCHEDULE", "rescale")
    if mode not in SCHEDULE_MODES:
        raise ConfigError(f"config.CHECKPOINT.RESUME_SCHEDULE must be one of "
                         f"{', '.join(SCHEDULE_MODES)}; got {mode!r}")
    if checkpoint is None or cfg.TEST_ONLY:
        return
    state = checkpoint.get("classy_state_dict") or {}
    saved = RunSettings.from_state(state.get("position"))
    if "phase_complete" not in state:
        return
    done = epochs_done(state)
    new_epochs = int(cfg.OPTIMIZER.num_epochs)
    old_epochs = saved.num_epochs if saved else int(
        (checkpoint.get("config") or {}).get("OPTIMIZER", {}).get("num_epochs", new_epochs))
    if done is not None and new_epochs != old_epochs and done < new_epochs:
        spans = (state.get("schedule") or {}).get("epochs", old_epochs)
        how = ("the schedules span the new number of epochs, moving from "
               f"{100 * min(done / spans, 1):.1f}% to {100 * done / new_epochs:.1f}% of the run"
               if mode == "rescale" else
               f"the schedules keep their {spans}-epoch length"
               + (" and hold their end values after it" if new_epochs > old_epochs else ""))
        logger.warning("resuming a %d-epoch run at epoch %g with config.OPTIMIZER.num_epochs=%d: "
                       "%s (config.CHECKPOINT.RESUME_SCHEDULE=%s)", old_epochs, done,
                       new_epochs, how, mode)
    if done is None or new_epochs >= old_epochs or done < new_epochs:
        return
    raise RunAlreadyComplete(
        f"nothing to train: the latest checkpoint of config.CHECKPOINT.DIR="
        f"{cfg.CHECKPOINT.DIR} is at epoch {done:g} (iteration {checkpoint.get('iteration')}) "
        f"of a {old_epochs}-epoch run, at or past the end that "
        f"config.OPTIMIZER.num_epochs={new_epochs} sets; its weights are that checkpoint's. "
        f"Set config.OPTIMIZER.num_epochs above {done:g} to train on")


def describe_change(changes: Dict[str, tuple], done: float, num_epochs: int,
                    where_before: float, where_after: float, samples: int,
                    epoch_samples: int, mode: str) -> str:
    """The one log line of a resume with other settings."""
    names = {"world_size": "processes", "batch_size": "batch per process",
             "accumulation_steps": "accumulation steps", "num_epochs": "epochs",
             "epoch_samples": "samples per epoch", "drop_last": "DROP_LAST"}
    what = ", ".join(f"{names[key]} {old} -> {new}" for key, (old, new) in changes.items())
    if "epoch_samples" in changes:
        data = (f"the data set's size changed, so the epoch's order is another one: the run "
                f"continues at the same fraction of epoch {int(done)} (sample {samples} of "
                f"{epoch_samples})")
    elif samples:
        data = (f"the run continues the same order at sample {samples} of {epoch_samples} of "
                f"epoch {int(done)}, skipping and repeating nothing")
    else:
        data = f"the run continues at the start of epoch {int(done)}"
    schedules = (f"the schedules continue from {100 * where_before:.1f}% of the run"
                 if abs(where_before - where_after) < 5e-4 else
                 f"the schedules move from {100 * where_before:.1f}% to {100 * where_after:.1f}% "
                 f"of the run ({done:g} of {num_epochs} epochs; "
                 f"config.CHECKPOINT.RESUME_SCHEDULE={mode})")
    rng = ("; random states are restored per process only at the same number of processes"
           if "world_size" in changes else "")
    return f"resumed with other settings ({what}): {data}; {schedules}{rng}"


@dataclass
class ResumePlan:
    """Where a resumed task continues: the last phase done (``phase_idx``, the next one runs
    next), the train phases started, the batches and samples of the next phase already done,
    the schedules' position, the one log line of a changed resume (None when nothing
    changed) and where ``metrics.json``'s rows are cut (the checkpoint's phase and batch)."""

    phase_idx: int
    train_phase_idx: int
    start_iter: int
    start_sample: int
    schedule: SchedulePosition
    message: Optional[str]
    cut: tuple


def plan_resume(state: Mapping[str, Any], current: RunSettings, mode: str,
                phases: List[Dict]) -> ResumePlan:
    """How a task with ``current`` settings and ``phases`` continues from the task state
    ``state`` (``get_classy_state`` of a checkpoint)."""
    saved = RunSettings.from_state(state.get("position"))
    schedule = SchedulePosition(**state["schedule"]) if state.get("schedule") else \
        SchedulePosition(epochs=current.num_epochs)
    complete = state["phase_complete"]
    batches = 0 if complete else state["iteration_num_in_phase"]
    cut = (state["phase_idx"] + 1, 0) if complete else (state["phase_idx"], batches)
    changes = saved.changes(current) if saved else {}
    if not changes:  # exactly where it stopped, in the same units
        if complete:
            return ResumePlan(state["phase_idx"], state["train_phase_idx"], 0, 0, schedule,
                              None, cut)
        samples = (state["position"]["samples_in_phase"] if saved else
                   batches * current.batch_size * current.world_size)
        phase = state["phase_idx"]
        train_phase = state["train_phase_idx"] - (1 if phases[phase]["train"] else 0)
        return ResumePlan(phase - 1, train_phase, batches, samples, schedule, None, cut)
    iteration = state["iteration"]
    where_before = min(schedule.iteration(iteration) /
                       max(schedule.length(saved.updates_per_epoch()), 1), 1.0)
    done = epochs_done(state)
    epoch = int(done)
    samples = 0
    if not complete:
        samples = state["position"]["samples_in_phase"]
        if "epoch_samples" in changes:
            samples = round((done - epoch) * current.epoch_samples)
    if "num_epochs" in changes and mode == "rescale":
        schedule = SchedulePosition(epochs=current.num_epochs)
    updates = current.updates_per_epoch()
    schedule = SchedulePosition(schedule.epochs, iteration, round(done * updates))
    where_after = min(schedule.iteration(iteration) / max(schedule.length(updates), 1), 1.0)
    message = describe_change(changes, done, schedule.epochs, where_before, where_after,
                              samples, current.epoch_samples, mode)
    if done >= current.num_epochs:  # past the end: nothing left (the launch says so first)
        last = len(phases) - 1
        return ResumePlan(last, sum(p["train"] for p in phases) - 1, 0, 0, schedule,
                          message, cut)
    if complete:
        position = state["position"]
        index = phase_index(phases, position["phase_epoch"], position["phase_train"])
        return ResumePlan(index, sum(p["train"] for p in phases[:index + 1]) - 1, 0, 0,
                          schedule, message, cut)
    index = phase_index(phases, epoch, True)  # the train phase of that epoch, re-entered
    start_iter = samples // (current.batch_size * current.world_size)
    return ResumePlan(index - 1, sum(p["train"] for p in phases[:index]) - 1, start_iter,
                      samples, schedule, message, cut)
