"""VISSL's key set: every VISSL key is known; unsupported ones are accepted at their defaults and
refused by name otherwise; typos still get a suggestion."""
from pathlib import Path

import pytest
import yaml

from ssl_engine.config import ConfigError, compose_config

REPO = Path(__file__).resolve().parents[1]
QUICK = "config=test/quick_simclr_synthetic"

# name -> (the config: section text under `config:`, None if accepted else a part of the refusal)
VISSL_TREE = {
    "data/folders": ("""
  DATA:
    NUM_DATALOADER_WORKERS: 0
    DDP_BUCKET_CAP_MB: 25
    TRAIN:
      DATA_SOURCES: [synthetic]
      DATASET_NAMES: [imagenet1k_folder]
      MMAP_MODE: true
      COPY_DESTINATION_DIR: /tmp/imagenet1k/
      DATA_LIMIT_SAMPLING: {SEED: 0}
      USE_STATEFUL_DISTRIBUTED_SAMPLER: true
""", None),
    "data/copy": ("  DATA: {TRAIN: {COPY_TO_LOCAL_DISK: true}}", None),
    "data/balanced": ("  DATA: {TEST: {DATA_LIMIT_SAMPLING: {IS_BALANCED: true}}}", None),
    "data/sampler": ("  DATA: {TRAIN: {STRATIFIED_SAMPLER: {ENABLED: true}}}",
                     "config.DATA.TRAIN.STRATIFIED_SAMPLER.ENABLED=True is not supported: the "
                     "stratified sampler is not implemented"),
    "model/regnet": ("  MODEL: {TRUNK: {NAME: regnet, REGNET: {name: regnet_y_400mf}}}", None),
    "model/resnext": ("  MODEL: {TRUNK: {RESNETS: {DEPTH: 50, GROUPS: 32}}}", None),
    "model/resnet_sk": ("  MODEL: {TRUNK: {NAME: resnet_sk}}",
                        "config.MODEL.TRUNK.NAME=resnet_sk is not supported: the resnet_sk trunk"),
    "model/fsdp": ("  MODEL: {FSDP_CONFIG: {flatten_parameters: false}}",
                   "config.MODEL.FSDP_CONFIG.flatten_parameters=False is not supported: "
                   "fairscale's FSDP settings; TRAINER.TASK_NAME=self_supervision_fsdp_task"),
    "model/amp": ("  MODEL: {AMP_PARAMS: {USE_AMP: true, AMP_TYPE: apex, AMP_ARGS: {opt_level: O1}}}",
                  None),  # composes; apex itself is refused when the model is built
    "loss/nce": ("  LOSS: {name: nce_loss_with_memory, nce_loss_with_memory: {temperature: 0.07}}",
                 "config.LOSS.name=nce_loss_with_memory is not supported"),
    "loss/simclr": ("  LOSS: {simclr_info_nce_loss: {buffer_params: {world_size: 8, "
                    "effective_batch_size: 1024}}}", None),
    "optimizer/head_lr": ("  OPTIMIZER: {head_optimizer_params: {use_different_lr: true}}",
                          "use OPTIMIZER.lr_multipliers"),
    "optimizer/scaling": ("  OPTIMIZER: {param_schedulers: {lr: {auto_lr_scaling: "
                          "{scaling_type: sqrt}}}}", "scaling_type='sqrt' is not supported"),
    "meters/old_name": ("  METERS: {name: accuracy_list_meter}", None),
    "meters/map": ("  METERS: {names: [mean_ap_list_meter]}", None),
    "meters/mask": ("  METERS: {model_output_mask: true}",
                    "config.METERS.model_output_mask=True is not supported"),
    "trainer/task": ("  TRAINER: {TASK_NAME: self_supervision_task}", None),
    "checkpoint/symlink": ("  CHECKPOINT: {USE_SYMLINK_CHECKPOINT_FOR_RESUME: true}",
                           "a pointer file, written atomically"),
    "hooks/perf": ("  HOOKS: {PERF_STATS: {MONITOR_PERF_STATS: true, ROLLING_BTIME_FREQ: 313}}",
                   None),
    "hooks/profiler": ("  PROFILING: {RUNTIME_PROFILING: {USE_PROFILER: true}}",
                       "config.PROFILING.RUNTIME_PROFILING.USE_PROFILER=True is not supported"),
    "hooks/quiet": ("  HOOKS: {MEMORY_SUMMARY: {PRINT_MEMORY_SUMMARY: false}, LOG_GPU_STATS: false}",
                    None),
    "distributed/nccl": ("  DISTRIBUTED: {NCCL_DEBUG: true}",
                         "config.DISTRIBUTED.NCCL_DEBUG=True is not supported: no effect on a CPU"
                         " or with torch's own tools; set the environment variable NCCL_DEBUG=INFO"),
    "machine/cpu": ("  MACHINE: {DEVICE: cpu}\n  VERBOSE: true", None),
    "slurm/job": ("  SLURM: {USE_SLURM: false, NAME: vissl, ADDITIONAL_PARAMETERS: {account: a}}",
                  None),
    "benchmark/svm": ("  SVM: {costs: {costs_list: [0.01, 0.1, 1.0, 2, 5, 10]}, normalize: true, "
                      "cls_list: [0, 3], cross_val_folds: 3, force_retrain: false}\n"
                      "  SVM_FEATURES_PATH: /features", None),
    "benchmark/svm_low_shot": ("  SVM: {low_shot: {dataset_name: places205, k_values: [10]}}",
                               "config.SVM.low_shot.dataset_name='places205' is not supported: "
                               "the low-shot SVM benchmark"),
    "global/version": ("  MULTI_PROCESSING_METHOD: forkserver\nVERSION: 1", None),
}


