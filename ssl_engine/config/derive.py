"""Settings that follow from others, and checks of combinations, done once before launch."""
import logging
import os

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.validate import get_dotted
from ssl_engine.data.catalog import resolve_dataset_names
from ssl_engine.optimizers import apply_auto_lr_scaling
from ssl_engine.utils.cpu_budget import cores_available
from ssl_engine.utils.derivations import run_config_derivations
from ssl_engine.utils.errors import ConfigError

logger = logging.getLogger(__name__)

_CHOICES = {
    "MACHINE.DEVICE": ("cpu", "gpu"),
    "DISTRIBUTED.BACKEND": ("auto", "gloo", "nccl"),
    "DISTRIBUTED.INIT_METHOD": ("tcp", "file", "env"),
    "DATA.TRAIN.LABEL_TYPE": ("standard", "sample_index", "zero"),  # ssl_dataset.LABEL_TYPES
    "DATA.TEST.LABEL_TYPE": ("standard", "sample_index", "zero"),
}
_POSITIVE = (
    "DATA.TRAIN.BATCHSIZE_PER_REPLICA",
    "DATA.TEST.BATCHSIZE_PER_REPLICA",
    "OPTIMIZER.num_epochs",
    "DISTRIBUTED.NUM_NODES",
    "DISTRIBUTED.NUM_PROC_PER_NODE",
    "LOG_FREQUENCY",
    "TEST_EVERY_NUM_EPOCH",
    "CHECKPOINT.CHECKPOINT_FREQUENCY",
)


def _check_choices(cfg: AttrDict) -> None:
    for key, allowed in _CHOICES.items():
        value = get_dotted(cfg, key)
        if value not in allowed:
            raise ConfigError(f"config.{key}={value!r} is not one of {', '.join(allowed)}")
    for key in _POSITIVE:
        if get_dotted(cfg, key) < 1:
            raise ConfigError(f"config.{key} must be at least 1, got {get_dotted(cfg, key)}")
    threads = cfg.DISTRIBUTED.get("NCCL_SOCKET_NTHREADS", "")
    if threads != "" and not (str(threads).isdigit() and int(threads) >= 1):
        raise ConfigError(f"config.DISTRIBUTED.NCCL_SOCKET_NTHREADS must be empty (NCCL's "
                          f"default) or a number of threads >= 1, got {threads!r}")
    cache = cfg.MODEL.CUDA_CACHE
    if cache.CLEAR_CUDA_CACHE and (isinstance(cache.CLEAR_FREQ, bool)
                                   or not isinstance(cache.CLEAR_FREQ, int)
                                   or cache.CLEAR_FREQ < 1):
        raise ConfigError(f"config.MODEL.CUDA_CACHE.CLEAR_FREQ must be an integer >= 1 (steps "
                          f"between two clears) when CLEAR_CUDA_CACHE is on, got "
                          f"{cache.CLEAR_FREQ!r}")
    method = cfg.get("MULTI_PROCESSING_METHOD", "forkserver")
    if method not in ("fork", "forkserver", "spawn"):
        raise ConfigError(f"config.MULTI_PROCESSING_METHOD={method!r} is not one of fork, "
                          "forkserver, spawn")
    if method == "fork":
        logger.info("config.MULTI_PROCESSING_METHOD=fork: the engine starts its processes with "
                    "forkserver instead (forking a process whose torch ran parallel work is not "
                    "safe); results do not depend on it")
    workers = cfg.DATA.NUM_DATALOADER_WORKERS
    if workers != "auto" and (not isinstance(workers, int) or workers < 0):
        raise ConfigError(f"config.DATA.NUM_DATALOADER_WORKERS must be auto or an integer >= 0, "
                          f"got {workers!r}")


def check_gpus(cfg: AttrDict) -> None:
    """MACHINE.DEVICE=gpu needs NUM_PROC_PER_NODE visible GPUs."""
    import torch

    if cfg.MACHINE.DEVICE != "gpu":
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            "config.MACHINE.DEVICE=gpu but no CUDA device is visible; "
            "run with config.MACHINE.DEVICE=cpu"
        )
    gpus = torch.cuda.device_count()
    if cfg.DISTRIBUTED.NUM_PROC_PER_NODE > gpus:
        raise ConfigError(
            f"config.DISTRIBUTED.NUM_PROC_PER_NODE={cfg.DISTRIBUTED.NUM_PROC_PER_NODE} starts "
            f"one process per GPU, but {gpus} GPU(s) are visible (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): set "
            f"config.DISTRIBUTED.NUM_PROC_PER_NODE to at most {gpus}"
        )


