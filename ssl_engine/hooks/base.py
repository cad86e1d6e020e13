"""The events a hook can act on, and the contract a hook is written against.

``SSLHook`` has one method per event, a no-op unless overridden; its docstrings say where in
the loop each event fires, how often, and what of the task a hook may read or change there.
The loop is ``SelfSupervisionTrainer.train`` and ``run_phase`` (trainer/trainer.py); the
events inside a step are fired by the train step (trainer/train_steps/standard_train_step.py
for the standard one; a custom step fires those it calls); the task (trainer/task.py) runs
every hook of an event in the order of the hook list and adds the time to
``task.hook_seconds``.
"""
from enum import Enum, auto

from ssl_engine.utils.classy import ClassyHook


class SSLClassyHookFunctions(Enum):
    """Hook events, in the order a train step meets them."""

    on_start = auto()
    on_phase_start = auto()
    on_forward = auto()
    on_loss_and_meter = auto()
    on_backward = auto()
    on_update = auto()
    on_step = auto()
    on_phase_end = auto()
    on_end = auto()
    on_exception = auto()


class SSLHook(ClassyHook):
    """A classy_vision hook that also receives the train-step events; override what you need.

    One run, on every rank::

        on_start
        for each phase (train or test):
            on_phase_start
            for each step (an optimizer update in training, a batch in a test phase):
                for each batch of the step (OPTIMIZER.gradient_accumulation_steps in training):
                    on_forward, on_loss_and_meter, on_backward (training only)
                on_update (training only)
                on_step
            on_phase_end
        on_end                    (or on_exception, where the run fails or is stopped)

    What every event may rely on:

    - Ranks: every rank sees the same events the same number of times (each rank gets as many
      batches), except ``on_exception``. A collective (all-reduce, barrier, gather) is allowed
      where every rank makes it at the same event; never inside ``if is_primary()`` and never
      in ``on_exception``. Write files and log on rank 0 only (``is_primary()``).
    - Read-only for hooks: the run's position (``task.phase_idx``, ``train_phase_idx``,
      ``iteration``, ``iteration_num_in_phase``, ``num_iters_in_phase``, ``max_iteration``,
      ``where``, ``schedule_iteration`` of ``schedule_length`` for schedules, ``train``), ``task.stopping``, ``task.data_iterator`` (a hook that takes a
      batch from it steals it from the step), and ``task.last_batch``, ``last_model_output``,
      ``last_loss`` (other hooks read them after you).
    - The metrics store, ``task.metrics`` (utils/metrics_store.py): put named scalars from any
      event of a step (``task.metrics.put(name, value)``); the same names, as many times, on
      every rank, since the log reduces them over ranks (one all-reduce per LOG_FREQUENCY
      window). It holds the current phase only: it is emptied before ``on_phase_start``. The
      log's rows average a series over the window and over the phase, and every writer (the
      log line, metrics.json, TensorBoard, the trackers) gets those rows; a series other than
      ``loss``, ``loss_terms`` and ``monitor`` appears under its own name (``metrics`` /
      ``metrics_avg`` in metrics.json, ``Metrics/...`` in TensorBoard). A value computed on
      rank 0 alone is a row of its own, ``task.metrics.write(row, task.iteration)``. Only
      ``loss`` and ``loss_terms`` are checkpointed: a run resumed inside a phase starts the
      other series afresh.
    - A hook's own state lives on the hook. What must survive a resume (weights a hook trains,
      their optimizer) is returned by ``get_classy_state`` and given back by
      ``set_classy_state``; a hook without such state keeps the defaults.
    """

    def get_classy_state(self) -> dict:
        """The hook's checkpointed state (tensors, numbers, dicts of them), read on every rank
        when a checkpoint is written; the task saves it under the hook's ``name()`` in
        ``classy_state_dict["hooks"]`` when it is not empty. Default: nothing (``{}``)."""
        return {}

    def set_classy_state(self, state: dict) -> None:
        """Gives back what ``get_classy_state`` returned when the run resumes from a checkpoint
        holding it: called in ``task.prepare``, before ``on_start`` (a hook that builds what
        the state fills in ``on_start`` keeps it until then). Not called for a checkpoint
        without it (one written without the hook, or before hooks had state). Default: no-op."""

    def on_start(self, task) -> None:
        """Once, on every rank, before the first phase (``train()``, after ``task.prepare``
        and the restore of a checkpoint and its RNG states). Built and restored: model (wrapped
        for DDP/FSDP), loss, optimizer, meters, datasets; ``task.iteration`` is where the run
        continues, ``task.phase_idx`` the last phase completed (-1 for a new run) and
        ``task.resume_position`` the (phase, batch) of the first step to run. No data iterator
        yet. May check the model, build what the hook needs, run collectives."""

    def on_phase_start(self, task) -> None:
        """Once per phase, on every rank, after ``task.advance_phase``: ``phase_idx``,
        ``train``, ``train_phase_idx``, ``num_iters_in_phase`` and ``data_iterator`` are those
        of the new phase and the model is in train or eval mode. The meters and the metrics
        store are empty, unless the run resumes inside this phase (then they hold the
        checkpoint's and ``iteration_num_in_phase`` counts the batches already done)."""

    def on_forward(self, task) -> None:
        """After the model's forward pass on a batch, before the loss: once per batch (per
        micro-batch under gradient accumulation), in train and test phases. Set:
        ``task.last_batch`` (on the device), ``task.data_time``, ``task.last_model_output``
        (the outputs cast to float32, what the loss receives). Runs inside the step's
        autocast and, in training, with gradients enabled: compute under ``torch.no_grad()``
        and on detached tensors unless the result is meant to enter the loss. A hook may
        prepare what the loss needs for this batch (e.g. a momentum target's output)."""

    def on_loss_and_meter(self, task) -> None:
        """After the loss of the batch (checked finite) and the meters' update, before the
        backward pass; once per batch (micro-batch), in train and test phases. Set:
        ``task.last_loss`` (detached), the loss module's values of this call (its
        ``loss_terms``, its collapse statistics), the store's ``loss`` and ``loss_terms`` of
        this batch. The place to put statistics of the batch into ``task.metrics``."""

    def on_backward(self, task) -> None:
        """After the backward pass of a batch (micro-batch), training only. The gradients in
        ``param.grad`` are summed over the micro-batches so far, each loss divided by their
        count; with float16 AMP they are still multiplied by the loss scale; under DDP they
        are averaged over ranks only after the last micro-batch of the update. A hook may
        change or drop gradients here (e.g. frozen parameters)."""

    def on_update(self, task) -> None:
        """After the optimizer step, once per update, training only: gradients clipped
        (MODEL.GRAD_CLIP) and applied at ``task.where``. ``task.iteration`` does not count
        this update yet (it becomes +1 right after). A hook may change weights here, before
        the next forward pass (e.g. renormalise prototypes, move a target or an average of
        the weights)."""

    def on_step(self, task) -> None:
        """After every step of the phase, on every rank: an update in training, a batch in a
        test phase. ``task.iteration`` and ``iteration_num_in_phase`` are counted,
        ``task.step_time`` and ``data_time`` are set; ``task.stopping`` is True when the run
        stops after this step (a SIGTERM / SIGINT all ranks agreed on; never in a test
        phase): what must be saved is saved now. Where the log, TensorBoard and iteration
        checkpoints run."""

    def on_phase_end(self, task) -> None:
        """Once per phase, on every rank, after its data is exhausted: the meters have been
        synchronised over ranks (``meter.value`` is global), the store holds the whole phase.
        ``task.stopping`` is True when the run stops after this phase. Where phase checkpoints,
        the phase's averages and evaluations (k-NN) run."""

    def on_end(self, task) -> None:
        """Once, on every rank, after the last phase of a run that completed (not after a stop
        or a failure): final reports and closing files."""

    def on_exception(self, task) -> None:
        """When the run leaves ``train()`` by an exception (a failure, a stop on a signal, an
        exit request), before it propagates, on each rank where it was raised, with the task as
        the failure left it; the data workers are stopped afterwards. Other ranks may be
        waiting in a collective or gone: no collective calls here. Close files, dump
        diagnostics."""
