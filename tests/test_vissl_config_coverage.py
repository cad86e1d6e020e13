"""extra_scripts/vissl_config_coverage.py on a small VISSL-style tree the test writes: which
files compose and validate, how fragments pair with their base, how refusals are grouped."""
import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

DATA = """  DATA:
    NUM_DATALOADER_WORKERS: 0
    TRAIN: {{DATA_SOURCES: [{source}], DATASET_NAMES: [{name}], BATCHSIZE_PER_REPLICA: 4}}
  DISTRIBUTED: {{BACKEND: nccl}}
  TEST_MODEL: false
"""
TREE = {
    # bases (they name data); the first by name is the base of the fragments below
    "bench/a_synthetic": DATA.format(source="synthetic", name="synthetic_set"),
    "bench/b_catalog": DATA.format(source="disk_folder", name="my_folder"),
    "bench/c_not_in_catalog": DATA.format(source="disk_folder", name="in_no_catalog"),
    "bench/d_unsupported": DATA.format(source="synthetic", name="x")
    + "  CHECKPOINT: {BACKEND: manifold}\n",
    # fragments: composed over bench/a_synthetic
    "bench/models/resnet101": "  MODEL: {TRUNK: {NAME: resnet, RESNETS: {DEPTH: 101}}}\n",
    "bench/models_fine/ce": "  LOSS: {name: CrossEntropyLoss}\n",
    "bench/models/typo": "  MODEL: {TRUNK: {RESNET: {DEPTH: 101}}}\n",
    "bench/semi_sup_datasets/per01": DATA.format(source="synthetic", name="subset"),
    # names TRAIN data but runs TEST (TEST_MODEL's default) without: a fragment, over a_synthetic
    "bench/perms/p100": DATA.format(source="synthetic", name="perm").replace(
        "  TEST_MODEL: false\n", "") + "  MACHINE:\n",  # an empty MACHINE, as Hydra overrides it
    # the same at the top of its folder: composed after the data file of the dataset folder in it
    "extract/trunk_only": DATA.format(source="synthetic", name="t").replace(
        "  TEST_MODEL: false\n", "  TEST_MODEL: true\n"),
    "extract/dataset/tiny": DATA.format(source="synthetic", name="tiny").replace(
        "TRAIN: {", "TEST: {DATA_SOURCES: [synthetic]}\n    TRAIN: {"),
}


def logger_levels():
    return {name: logging.getLogger(name).level for name in list(logging.root.manager.loggerDict)
            if name.startswith("ssl_engine")}


def write_tree(root: Path, tree) -> None:
    for name, body in tree.items():
        path = root / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# @package _global_\nconfig:\n{body}")
    (root / "detection").mkdir()
    (root / "detection/d2.yaml").write_text("_BASE_: base.yaml\nMODEL: {WEIGHTS: x.pkl}\n")
    (root / "dataset_catalog.json").write_text(json.dumps(
        {"my_folder": {"train": ["/nowhere/train", ""], "val": ["/nowhere/val", ""]}}))


