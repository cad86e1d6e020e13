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
    "model/trunk_params": ("  MODEL: {TRUNK: {TRUNK_PARAMS: {RESNETS: {DEPTH: 101}}}}", None),
    "model/trunk_params_both": (
        "  MODEL: {TRUNK: {RESNETS: {DEPTH: 152}, TRUNK_PARAMS: {RESNETS: {DEPTH: 101}}}}", None),
    "model/fsdp": ("  MODEL: {TRUNK: {NAME: regnet_fsdp}, FSDP_CONFIG: {flatten_parameters: "
                   "false, mixed_precision: true, compute_dtype: float16, "
                   "AUTO_WRAP_THRESHOLD: 100000000}}", None),
    "model/fsdp_sync": ("  MODEL: {FSDP_CONFIG: {FORCE_SYNC_CUDA: true}}",
                        "config.MODEL.FSDP_CONFIG.FORCE_SYNC_CUDA=True is not supported: "
                        "synchronising CUDA between FSDP units"),
    "model/resnet_sk": ("  MODEL: {TRUNK: {NAME: resnet_sk, RESNETS_SK: {DEPTH: 152, "
                        "WIDTH_MULTIPLIER: 3, SK_RATIO: 0.0625}}}", None),
    "model/swin": ("  MODEL: {TRUNK: {NAME: swin_transformer}}", None),
    "model/classy_vit": ("  MODEL: {TRUNK: {NAME: classy_vit}}", None),
    "model/mnv3_timm": ("  MODEL: {TRUNK: {NAME: mobilenetv3_timm}}", None),
    "model/amp": ("  MODEL: {AMP_PARAMS: {USE_AMP: true, AMP_TYPE: apex, AMP_ARGS: {opt_level: O1}}}",
                  None),  # composes; apex itself is refused when the model is built
    "loss/nce": ("  LOSS: {name: nce_loss_with_memory, nce_loss_with_memory: {temperature: 0.07}}",
                 None),
    "loss/msn_distill": ("  LOSS: {name: msn_distillation_loss}", None),
    "loss/simclr": ("  LOSS: {simclr_info_nce_loss: {buffer_params: {world_size: 8, "
                    "effective_batch_size: 1024}}}", None),
    "optimizer/head_lr": ("  OPTIMIZER: {head_optimizer_params: {use_different_lr: true}}",
                          None),
    "optimizer/scaling": ("  OPTIMIZER: {param_schedulers: {lr: {auto_lr_scaling: "
                          "{scaling_type: sqrt}}}}", "scaling_type='sqrt' is not supported"),
    "meters/old_name": ("  METERS: {name: accuracy_list_meter}", None),
    "meters/map": ("  METERS: {names: [mean_ap_list_meter]}", None),
    "meters/mask": ("  METERS: {model_output_mask: true}", None),
    "trainer/task": ("  TRAINER: {TASK_NAME: self_supervision_task}", None),
    "checkpoint/symlink": ("  CHECKPOINT: {USE_SYMLINK_CHECKPOINT_FOR_RESUME: true}", None),
    "extract/chunks": ("  EXTRACT_FEATURES: {CHUNK_THRESHOLD: 1000}", None),
    "data/prefix": ("  DATA: {TRAIN: {REMOVE_IMG_PATH_PREFIX: /mnt/a, NEW_IMG_PATH_PREFIX: /b}}",
                    None),
    "hooks/perf": ("  HOOKS: {PERF_STATS: {MONITOR_PERF_STATS: true, ROLLING_BTIME_FREQ: 313}}",
                   None),
    "hooks/profiler": ("  PROFILING: {RUNTIME_PROFILING: {USE_PROFILER: true}}",
                       "config.PROFILING.RUNTIME_PROFILING.USE_PROFILER=True is not supported"),
    "hooks/quiet": ("  HOOKS: {MEMORY_SUMMARY: {PRINT_MEMORY_SUMMARY: false}, LOG_GPU_STATS: false}",
                    None),
    "distributed/nccl": ("  DISTRIBUTED: {NCCL_DEBUG: true, NCCL_SOCKET_NTHREADS: 4}", None),
    "distributed/manual": ("  DISTRIBUTED: {MANUAL_GRADIENT_REDUCTION: true}",
                           "config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION=True is not supported: "
                           "gradients are reduced by DDP's hooks"),
    "machine/cpu": ("  MACHINE: {DEVICE: cpu}\n  VERBOSE: true", None),
    "slurm/job": ("  SLURM: {USE_SLURM: false, NAME: vissl, ADDITIONAL_PARAMETERS: {account: a}}",
                  None),
    "benchmark/svm": ("  SVM: {costs: {costs_list: [0.01, 0.1, 1.0, 2, 5, 10]}, normalize: true, "
                      "cls_list: [0, 3], cross_val_folds: 3, force_retrain: false}\n"
                      "  SVM_FEATURES_PATH: /features", None),
    "benchmark/svm_low_shot": ("  SVM: {low_shot: {dataset_name: places205, k_values: [10]}}",
                               "config.SVM.low_shot.dataset_name='places205' is not supported: "
                               "the low-shot SVM benchmark"),
    "data/everstore": ("  DATA: {TRAIN: {DATA_SOURCES: [everstore], LABEL_SOURCES: [disk_filelist]}}",
                       "config.DATA.TRAIN.DATA_SOURCES=everstore is not supported: everstore is an "
                       "image store internal"),
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
    with pytest.raises(ConfigError, match="config.CHECKPOINT.BACKEND=4 is not "
                                          "supported: checkpoints are written to disk only"):
        compose_config([QUICK, "config.CHECKPOINT.BACKEND=4"])