def _write_tree(tmp_path, monkeypatch) -> None:
    configs = tmp_path / "configs" / "config"
    configs.mkdir(parents=True)
    (configs / "defaults.yaml").write_text((REPO / "configs/config/defaults.yaml").read_text())
    for name, (body, _) in VISSL_TREE.items():
        path = configs / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# @package _global_\nconfig:\n{body}\n")
    monkeypatch.setenv("SSL_ENGINE_CONFIG_DIR", str(tmp_path / "configs"))


def test_vissl_style_tree_composes_or_is_refused_by_name(tmp_path, monkeypatch):
    _write_tree(tmp_path, monkeypatch)
    for name, (_, refusal) in VISSL_TREE.items():
        if refusal is None:
            compose_config([f"config={name}"])
            continue
        with pytest.raises(ConfigError) as err:
            compose_config([f"config={name}"])
        assert refusal in str(err.value), name
        assert "unknown" not in str(err.value), name


def _vissl_keys():
    def flat(node, prefix=""):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict) and value:
                yield from flat(value, path)
            else:
                yield path
    text = (REPO.parent / "shared/vissl/vissl/config/defaults.yaml")
    return sorted(flat(yaml.safe_load(text.read_text()))) if text.is_file() else []


def test_every_vissl_key_is_known():
    from ssl_engine.config.compose import load_defaults
    from ssl_engine.config.validate import check_key

    schema = load_defaults()
    keys = [k for k in _vissl_keys() if not k.startswith(("defaults", "hydra."))]
    if not keys:
        pytest.skip("VISSL's defaults.yaml is not beside the repository")
    assert len(keys) > 550
    for key in keys:
        check_key(key, schema)  # raises "unknown config key" for a missing one


def test_unsupported_key_at_default_is_accepted_and_other_value_refused():
    _, cfg = compose_config([QUICK, "config.DATA.TRAIN.BASE_DATASET=generic_ssl"])
    assert cfg.DATA.TRAIN.BASE_DATASET == "generic_ssl"
    with pytest.raises(ConfigError, match=r"^config.DATA.TRAIN.BASE_DATASET='my_dataset' is not "
                                          r"supported: only the generic_ssl dataset exists$"):
        compose_config([QUICK, "config.DATA.TRAIN.BASE_DATASET=my_dataset"])


def test_unsupported_value_of_another_type_is_refused_as_unsupported():
    with pytest.raises(ConfigError, match="config.DISTRIBUTED.NCCL_SOCKET_NTHREADS=4 is not "
                                          "supported.*NCCL_SOCKET_NTHREADS instead"):
        compose_config([QUICK, "config.DISTRIBUTED.NCCL_SOCKET_NTHREADS=4"])


def test_typo_of_a_vissl_key_still_gets_did_you_mean():
    with pytest.raises(ConfigError, match="unknown config key 'config.DATA.TRAIN.MMAP_MOD': did "
                                          "you mean 'config.DATA.TRAIN.MMAP_MODE'"):
        compose_config([QUICK, "config.DATA.TRAIN.MMAP_MOD=false"])


def test_apex_like_key_says_what_to_use_instead():
    with pytest.raises(ConfigError, match="set the environment variable NCCL_DEBUG=INFO instead"):
        compose_config([QUICK, "config.DISTRIBUTED.NCCL_DEBUG=true"])


def test_open_vissl_sections_take_any_keys():
    _, cfg = compose_config([
        QUICK, "+config.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.PARAMS.ratio=0.5",
        "+config.DISTILLATION.TEACHER_MODEL.TRUNK.RESNETS.DEPTH=50"])
    assert cfg.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.PARAMS.ratio == 0.5