def check_processes_fit(cfg: AttrDict) -> None:
    """The NUM_PROC_PER_NODE processes started on this machine fit it: one per visible GPU
    (MACHINE.DEVICE=gpu), or at most one per CPU core this process may use (its CPU affinity:
    a container's or SLURM's share)."""
    if cfg.MACHINE.DEVICE == "gpu":
        check_gpus(cfg)
        return
    nproc, cores = cfg.DISTRIBUTED.NUM_PROC_PER_NODE, cores_available()
    if nproc > cores:
        raise ConfigError(
            f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc} starts {nproc} processes, but this "
            f"machine gives this process {cores} CPU core(s) (its CPU affinity): more processes "
            "than cores only compete for them and for memory. Set "
            f"config.DISTRIBUTED.NUM_PROC_PER_NODE to at most {cores}"
        )


def _derive_device_and_backend(cfg: AttrDict) -> None:
    use_gpu = cfg.MACHINE.DEVICE == "gpu"
    if not cfg.SLURM.get("USE_SLURM", False):  # else checked on the job's nodes
        check_gpus(cfg)
    backend = cfg.DISTRIBUTED.BACKEND
    if backend == "auto":
        cfg.DISTRIBUTED.BACKEND = "nccl" if use_gpu else "gloo"
    elif backend == "nccl" and not use_gpu:
        # VISSL's configs name nccl; on a CPU run (config.MACHINE.DEVICE=cpu) only gloo can work
        logger.warning("config.DISTRIBUTED.BACKEND=nccl needs GPUs; this run has "
                       "config.MACHINE.DEVICE=cpu and uses gloo instead")
        cfg.DISTRIBUTED.BACKEND = "gloo"


def _check_phases(cfg: AttrDict, reads_data: bool = True) -> None:
    if cfg.TEST_ONLY and not cfg.TEST_MODEL:
        raise ConfigError("config.TEST_ONLY=true needs config.TEST_MODEL=true")
    if reads_data and not cfg.TEST_ONLY and not cfg.DATA.TRAIN.DATA_SOURCES:
        raise ConfigError("config.DATA.TRAIN.DATA_SOURCES is empty: name at least one data source")
    if reads_data and cfg.TEST_MODEL and not cfg.DATA.TEST.DATA_SOURCES:
        raise ConfigError(
            "config.TEST_MODEL=true but config.DATA.TEST.DATA_SOURCES is empty; "
            "name a test data source or set config.TEST_MODEL=false"
        )
    steps = cfg.OPTIMIZER.get("gradient_accumulation_steps", 1)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(
            f"config.OPTIMIZER.gradient_accumulation_steps must be an integer >= 1 (1: no "
            f"accumulation), got {steps!r}"
        )


def global_batch_size(cfg: AttrDict) -> int:
    """Samples per optimizer update: the batch of every process, times the micro-batches
    accumulated into one update (OPTIMIZER.gradient_accumulation_steps)."""
    world = cfg.DISTRIBUTED.NUM_NODES * cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    accumulation = int(cfg.OPTIMIZER.get("gradient_accumulation_steps", 1) or 1)
    return cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA * world * accumulation


def crops_per_sample(transforms) -> int:
    """The views each sample gets from a transform list (ImgPilToMultiCrop's total_num_crops or
    ImgReplicatePil's num_times); 0 when no transform says."""
    for spec in transforms or []:
        name = spec.get("name") if isinstance(spec, dict) else None
        if name == "ImgPilToMultiCrop":
            return int(spec.get("total_num_crops", 0))
        if name == "ImgReplicatePil":
            return int(spec.get("num_times", 2))
    return 0


_LARS_ONLY = {"exclude_bias_and_norm": False, "eta": 0.001}  # key -> its default


def _warn_lars_only_settings(cfg: AttrDict) -> None:
    """OPTIMIZER.eta and exclude_bias_and_norm are read by the lars optimizer only (VISSL's
    other optimizers ignored them too): said once when another optimizer is given them."""
    optimizer = cfg.OPTIMIZER
    if optimizer.name == "lars":
        return
    for key, default in _LARS_ONLY.items():
        if optimizer.get(key, default) != default:
            logger.warning("config.OPTIMIZER.%s=%s is read by the lars optimizer only: the %s "
                           "optimizer ignores it (as VISSL's did)", key, optimizer[key],
                           optimizer.name)


LIST_METERS = ("accuracy_list_meter", "mean_ap_list_meter", "precision_at_k_list_meter",
               "recall_at_k_list_meter")


