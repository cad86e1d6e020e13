"""VISSL keys and names the engine does not implement: the one list, with the reasons.

Every key of VISSL's defaults.yaml is a key of configs/config/defaults.yaml. A key listed in
``UNSUPPORTED_KEYS`` takes only its default (and the values named with ``also``): any other
value, from a config file or the command line, is refused before launch with the reason given
here. ``UNSUPPORTED_NAMES`` does the same for component names VISSL knows (trunks, losses,
meters) that the engine has not got. A component's own keys and names are declared by the
component (``ssl_engine.utils.key_rules``); ``unsupported_keys`` and ``unsupported_names`` give
both together.

Settings that act only through a refused switch or name are not listed (the sampler settings
under STRATIFIED_SAMPLER besides ENABLED, the settings of a loss the engine has not got ...): a
run can only start with the switch at its default, where VISSL reads them neither.

Patterns: ``*`` stands for one part of the dotted path (``config.DATA.*.MMAP_MODE`` is the
key of TRAIN and of TEST); a pattern naming a section refuses any change inside it, naming the
changed key. To implement a feature, delete its entries.
"""
from typing import Any, Dict, Union

from ssl_engine.utils import key_rules
from ssl_engine.utils.key_rules import Refusal


def also(reason: str, *values: Any) -> Refusal:
    """An entry that accepts ``values`` too (e.g. turning off what the engine never does)."""
    return Refusal(reason, values)


_NO_CPU = "no effect on a CPU or with torch's own tools; "
_TOOL = "VISSL's {} tool is not part of the engine (the section is read by that tool only)"

