"""How a process shares the machine's cores between data-loading workers and compute threads
(config.DATA.NUM_DATALOADER_WORKERS=auto; docs/performance.md)."""
import os


def cores_available() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's or SLURM's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def processes_on_this_machine(cfg) -> int:
    """The training processes sharing this machine: torchrun's LOCAL_WORLD_SIZE when torchrun
    started them (the config then says nothing about it), else DISTRIBUTED.NUM_PROC_PER_NODE."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(local) if local else int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)


def cores_per_process(procs_per_node: int) -> int:
    return max(1, cores_available() // max(1, int(procs_per_node)))


def auto_workers(cores: int, device: str) -> int:
    """Data-loading workers for a process with ``cores`` cores.

    On a CPU, workers and compute threads share the cores.  Two workers up to 8 cores: measured
    on 2 cores, two workers beside two compute threads cost a compute-bound step (ResNet-18 at
    224) at most 6% over no worker, while a data-bound step (the digits quickstart, 256 small
    augmented views per step) took 1.76x as long without workers and 1.5x with one.  Above 8
    cores a quarter of them, which then leave the compute threads.  A GPU process keeps one
    core for itself and gives the rest to workers (at most 8)."""
    if device == "gpu":
        return max(0, min(8, cores - 1))
    return 2 if cores <= 8 else cores // 4


def compute_threads(cores: int, workers: int, auto: bool) -> int:
    """torch's intra-op threads for a CPU process: its cores, less the workers' when the worker
    count was chosen automatically on a machine with more than 8 cores per process (below that
    the workers mostly wait on a full prefetch queue and the compute keeps every core)."""
    return max(1, cores - workers) if auto and cores > 8 else cores


def loader_workers(cfg) -> int:
    """config.DATA.NUM_DATALOADER_WORKERS as a number (``auto`` resolved for this machine)."""
    workers = cfg.DATA.NUM_DATALOADER_WORKERS
    if workers == "auto":
        cores = cores_per_process(processes_on_this_machine(cfg))
        return auto_workers(cores, cfg.MACHINE.DEVICE)
    return int(workers)


def configure_threads(cfg) -> str:
    """Set torch's intra-op threads of a CPU process (its share of the cores, less the workers'
    under ``auto``); returns the choice in words, for the log."""
    import torch

    cores = cores_per_process(processes_on_this_machine(cfg))
    workers = loader_workers(cfg)
    auto = cfg.DATA.NUM_DATALOADER_WORKERS == "auto"
    text = (f"{workers} data-loading worker(s) per process"
            f"{' (NUM_DATALOADER_WORKERS=auto)' if auto else ''}, {cores} core(s) per process")
    if cfg.MACHINE.DEVICE != "cpu":
        return text
    threads = compute_threads(cores, workers, auto)
    torch.set_num_threads(threads)
    return f"{text}, {threads} compute thread(s)"