def test_typo_of_a_vissl_key_still_gets_did_you_mean():
    with pytest.raises(ConfigError, match="unknown config key 'config.DATA.TRAIN.MMAP_MOD': did "
                                          "you mean 'config.DATA.TRAIN.MMAP_MODE'"):
        compose_config([QUICK, "config.DATA.TRAIN.MMAP_MOD=false"])


def test_refusal_says_what_to_do_instead():
    with pytest.raises(ConfigError, match=r"NON_TRAINABLE_PARAMS=\['trunk.conv1.weight'\] is not "
                                          r"supported: not implemented; use "
                                          r"MODEL.TEMP_FROZEN_PARAMS_ITER_MAP"):
        compose_config([QUICK, "config.MODEL.NON_TRAINABLE_PARAMS=[trunk.conv1.weight]"])


def test_open_vissl_sections_take_any_keys():
    _, cfg = compose_config([
        QUICK, "+config.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.PARAMS.ratio=0.5",
        "+config.DISTILLATION.TEACHER_MODEL.TRUNK.RESNETS.DEPTH=50"])
    assert cfg.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.PARAMS.ratio == 0.5



def _plain_config():
    """(a config with every default, the schema) as plain dicts, without Hydra."""
    import copy

    from ssl_engine.config.compose import load_defaults

    schema = load_defaults()
    schema.pop("defaults", None)
    return copy.deepcopy(schema), schema


def test_older_vissl_keys_move_to_their_place_with_one_warning(caplog):
    from ssl_engine.config.validate import validate_config

    cfg, schema = _plain_config()
    cfg["config"]["MODEL"]["TRUNK"]["TRUNK_PARAMS"] = {
        "RESNETS": {"DEPTH": 101, "WIDTH_MULTIPLIER": 2}, "REGNET": {"name": "regnet_y_400mf"}}
    cfg["config"]["MONITOR_PERF_STATS"] = True
    with caplog.at_level("WARNING"):
        validate_config(cfg, schema)
    trunk = cfg["config"]["MODEL"]["TRUNK"]
    assert "TRUNK_PARAMS" not in trunk and "MONITOR_PERF_STATS" not in cfg["config"]
    assert (trunk["RESNETS"]["DEPTH"], trunk["RESNETS"]["WIDTH_MULTIPLIER"]) == (101, 2)
    assert trunk["RESNETS"]["GROUPS"] == schema["config"]["MODEL"]["TRUNK"]["RESNETS"]["GROUPS"]
    assert trunk["REGNET"]["name"] == "regnet_y_400mf"
    assert cfg["config"]["HOOKS"]["PERF_STATS"]["MONITOR_PERF_STATS"] is True
    warnings = [r.getMessage() for r in caplog.records if "older VISSL key" in r.getMessage()]
    assert len(warnings) == 2
    assert "config.MODEL.TRUNK.TRUNK_PARAMS.<key> is now config.MODEL.TRUNK.<key> (RESNETS.DEPTH" \
        in warnings[0]
    assert "config.MONITOR_PERF_STATS is now config.HOOKS.PERF_STATS.MONITOR_PERF_STATS" \
        in warnings[1]