UNSUPPORTED_KEYS: Dict[str, Union[str, Refusal]] = {
    # top level and globals
    "node_id": "the machine rank is config.DISTRIBUTED.NODE_ID",
    "config.REPRODUCIBILITY.CUDDN_DETERMINISTIC": "deterministic cuDNN is not implemented",
    # HOOKS
    "config.HOOKS.TENSORBOARD_SETUP.LOG_DIR":
        "events go to CHECKPOINT.DIR/<EXPERIMENT_LOG_DIR>; set those instead",
    "config.HOOKS.TENSORBOARD_SETUP.LOG_PARAMS_GRADIENTS": also(
        "gradient histograms are not written", False),
    "config.HOOKS.TENSORBOARD_SETUP.LOG_PARAMS_EVERY_N_ITERS": also(
        "parameter histograms are written at phase ends only (-1)", -1),
    "config.MONITORING.MONITOR_ACTIVATION_STATISTICS": "activation statistics are not implemented",
    "config.PROFILING.RUNTIME_PROFILING.USE_PROFILER": "the profiler hook is not implemented",
    "config.PROFILING.MEMORY_PROFILING.TRACK_BY_LAYER_MEMORY": "the profiler hook is not implemented",
    # DATA
    "config.DATA.ENABLE_ASYNC_GPU_COPY": also(
        _NO_CPU + "batches are copied to the GPU in the step (pinned with DATA.PIN_MEMORY)", False),
    "config.DATA.DDP_BUCKET_CAP_MB": "DDP keeps torch's default gradient buckets (25 MB)",
    "config.DATA.*.USE_DEBUGGING_SAMPLER": "the debugging sampler is not implemented",
    "config.DATA.*.STRATIFIED_SAMPLER.ENABLED": "the stratified sampler is not implemented",
    "config.DATA.*.POWER_LAW_SAMPLER.ENABLED": "the power-law sampler is not implemented",
    "config.DATA.*.BASE_DATASET": "only the generic_ssl dataset exists",
    "config.DATA.*.RANDOM_SYNTHETIC_IMAGES":
        "the synthetic source always gives random images; see DATA.<split>.SYNTHETIC",
    "config.DATA.*.RANDOM_SYNTHETIC_LABELS": "use DATA.<split>.SYNTHETIC.NUM_CLASSES",
    # METERS
    "config.METERS.enable_training_meter": "meters are computed in every phase",
    # MODEL
    "config.MODEL.BASE_MODEL_NAME": "only multi_input_output_model exists",
    "config.MODEL.NON_TRAINABLE_PARAMS": "not implemented; use MODEL.TEMP_FROZEN_PARAMS_ITER_MAP "
                                         "with a large iteration count",
    "config.MODEL.SINGLE_PASS_EVERY_CROP": "crops of one size always go through together",
    # FSDP_CONFIG: flatten_parameters, mixed_precision, compute_dtype, fp32_reduce_scatter and
    # AUTO_WRAP_THRESHOLD are read by self_supervision_fsdp_task (torch's FSDP2; docs/scaling.md)
    "config.MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP":
        "deriving the FSDP settings is not implemented; set "
        "TRAINER.TASK_NAME=self_supervision_fsdp_task and the FSDP_CONFIG keys yourself",
    "config.MODEL.FSDP_CONFIG.AMP_TYPE": "apex is not supported; FSDP's precision is "
                                         "FSDP_CONFIG.mixed_precision/compute_dtype",
    "config.MODEL.FSDP_CONFIG.FORCE_SYNC_CUDA":
        "synchronising CUDA between FSDP units (a debugging aid) is not implemented",
    "config.MODEL.FSDP_CONFIG.bucket_cap_mb":
        "torch's FSDP2 reduce-scatters each unit's gradients in one call: there are no buckets",
    "config.MODEL.FSDP_CONFIG.clear_autocast_cache":
        "autocast's cache is always cleared when the forward's autocast ends",
    "config.MODEL.FSDP_CONFIG.verbose": "the FSDP units are always logged",
    # DISTILLATION: the teacher is built like MODEL, with MODEL's refusals
    "config.DISTILLATION.TEACHER_MODEL.BASE_MODEL_NAME": "only multi_input_output_model exists",
    "config.DISTILLATION.TEACHER_MODEL.SINGLE_PASS_EVERY_CROP":
        "crops of one size always go through together",
    "config.DISTILLATION.TEACHER_MODEL.FSDP_CONFIG":
        "the teacher is not sharded: every process holds it whole",
    # OPTIMIZER
    "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.scaling_type":
        "the lr is scaled linearly with the batch",
    "config.OPTIMIZER.param_schedulers.lr_head.auto_lr_scaling.scaling_type":
        "the lr is scaled linearly with the batch",
    # EXTRACT_FEATURES
    "config.EXTRACT_FEATURES.MAP_FEATURES_TO_IMG_NAME":
        "features are written as <split>_<layer>_features.npy in dataset order",
    # NEAREST_NEIGHBOR
    "config.NEAREST_NEIGHBOR.L2_NORM_FEATS": also(
        "features are always l2-normalised (cosine similarity)", True),
    "config.NEAREST_NEIGHBOR.OPTIMIZE_MEMORY": also(
        "test features are always compared in chunks (NEAREST_NEIGHBOR.CHUNK_SIZE)", True),
    "config.NEAREST_NEIGHBOR.FEATURES.PATH": "tools/nearest_neighbor_test.py extracts the features itself",
    # VISSL's separate tools
    "config.CLUSTERFIT.CLUSTER_BACKEND": "k-means runs with faiss (where installed) or the "
                                         "engine's exact k-means; no other backend",
    "config.RANKING.*": _TOOL.format("ranking"),
    "config.SVM.low_shot": "the low-shot SVM benchmark (VISSL's train_svm_low_shot.py) is not "
                           "implemented; tools/train_svm.py trains on every train sample, and "
                           "tools/low_shot_test.py is the low-shot k-NN",
    "config.IMG_RETRIEVAL.EVAL_BINARY_PATH": "the original Oxford/Paris protocol (VGG's "
                                             "compute_ap program) is not implemented; "
                                             "tools/instance_retrieval_test.py scores the "
                                             "Revisited Oxford/Paris and Copydays itself",
    "config.IMG_RETRIEVAL.WHITEN_IMG_LIST": "the whitening is fitted on the images of "
                                            "IMG_RETRIEVAL.TRAIN_DATASET_NAME; an image list "
                                            "is not read",
    "config.IMG_RETRIEVAL.FEATURE_EXTRACTION_DIR": "tools/instance_retrieval_test.py computes "
                                                   "its features itself; reading them from an "
                                                   "extraction folder is not implemented",
    "config.LOW_SHOT_BENCHMARK.METHOD": "the low-shot benchmark's svm method is not implemented "
                                        "(tools/low_shot_test.py runs logistic_regression)",
    # CHECKPOINT
    "config.CHECKPOINT.APPEND_DISTR_RUN_ID": "put the run id in CHECKPOINT.DIR yourself",
    "config.CHECKPOINT.BACKEND": "checkpoints are written to disk only",
    "config.CHECKPOINT.LATEST_CHECKPOINT_RESUME_FILE_NUM":
        "runs resume from the newest checkpoint (each is written atomically, so it is whole)",
    # DISTRIBUTED
    "config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION": "gradients are reduced by DDP's hooks",
}

UNSUPPORTED_NAMES: Dict[str, Dict[str, str]] = {
    **{f"config.DATA.*.{key}": {
        name: f"{name} is an image store internal to VISSL's authors; give the images as "
              "disk_folder or disk_filelist (DATA_PATHS, or a dataset catalog entry)"
        for name in ("everstore", "airstore")} for key in ("DATA_SOURCES", "LABEL_SOURCES")},
}


def unsupported_keys() -> Dict[str, Refusal]:
    """The table above and the keys the imported components refuse, as ``Refusal``s."""
    table = {path: entry if isinstance(entry, Refusal) else Refusal(entry)
             for path, entry in UNSUPPORTED_KEYS.items()}
    return {**table, **key_rules.refused_keys()}


def unsupported_names() -> Dict[str, Dict[str, str]]:
    """The names above and those the imported components refuse, by key."""
    names = {key: dict(table) for key, table in UNSUPPORTED_NAMES.items()}
    for key, table in key_rules.refused_names().items():
        names.setdefault(key, {}).update(table)
    return names