def _derive_meter_settings(cfg: AttrDict) -> None:
    """A feature-evaluation model (EVAL_MODE_ON, trunk or trunk and head frozen, stages in
    LINEAR_EVAL_FEAT_POOL_OPS_MAP) gives one output per evaluated stage: as VISSL did, each
    list meter of METERS.names gets num_meters = the number of stages and meter_names = their
    names (whatever the file says: VISSL's model fragments change the stages, not the
    meters)."""
    settings = cfg.MODEL.FEATURE_EVAL_SETTINGS
    stages = settings.LINEAR_EVAL_FEAT_POOL_OPS_MAP
    if not (settings.EVAL_MODE_ON and (settings.FREEZE_TRUNK_ONLY
                                       or settings.FREEZE_TRUNK_AND_HEAD) and stages):
        return
    for name in [cfg.METERS.get("name"), *(cfg.METERS.get("names") or [])]:  # older key too
        if name in LIST_METERS and isinstance(cfg.METERS.get(name), dict):
            cfg.METERS[name].num_meters = len(stages)
            cfg.METERS[name].meter_names = [str(stage[0]) for stage in stages]


def _check_ema_model(cfg: AttrDict) -> None:
    """HOOKS.EMA_MODEL's settings, when the average is kept."""
    ema = cfg.HOOKS.EMA_MODEL
    if not (ema.SAVE_EMA_MODEL or ema.ENABLE_EMA_METERS):
        return
    where = "config.HOOKS.EMA_MODEL"
    if cfg.TEST_ONLY:
        raise ConfigError(f"{where}: an average of the weights is kept while training; "
                          "config.TEST_ONLY=true trains nothing: leave SAVE_EMA_MODEL and "
                          "ENABLE_EMA_METERS off")
    if ema.EMA_DEVICE not in ("cpu", "gpu"):
        raise ConfigError(f"{where}.EMA_DEVICE={ema.EMA_DEVICE!r} is not one of cpu, gpu")
    if ema.EMA_DEVICE == "gpu" and cfg.MACHINE.DEVICE != "gpu":
        raise ConfigError(f"{where}.EMA_DEVICE=gpu needs config.MACHINE.DEVICE=gpu; on a CPU "
                          f"run set {where}.EMA_DEVICE=cpu")
    if not isinstance(ema.UPDATE_ITER, int) or ema.UPDATE_ITER < 1:
        raise ConfigError(f"{where}.UPDATE_ITER must be an integer >= 1, got {ema.UPDATE_ITER!r}")
    for key in ("DECAY", "WARMUP"):
        if not 0.0 <= ema[key] <= 1.0:
            raise ConfigError(f"{where}.{key} must be in [0, 1], got {ema[key]}")
    if ema.ENABLE_EMA_METERS and not cfg.TEST_MODEL:
        raise ConfigError(f"{where}.ENABLE_EMA_METERS=true computes the meters of the test "
                          "phases with the average: it needs config.TEST_MODEL=true")


def _derive_extraction_splits(cfg: AttrDict) -> None:
    """A TEST_ONLY config whose TRAIN split names no data (VISSL's geolocalization files):
    VISSL's task had the TEST split alone and extracted it; EXTRACT_FEATURES.SPLITS drops
    TRAIN rather than refusing its missing data."""
    splits = [str(split).upper() for split in cfg.EXTRACT_FEATURES.SPLITS]
    if cfg.TEST_ONLY and "TRAIN" in splits and "TEST" in splits \
            and not cfg.DATA.TRAIN.DATA_SOURCES:
        cfg.EXTRACT_FEATURES.SPLITS = [split for split in splits if split != "TRAIN"]


def derive_settings(cfg: AttrDict, reads_data: bool = True) -> AttrDict:
    """Fill derived values in place (backend, absolute paths, scaled lr) and check combinations;
    the loss and the trunk the config names derive their own settings (``derive_config``,
    registered with utils/derivations.py when their packages are imported).
    ``reads_data=False``: the config's images come from elsewhere (tools/instance_retrieval_test.py
    reads IMG_RETRIEVAL.DATASET_PATH), so DATA's splits may name no source."""
    _check_choices(cfg)
    _derive_device_and_backend(cfg)
    for split in ("TRAIN", "TEST"):  # DATASET_NAMES -> paths, before the phases are checked
        resolve_dataset_names(cfg, split)
    _check_phases(cfg, reads_data)
    _check_ema_model(cfg)
    run_config_derivations(cfg)  # the components' own: the loss's, the trunk's, a collator's
    _warn_lars_only_settings(cfg)
    _derive_meter_settings(cfg)
    _derive_extraction_splits(cfg)
    cfg.CHECKPOINT.DIR = os.path.abspath(os.path.expanduser(cfg.CHECKPOINT.DIR))
    if (cfg.MODEL.get("SHARDED_DDP_SETUP") or {}).get("USE_SDP", False):
        cfg.OPTIMIZER.use_zero = True  # ShardedDataParallel works on a sharded optimizer
    cfg.OPTIMIZER = apply_auto_lr_scaling(cfg.OPTIMIZER, global_batch_size(cfg))
    return cfg