def run_script(tmp_path, capsys, *args, tree=TREE):
    spec = importlib.util.spec_from_file_location(
        "vissl_config_coverage", REPO / "extra_scripts/vissl_config_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path / "config"
    write_tree(root, tree)
    before = {var: os.environ.get(var) for var in module.ENV_SET}
    levels = logger_levels()
    assert module.main([str(root), "--top", "20", *args]) == 0
    assert {var: os.environ.get(var) for var in module.ENV_SET} == before  # set for the run only
    after = logger_levels()  # the run quiets the engine's warnings, then restores the levels
    assert {name: after[name] for name in levels} == levels
    assert all(level == logging.NOTSET for name, level in after.items() if name not in levels)
    return module, capsys.readouterr().out


def test_coverage_table_counts_pairs_and_groups(tmp_path, capsys):
    module, out = run_script(tmp_path, capsys)
    assert "12 config files under" in out
    assert "not engine configs:   1 (no config: section; e.g. detection/d2)" in out
    assert "engine configs:       11" in out
    # a_synthetic, b_catalog (its name found in the tree's catalog, nccl -> gloo on the CPU),
    # models/resnet101, semi_sup_datasets/per01 and perms/p100 over a_synthetic,
    # extract/trunk_only after extract/dataset/tiny, and tiny (no base above it) under trunk_only
    assert "compose and validate: 7" in out
    assert "refused:              4 (4 reasons)" in out
    lines = [line.strip() for line in out.splitlines()]
    assert "1  unsupported config.LOSS.name  [bench/models_fine/ce]" in lines
    assert "1  unknown key config.MODEL.TRUNK.RESNET  [bench/models/typo]" in lines
    assert any(line.startswith("1  unsupported config.CHECKPOINT.BACKEND")
               for line in lines)
    assert any(line.startswith("1  config.DATA.TRAIN.DATASET_NAMES[N]='in_no_catalog' is not in")
               for line in lines)
    names, foreign = module.config_names(tmp_path / "config")
    pairs = dict(names)
    assert foreign == ["detection/d2"]
    assert pairs["bench/models_fine/ce"] == ["config=bench/a_synthetic",
                                             "+config/bench/models_fine=ce"]
    assert pairs["bench/perms/p100"] == ["config=bench/a_synthetic", "+config/bench/perms=p100"]
    assert pairs["extract/trunk_only"] == ["config=extract/dataset/tiny",
                                           "+config/extract=trunk_only"]
    assert pairs["extract/dataset/tiny"] == pairs["extract/trunk_only"]
    assert pairs["bench/semi_sup_datasets/per01"] == ["config=bench/a_synthetic",
                                                      "+config/bench/semi_sup_datasets=per01"]
    assert pairs["bench/b_catalog"] == ["config=bench/b_catalog"]


RETRIEVAL = """  MODEL:
    TRUNK: {{NAME: resnet, RESNETS: {{DEPTH: 50}}}}
    FEATURE_EVAL_SETTINGS:
      EVAL_MODE_ON: true
      EXTRACT_TRUNK_FEATURES_ONLY: true
      SHOULD_FLATTEN_FEATS: false
      LINEAR_EVAL_FEAT_POOL_OPS_MAP: [[res5, [Identity, []]]]
  IMG_RETRIEVAL: {{DATASET_PATH: <enter dataset path>, FEATS_PROCESSING_TYPE: {kind}}}
"""


def test_retrieval_configs_are_checked_as_the_retrieval_tool_checks_them(tmp_path, capsys):
    # no DATA: the images come from IMG_RETRIEVAL.DATASET_PATH, so the files are bases of the
    # model fragments beside them, and a DATA section is not asked for
    tree = {"retr/a_eval_rmac": RETRIEVAL.format(kind="rmac"),
            "retr/b_eval_bad": RETRIEVAL.format(kind="mac"),
            "retr/models/resnet101": "  MODEL: {TRUNK: {RESNETS: {DEPTH: 101}}}\n",
            "retr/no_data": "  MODEL: {TRUNK: {NAME: resnet}}\n"}
    module, out = run_script(tmp_path, capsys, tree=tree)
    assert "compose and validate: 2" in out  # a_eval_rmac, and models/resnet101 over it
    lines = [line.strip() for line in out.splitlines()]
    assert any("FEATS_PROCESSING_TYPE='mac': use rmac, gem" in line and "b_eval_bad" in line
               for line in lines)
    assert any("DATA.TRAIN.DATA_SOURCES is empty" in line and "retr/no_data" in line
               for line in lines)
    pairs = dict(module.config_names(tmp_path / "config")[0])
    assert pairs["retr/models/resnet101"] == ["config=retr/a_eval_rmac",
                                              "+config/retr/models=resnet101"]


def test_any_dataset_adds_placeholders_for_names_the_catalog_lacks(tmp_path, capsys):
    _, out = run_script(tmp_path, capsys, "--any-dataset", "--list")
    assert "compose and validate: 8" in out  # c_not_in_catalog too
    assert "in_no_catalog" not in out
    # --list: every refused file with its whole refusal
    assert "  bench/models/typo: unknown config key 'config.MODEL.TRUNK.RESNET': did you mean " \
           "'config.MODEL.TRUNK.RESNETS'?" in out.splitlines()


TINY_SIMCLR = """  DATA:
    NUM_DATALOADER_WORKERS: 4
    TRAIN:
      DATA_SOURCES: [disk_folder]
      DATASET_NAMES: [my_folder]
      BATCHSIZE_PER_REPLICA: 64
      COLLATE_FUNCTION: simclr_collator
      TRANSFORMS:
        - {name: ImgReplicatePil, num_times: 2}
        - {name: RandomResizedCrop, size: 16}
        - {name: ToTensor}
  MODEL:
    TRUNK:
      NAME: resnet
      RESNETS: {DEPTH: 18, WIDTH_MULTIPLIER: 0.125, SMALL_IMAGE_STEM: true}
    HEAD:
      PARAMS: [[mlp, {dims: [64, DIM]}]]
  LOSS:
    name: simclr_info_nce_loss
    simclr_info_nce_loss: {temperature: 0.2, buffer_params: {embedding_dim: 16}}
  OPTIMIZER: {name: sgd, num_epochs: 100, param_schedulers: {lr: {name: constant, value: 0.1}}}
  DISTRIBUTED: {BACKEND: nccl, NUM_NODES: 2, NUM_PROC_PER_NODE: 8}
  MACHINE: {DEVICE: gpu}
  TEST_MODEL: false
"""
RUN_TREE = {
    "pretrain/tiny_simclr": TINY_SIMCLR.replace("DIM", "16"),
    # accepted before launch, fails at its first step: the head gives 8 values, the loss wants 16
    "pretrain/other/tiny_simclr_wrong_dim": TINY_SIMCLR.replace("DIM", "8"),
}


def test_run_trains_the_sample_and_groups_failures(tmp_path, capsys):
    """--run 2: both accepted files run (2 GPU nodes' settings, a catalog dataset and 100
    epochs become one CPU process on synthetic data for 2 iterations); the one whose head and
    loss disagree fails with the loss's message as its reason."""
    # from a fresh interpreter, as a user runs it: --run forks its runs from the script's
    # process, and a process whose torch already ran parallel work (this test process, after
    # other tests) cannot fork safely (OpenMP's thread pool does not survive a fork)
    root = tmp_path / "config"
    write_tree(root, RUN_TREE)
    proc = subprocess.run(
        [sys.executable, str(REPO / "extra_scripts/vissl_config_coverage.py"), str(root),
         "--top", "20", "--run", "2", "--run-memory-gb", "0"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "compose and validate: 2" in out
    assert "ran 2 configs for real" in out and "1 ran, 1 failed (1 reasons)" in out
    assert "ran, by engine: train 1" in out
    lines = [line.strip() for line in out.splitlines()]
    assert any(line.startswith("1  ValueError: simclr_info_nce_loss expects embeddings of shape")
               and line.endswith("[pretrain/other/tiny_simclr_wrong_dim]") for line in lines)
    assert any(line.endswith("pretrain/tiny_simclr: ran") for line in lines)


def test_run_sample_is_even_over_folders_and_seeded():
    spec = importlib.util.spec_from_file_location(
        "vissl_config_run", REPO / "extra_scripts/vissl_config_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = [(f"a/{i}", []) for i in range(10)] + [(f"b/{i}", []) for i in range(3)] + \
        [("c/x/0", [])]
    picked = [name for name, _ in module.pick(names, 7, seed=1)]
    assert sorted(n.split("/")[0] for n in picked[:3]) == ["a", "b", "c"]  # one per folder
    assert sorted(n.split("/")[0] for n in picked) == ["a"] * 3 + ["b"] * 3 + ["c"]
    assert picked == [name for name, _ in module.pick(names, 7, seed=1)]
    assert picked != [name for name, _ in module.pick(names, 7, seed=2)]
    assert len(module.pick(names, 100, seed=0)) == 14
    # fragments over no base config (alone, or over a data fragment) are not engine configs
    fragments = [("f/alone", ["+config/f=alone"]),
                 ("f/over_data", ["config=f/datasets/d", "+config/f=over_data"]),
                 ("f/over_base", ["config=f/base", "+config/f=over_base"])]
    assert [name for name, _ in module.pick(fragments, 3, seed=0)] == ["f/over_base"]



def test_run_evaluates_a_retrieval_config_on_tiny_written_datasets(tmp_path, monkeypatch):
    """--run's way with a retrieval config (vissl_config_run.run_one's steps, in this process):
    the retrieval tool is chosen, tiny Revisited-Oxford-like datasets are written for it, and
    it scores them."""
    import torch

    import ssl_engine.engines.instance_retrieval as engine
    from ssl_engine.config import AttrDict
    from ssl_engine.config.compose import load_defaults
    from ssl_engine.config.validate import validate_config

    root = tmp_path / "config"
    tiny = RETRIEVAL.format(kind="gem").replace(
        "RESNETS: {DEPTH: 50}", "RESNETS: {DEPTH: 18, WIDTH_MULTIPLIER: 0.125}")
    write_tree(root, {"retr/eval_roxford": tiny.replace(
        "FEATS_PROCESSING_TYPE: gem", "FEATS_PROCESSING_TYPE: gem, EVAL_DATASET_NAME: rox")})
    name = "retr/eval_roxford"
    sys.path.insert(0, str(REPO / "extra_scripts"))
    try:
        import vissl_config_coverage as coverage
        import vissl_config_run as run
    finally:
        sys.path.remove(str(REPO / "extra_scripts"))
    schema = load_defaults()
    schema.pop("defaults", None)
    composed = coverage.compose_fast(root, [f"config={name}"], schema)
    run.synthetic_data(composed["config"], 2, str(tmp_path / "out"))
    validate_config(composed, schema)
    cfg = AttrDict(composed["config"])
    assert run.tool_of(name, [f"config={name}"], cfg) == "instance_retrieval_test"
    engine.check_retrieval_config(cfg)
    threads = torch.get_num_threads()
    monkeypatch.setattr(engine, "configure_threads", lambda cfg: torch.set_num_threads(1))
    try:
        run.run_tool("instance_retrieval_test", cfg)
    finally:
        torch.set_num_threads(threads)
    assert cfg.IMG_RETRIEVAL.DATASET_PATH == str(tmp_path / "out" / "retrieval")
    assert np.load(tmp_path / "out" / "retrieval_rankings.npy").shape == (2, 8)


def test_rerun_reads_a_logs_failures_and_merges_the_tables_of_logs(tmp_path, capsys):
    """vissl_config_rerun.py: the failures of a --run log are what --failed-from runs again;
    the table of two logs takes the later outcome of a file run twice."""
    spec = importlib.util.spec_from_file_location(
        "vissl_config_rerun", REPO / "extra_scripts/vissl_config_rerun.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    first.write_text("header\n[1/3]   12.0 s  a/x: ran\n"
                     "[2/3]    1.5 s  b/y: FAILED  ValueError: bad size 3\n"
                     "[3/3]    2.0 s  c/z: FAILED  MemoryError: too large\n")
    second.write_text("[1/1]    9.0 s  b/y: ran\n")
    assert module.failed_in(str(first)) == ["b/y", "c/z"]
    module.merged_table([str(first), str(second)])
    out = capsys.readouterr().out
    assert "ran 3 configs for real (23 s): 2 ran, 1 failed (1 reasons)" in out
    assert "    1  MemoryError: too large  [c/z]" in out and "bad size" not in out


def test_run_gives_deepclusterv2_a_sample_per_cluster_and_stops_after_two_iterations():
    sys.path.insert(0, str(REPO / "extra_scripts"))
    import vissl_run_data as run_data

    def composed(loss):
        cfg = {"LOSS": loss, "DATA": {"TRAIN": {"DATA_SOURCES": ["disk_folder"]}}}
        run_data.synthetic_data(cfg, 2, "/tmp/unused")
        return cfg

    cfg = composed({"name": "deepclusterv2_loss",
                    "deepclusterv2_loss": {"num_clusters": [30, 301, 3]}})
    assert run_data.clustering_data(cfg, 2) == 2  # stop after 2 iterations
    assert cfg["DATA"]["TRAIN"]["SYNTHETIC"]["NUM_SAMPLES"] == 302  # >= 301, whole batches
    cfg = composed({"name": "swav_loss"})
    assert run_data.clustering_data(cfg, 2) == 0  # the first epoch ends the run
    assert cfg["DATA"]["TRAIN"]["SYNTHETIC"]["NUM_SAMPLES"] == 4


PAIRING_DATA = "  DATA: {TRAIN: {DATA_SOURCES: [synthetic]}}\n  TEST_MODEL: false\n"
PAIRING_TREE = {
    # two bases of one folder, written for different students, teachers and trunks
    "distill/a_features": PAIRING_DATA + "  MODEL: {HEAD: {PARAMS: [[identity, {}]]}}\n"
    "  DISTILLATION: {TEACHER_MODEL: {HEAD: {PARAMS: [[identity, {}]]}}}\n",
    "distill/b_logits": PAIRING_DATA + "  MODEL: {HEAD: {PARAMS: [[mlp, {dims: [2048, 1000]}]]}}\n"
    "  DISTILLATION: {TEACHER_MODEL: {HEAD: {PARAMS: [[mlp, {dims: [2048, 1000]}]]}}}\n",
    "distill/c_masking": PAIRING_DATA + "  MODEL: {HEAD: {PARAMS: [[mlp, {dims: [384, 7]}]]},"
    " TRUNK: {VISION_TRANSFORMERS: {MASKED_IMAGE_MODELING: {NAME: ibot}}}}\n",
    "distill/student/tiny_logits": "  MODEL: {HEAD: {PARAMS: [[mlp, {dims: [192, 1000]}]]}}\n",
    "distill/student/tiny_other_size": "  MODEL: {HEAD: {PARAMS: [[mlp, {dims: [192, 5]}]]}}\n",
    "distill/teacher/vit_logits":
        "  DISTILLATION: {TEACHER_MODEL: {HEAD: {PARAMS: [[mlp, {dims: [384, 1000]}]]}}}\n",
    "distill/trunks/vit_s": "  MODEL: {TRUNK: {VISION_TRANSFORMERS: {HIDDEN_DIM: 384}}}\n",
    "distill/transforms/mim": "  DATA: {TRAIN: {INPUT_KEY_NAMES: [global_views, mask]}}\n",
    "distill/optim/sgd": "  OPTIMIZER: {name: sgd}\n",
    # a fragment whose name points to a sibling folder: composed after that folder's first file
    "geo/eval": PAIRING_DATA,
    "geo/partitioning/middle": "  GEO_LOCALIZATION: {TRAIN_LABEL_MAPPING: cells.csv}\n",
    "geo/models_middle/b_net": "  MODEL: {HEAD: {PARAMS: [[mlp, {dims: [8, 3]}]]}}\n",
    "geo/models_middle/a_net": "  MODEL: {HEAD: {PARAMS: [[mlp, {dims: [8, 3]}]]}}\n",
    # a heads fragment for another trunk: composed after the sibling fragment giving that trunk
    "sw/base": PAIRING_DATA + "  MODEL: {HEAD: {PARAMS: [[swav_head, {dims: [2048, 128]}]]}}\n",
    "sw/heads/wide": "  MODEL: {HEAD: {PARAMS: [[swav_head, {dims: [7392, 256]}]]}}\n",
    "sw/heads/same": "  MODEL: {HEAD: {PARAMS: [[swav_head, {dims: [2048, 256]}]]}}\n",
    "sw/models/a_small": "  MODEL: {TRUNK: {NAME: regnet},"
    " HEAD: {PARAMS: [[swav_head, {dims: [512, 128]}]]}}\n",
    "sw/models/b_wide": "  MODEL: {TRUNK: {NAME: regnet},"
    " HEAD: {PARAMS: [[swav_head, {dims: [7392, 128]}]]}}\n",
}


def test_fragments_pair_with_the_base_and_sibling_they_were_written_for(tmp_path):
    sys.path.insert(0, str(REPO / "extra_scripts"))
    import vissl_config_pairing as pairing

    root = tmp_path / "config"
    write_tree(root, PAIRING_TREE)
    pairs = dict(pairing.config_names(root)[0])

    def base(name):
        return pairs[name][0][len("config="):]

    assert base("distill/student/tiny_logits") == "distill/b_logits"  # same heads, same size
    assert base("distill/teacher/vit_logits") == "distill/b_logits"  # the teacher's heads
    assert base("distill/student/tiny_other_size") == "distill/a_features"  # none fits: first
    assert base("distill/trunks/vit_s") == "distill/a_features"  # identity takes any size
    assert base("distill/transforms/mim") == "distill/c_masking"  # a student that masks
    assert base("distill/optim/sgd") == "distill/a_features"  # says nothing: the first base
    assert pairs["geo/partitioning/middle"] == [
        "config=geo/eval", "+config/geo/models_middle=a_net", "+config/geo/partitioning=middle"]
    assert pairs["geo/models_middle/b_net"] == ["config=geo/eval", "+config/geo/models_middle=b_net"]
    assert pairs["sw/heads/wide"] == [
        "config=sw/base", "+config/sw/models=b_wide", "+config/sw/heads=wide"]
    assert pairs["sw/heads/same"] == ["config=sw/base", "+config/sw/heads=same"]
    assert pairs["sw/models/a_small"] == ["config=sw/base", "+config/sw/models=a_small"]
    # a trunk whose features the first head does not take goes over a base whose head does
    tree = dict(PAIRING_TREE)
    tree["distill/a_features"] = PAIRING_DATA + \
        "  MODEL: {HEAD: {PARAMS: [[mlp, {dims: [2048, 10]}]]}}\n"
    other = tmp_path / "other"
    write_tree(other / "config", tree)
    pairs = dict(pairing.config_names(other / "config")[0])
    assert pairs["distill/trunks/vit_s"][0] == "config=distill/c_masking"