def test_older_and_current_key_set_differently_keeps_the_current_one(caplog):
    from ssl_engine.config.validate import validate_config

    cfg, schema = _plain_config()
    trunk = cfg["config"]["MODEL"]["TRUNK"]
    trunk["RESNETS"]["DEPTH"] = 152
    trunk["TRUNK_PARAMS"] = {"RESNETS": {"DEPTH": 101}}
    with caplog.at_level("WARNING", logger="ssl_engine.config.legacy_keys"):
        validate_config(cfg, schema)
    assert trunk["RESNETS"]["DEPTH"] == 152 and "TRUNK_PARAMS" not in trunk
    assert ("config.MODEL.TRUNK.TRUNK_PARAMS.RESNETS.DEPTH=101 (VISSL's older key) and "
            "config.MODEL.TRUNK.RESNETS.DEPTH=152 are both set: config.MODEL.TRUNK.RESNETS.DEPTH "
            "is used, as VISSL would") in caplog.text


def test_an_unknown_key_under_trunk_params_is_named_at_its_new_place():
    from ssl_engine.config.validate import validate_config

    cfg, schema = _plain_config()
    cfg["config"]["MODEL"]["TRUNK"]["TRUNK_PARAMS"] = {"RESNETS": {"DEPTHH": 50}}
    with pytest.raises(ConfigError, match="unknown config key 'config.MODEL.TRUNK.RESNETS.DEPTHH'"
                                          ": did you mean 'config.MODEL.TRUNK.RESNETS.DEPTH'"):
        validate_config(cfg, schema)


def test_older_key_dropped_from_the_command_line(tmp_path, monkeypatch):
    _write_tree(tmp_path, monkeypatch)
    _, cfg = compose_config(["config=model/trunk_params_both",
                             "~config.MODEL.TRUNK.TRUNK_PARAMS"])
    assert cfg.MODEL.TRUNK.RESNETS.DEPTH == 152 and "TRUNK_PARAMS" not in cfg.MODEL.TRUNK


def test_list_meters_of_a_feature_evaluation_model_count_its_stages():
    """VISSL's model fragments change the evaluated stages, not the meters: as VISSL did, each
    list meter gets one meter per stage, named after it; a training model keeps its setting."""
    from ssl_engine.config import load_config

    meters = ["config.METERS.names=[accuracy_list_meter,mean_ap_list_meter]",
              "config.METERS.accuracy_list_meter.num_meters=1"]
    _, cfg = load_config(["config=feature_extraction/extract_resnet_digits", *meters])
    for name in ("accuracy_list_meter", "mean_ap_list_meter"):
        assert cfg.METERS[name].num_meters == 2
        assert cfg.METERS[name].meter_names == ["res4", "res5avg"]
    _, cfg = load_config(["config=feature_extraction/extract_resnet_digits", *meters,
                          "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=false"])
    assert cfg.METERS.accuracy_list_meter.num_meters == 1
    _, cfg = load_config(["config=feature_extraction/extract_resnet_digits",  # VISSL's older key
                          "config.METERS.name=accuracy_list_meter"])
    assert cfg.METERS.accuracy_list_meter.num_meters == 2
