"""``config.SLURM.USE_SLURM=true``: the run is submitted as a SLURM job through submitit (one
task per node, each starting the node's NUM_PROC_PER_NODE processes), instead of starting here.

The job is checkpointable: on preemption or timeout SLURM signals it, submitit requeues it,
and the requeued job resumes from the last checkpoint of CHECKPOINT.DIR (the job always runs
with AUTO_RESUME on; the folder was checked before submission).  On a machine without SLURM
submitit's local executor runs the job on this machine, and the command waits for it.
"""
import copy
import logging
from pathlib import Path
from typing import Any, Callable, Dict

import submitit

from ssl_engine.config import ConfigError
from ssl_engine.config.derive import check_processes_fit
from ssl_engine.engines.plugins import import_plugins

logger = logging.getLogger(__name__)


class EngineJob(submitit.helpers.Checkpointable):
    """What each node's task runs: the engine on this node's processes.  Requeued as it is
    (``Checkpointable.checkpoint``), it resumes from the run's last checkpoint."""

    def __init__(self, cfg, engine_name: str, launch: Callable):
        self.cfg, self.engine_name, self.launch = cfg, engine_name, launch

    def __call__(self) -> str:
        import_plugins()  # $SSL_ENGINE_PLUGINS: the user's components, on this node too
        env = submitit.JobEnvironment()
        cfg = copy.deepcopy(self.cfg)
        check_processes_fit(cfg)  # not checked where the job was submitted from
        cfg.SLURM.USE_SLURM = False
        cfg.CHECKPOINT.AUTO_RESUME = True
        cfg.DISTRIBUTED.NODE_ID = env.node
        if cfg.DISTRIBUTED.NUM_NODES > 1:  # node 0's host and SLURM.PORT_ID for the rendezvous
            cfg.DISTRIBUTED.INIT_METHOD = "tcp"
            cfg.DISTRIBUTED.RUN_ID = f"{env.hostnames[0]}:{cfg.SLURM.PORT_ID}"
        logger.info("job %s, node %d of %d", env.job_id, env.node, env.num_nodes)
        self.launch(cfg, self.engine_name)
        return cfg.CHECKPOINT.DIR


def is_local(job) -> bool:
    """Whether submitit's local executor runs ``job`` (no SLURM on this machine)."""
    from submitit.local.local import LocalJob

    return isinstance(job, LocalJob)


def executor_parameters(cfg) -> Dict[str, Any]:
    """submitit's parameters from config.SLURM and config.DISTRIBUTED."""
    slurm, nproc = cfg.SLURM, cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    params = {
        "name": slurm.NAME,
        "timeout_min": int(slurm.TIME_HOURS * 60 + slurm.TIME_MINUTES),
        "mem_gb": slurm.MEM_GB,
        "nodes": cfg.DISTRIBUTED.NUM_NODES,
        "tasks_per_node": 1,
        "cpus_per_task": slurm.NUM_CPU_PER_PROC * nproc,
        "slurm_partition": slurm.PARTITION,
        "slurm_comment": slurm.COMMENT,
        "slurm_constraint": slurm.CONSTRAINT,
        "slurm_additional_parameters": dict(slurm.ADDITIONAL_PARAMETERS or {}),
    }
    if cfg.MACHINE.DEVICE == "gpu":
        params["gpus_per_node"] = nproc
    return params


def submit(cfg, engine_name: str, launch: Callable, cluster: str = None):
    """Submit the run; the submitit job (``job.job_id``; ``job.paths`` for its logs). On each
    node the job calls ``launch(cfg, engine_name)`` (the launcher's ``launch_distributed``).
    ``cluster``: submitit's choice (None: SLURM when ``sbatch`` exists, else local)."""
    executor = submitit.AutoExecutor(folder=Path(cfg.SLURM.LOG_FOLDER), cluster=cluster)
    if executor.cluster == "slurm" and not cfg.SLURM.PARTITION:
        raise ConfigError("config.SLURM.USE_SLURM=true needs config.SLURM.PARTITION (the SLURM "
                          "partition to run on)")
    params = executor_parameters(cfg)
    if executor.cluster != "slurm":  # the local executor knows no partition, memory or nodes
        params = {k: v for k, v in params.items()
                  if not k.startswith("slurm_") and k not in ("mem_gb", "nodes")}
    executor.update_parameters(**params)
    return executor.submit(EngineJob(cfg, engine_name, launch))
