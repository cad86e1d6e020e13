"""The hook DeepCluster v2's loss works with (see ``losses/deepclusterv2_loss.py``)."""
from ssl_engine.hooks.base import SSLHook


class DeepClusterV2Hook(SSLHook):
    """At the start of a new run (not of a resumed one: its memory comes from the checkpoint),
    one pass over the training data fills the memory bank; at the start of every training
    epoch (not when a resumed run re-enters an epoch it had begun: the clusters of that epoch
    come from the checkpoint), k-means clusters the memory."""

    def on_start(self, task) -> None:
        if task.iteration == 0 and "TRAIN" in task.datasets:
            task.loss.init_memory(task)

    def on_phase_start(self, task) -> None:
        if task.train and task.iteration_num_in_phase == 0:
            task.loss.cluster_memory(task.train_phase_idx)
