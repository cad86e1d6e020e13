"""``vissl_config_coverage.py --run N``: train a sample of the accepted VISSL configs for real.

The sample: up to N of the files that compose and validate, taken in turn from each folder of
the tree (the folders in a seeded random order, the files of each folder shuffled with the same
seed), so that every kind of config is met before any folder gives a second one. Only engine
configs are sampled (``over_a_base``): base files and fragments composed over one, not the
fragments the coverage script composes alone or over a data fragment for want of a base (the
fairness models over a dataset file, a transforms file over a dataset file): those get their
loss and heads from the defaults, a config no VISSL user runs.

Each file runs in its own process, forked from the script after the engine is imported,
under a time limit and an address-space limit, so a hang or a model too large for the machine
ends that run only (extra_scripts/vissl_config_rerun.py runs chosen files again the same way).
The process composes the file as the coverage script does, puts its data on the synthetic
source (``synthetic_data``), and runs the config's engine in one CPU process:

- ``train``: the config's model, loss, heads, optimizer, schedulers, collator, transforms and
  hooks as written, on ``2 * BATCHSIZE`` synthetic images (BATCHSIZE given, default 2), so
  that the first epoch is 2 iterations, then its test phase when the config tests every
  epoch; the run ends when the second epoch would start (or at its own end). DeepCluster v2
  (``deepclusterv2_loss``) gets as many synthetic images as its largest ``num_clusters``
  (``clustering_data``: k-means needs a sample per centroid; the loss fills its memory with a
  pass over all of them before the first epoch, as VISSL's did) and stops after 2 iterations;
- extraction engines (``extract_features``, ``extract_label_predictions``, ...): their whole
  run over the same tiny splits;
- the files VISSL runs with a tool of its own (``tool_of``): that tool's way, the features of
  both splits extracted, then the k-NN classification (tools/nearest_neighbor_test.py), the
  SVMs (tools/train_svm.py, 2 cross-validation folds), the low-shot logistic regression
  (tools/low_shot_test.py) or the clustering into at most 2 clusters
  (tools/cluster_features_and_label.py), or the instance retrieval
  (tools/instance_retrieval_test.py) on tiny datasets (``tiny_retrieval_data``).

A DATA_LIMIT is lowered to 2 batches (of 2 classes, from 4 batches of synthetic images). A
model whose float32 weights, with a gradient and a momentum for each parameter it trains (a
frozen trunk's and an extraction's parameters have none), exceed the memory limit is not built
(reported as too large for the machine); the others meet the limit if they exceed it.

Only what cannot exist here is changed: the data (DATA_SOURCES -> synthetic, DATA_PATHS,
DATASET_NAMES and label files cleared, SYNTHETIC.NUM_SAMPLES / IMAGE_SIZE set), the batch size,
the machine (MACHINE.DEVICE=cpu, one process, no data-loader workers, no SLURM, RUN_ID auto),
the output folder (a temporary one), the weights to start from (WEIGHTS_INIT.PARAMS_FILE
cleared: random weights, as the files name checkpoints of VISSL's authors' storage) and, on this
offline machine, jigsaw's published permutation files named by URL (``offline_permutations``:
a stand-in of the same shape) and a distillation's teacher checkpoint (``random_teacher``: the
teacher with random weights).
"""
import os
import random
import re
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path

from vissl_common import REPO, compose_fast
from vissl_run_data import (clustering_data, offline_permutations,  # noqa: F401
                            random_teacher, synthetic_data, tiny_retrieval_data)


def over_a_base(hydra_args) -> bool:
    """Whether the composition is an engine config: a base file, or a fragment over one (not
    alone, not over a ``dataset(s)`` folder's data fragment: see the module's docstring)."""
    fragment = any(str(arg).startswith("+config/") for arg in hydra_args)
    bases = [Path(str(arg)[7:]) for arg in hydra_args if str(arg).startswith("config=")]
    return not fragment or any(not b.parent.name.lower().endswith(("dataset", "datasets"))
                               for b in bases)


def pick(names, count: int, seed: int):
    """Up to ``count`` of ``names`` ((name, args) pairs) that are ``over_a_base``, evenly over
    their folders, seeded."""
    rng = random.Random(seed)
    folders = defaultdict(list)
    for item in (item for item in names if over_a_base(item[1])):
        folders[str(Path(item[0]).parent)].append(item)
    order = sorted(folders)
    rng.shuffle(order)
    for folder in order:
        rng.shuffle(folders[folder])
    picked = []
    while len(picked) < count and any(folders[f] for f in order):
        for folder in order:
            if folders[folder] and len(picked) < count:
                picked.append(folders[folder].pop())
    return picked


def first_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def check_size(cfg, memory_gb: float, trains: bool) -> None:
    """Refuse a model whose float32 weights, with a gradient and a momentum for each parameter
    it trains (none when ``trains`` is false: extraction and the tools; none for a frozen
    trunk), exceed ``memory_gb``: the activations would not fit beside them."""
    import torch

    from ssl_engine.models import build_model

    if memory_gb <= 0:
        return
    with torch.device("meta"):
        model = build_model(cfg.MODEL)
    count = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad) if trains else 0
    if (count + 2 * trained) * 4 > memory_gb * 2**30:
        raise MemoryError(f"too large for this machine: {count / 1e6:.0f}M parameters "
                          f"({trained / 1e6:.0f}M trained), more than --run-memory-gb="
                          f"{memory_gb:g} in float32 weights, gradients and momentum")


def _load_tool(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def run_knn_tool(cfg) -> None:
    """What tools/nearest_neighbor_test.py does with the composed config."""
    from ssl_engine.engines.evaluate_extracted import evaluation_layer, get_or_extract

    layer = evaluation_layer(cfg, cfg.NEAREST_NEIGHBOR.FEATURES_LAYER)
    _load_tool("nearest_neighbor_test").evaluate(cfg, layer, get_or_extract(cfg, layer))


def tool_of(name: str, hydra_args, cfg):
    """The tool VISSL runs the file with, when it is not run_distributed_engines.py: the k-NN
    benchmark (a nearest_neighbor folder), the SVM benchmark (a *_svm file, or a fragment over
    one), the low-shot benchmark (a limited TRAIN split in a low_shot_transfer folder),
    ClusterFit's clustering (cluster_features_* files), instance retrieval (images named by
    IMG_RETRIEVAL.DATASET_PATH)."""
    if cfg.IMG_RETRIEVAL.DATASET_PATH:  # vissl_config_pairing.retrieval_config
        return "instance_retrieval_test"
    parts = Path(name).parts
    if "nearest_neighbor" in parts:
        return "nearest_neighbor_test"
    if any(str(arg).endswith("_svm") for arg in hydra_args):
        return "train_svm"
    if any("low_shot_transfer" in part for part in parts) and cfg.DATA.TRAIN.DATA_LIMIT > 0:
        return "low_shot_test"
    if parts[-1].startswith("cluster_features"):
        return "cluster_features_and_label"
    return None


def run_tool(tool: str, cfg) -> None:
    if tool == "instance_retrieval_test":
        from ssl_engine.engines.instance_retrieval import run_retrieval

        tiny_retrieval_data(cfg, cfg.CHECKPOINT.DIR)
        run_retrieval(cfg)
        return
    if tool == "nearest_neighbor_test":
        run_knn_tool(cfg)
        return
    if tool == "cluster_features_and_label":  # as many clusters as the tiny data allows
        cfg.CLUSTERFIT.NUM_CLUSTERS = min(cfg.CLUSTERFIT.NUM_CLUSTERS, 2)
        cfg.CLUSTERFIT.OUTPUT_DIR = cfg.CHECKPOINT.DIR
    if tool == "train_svm":  # folds of the tiny data's 2 images per class
        cfg.SVM.cross_val_folds = 2
    _load_tool(tool).run(cfg)


def run_one(tree: str, name: str, hydra_args, batch: int, overrides, memory_gb: float) -> dict:
    """Compose, check and run one file in this process with ``overrides``; its outcome as a
    dict."""
    import logging

    import torch

    import ssl_engine.losses  # noqa: F401  (the losses' derived settings and key rules)
    import ssl_engine.models  # noqa: F401  (the trunks')
    from ssl_engine.config import AttrDict
    from ssl_engine.config.compose import load_defaults
    from ssl_engine.config.derive import derive_settings
    from ssl_engine.config.validate import validate_config
    from ssl_engine.engines.instance_retrieval import check_retrieval_config
    from ssl_engine.engines.launcher import launch_distributed
    from ssl_engine.engines.prelaunch import check_before_launch
    from ssl_engine.hooks import SSLHook
    from ssl_engine.trainer.default_hooks import default_hook_generator

    torch.set_num_threads(1)
    logging.getLogger("ssl_engine").setLevel(logging.WARNING)

    class FirstEpochDone(Exception):
        """Raised when the second training epoch would start: the sample run is over."""

    class EndAfterFirstEpoch(SSLHook):
        def __init__(self):
            super().__init__()
            self.iterations = 0
            self.stop_after = 0  # iterations, when the epoch is longer than the sample run

        def on_step(self, task):
            if task.train:
                self.iterations = task.iteration
                if self.stop_after and self.iterations >= self.stop_after:
                    raise FirstEpochDone()

        def on_phase_start(self, task):
            if task.train and task.iteration > 0:
                raise FirstEpochDone()

    stopper = EndAfterFirstEpoch()
    schema = load_defaults()
    schema.pop("defaults", None)
    with tempfile.TemporaryDirectory(prefix="vissl_run_") as folder:
        composed = compose_fast(Path(tree), hydra_args, schema, overrides)
        synthetic_data(composed["config"], batch, folder)
        stopper.stop_after = clustering_data(composed["config"], batch)
        offline_permutations(composed["config"], folder)
        validate_config(composed, schema)
        engine_name = composed.get("engine_name", "train")
        cfg = AttrDict(composed["config"])
        tool = tool_of(name, hydra_args, cfg)
        if tool == "instance_retrieval_test":
            check_retrieval_config(cfg)
        else:
            derive_settings(cfg)
            random_teacher(cfg, folder)
            check_before_launch("extract_features" if tool else engine_name, cfg)
        check_size(cfg, memory_gb, trains=not tool and engine_name == "train")
        if tool:
            engine_name = f"tools/{tool}.py"
            run_tool(tool, cfg)
        else:
            try:
                launch_distributed(cfg, engine_name,
                                   hook_generator=lambda c: default_hook_generator(c) + [stopper])
            except FirstEpochDone:
                pass
        outputs = sorted(p.name for p in Path(folder).iterdir())
    if engine_name == "train" and not cfg.TEST_ONLY and stopper.iterations < 2:
        raise RuntimeError(f"trained {stopper.iterations} iterations, expected 2")
    return {"engine": engine_name, "iterations": stopper.iterations, "outputs": outputs[:20]}


def reason(message: str) -> str:
    """Failures grouped: numbers, paths and quoted values made generic."""
    message = re.sub(r"/[\w./-]+", "PATH", message)
    return re.sub(r"\d+", "N", message)[:110]


def _child(conn, log: str, args) -> None:
    """A forked process: one run under the memory limit, its outcome sent through ``conn``,
    its output in ``log``."""
    tree, name, hydra_args, batch, overrides, memory_gb = args
    if memory_gb > 0:
        import resource

        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    try:
        outcome = {"ok": True, **run_one(tree, name, hydra_args, batch, overrides, memory_gb)}
    except BaseException as err:  # noqa: BLE001  (every failure is reported, grouped)
        traceback.print_exc()
        outcome = {"ok": False, "error": first_line(err)}
    sys.stdout.flush()
    sys.stderr.flush()
    conn.send(outcome)
    conn.close()
    os._exit(0)


def _preload() -> None:
    """Import what every run needs once, before the runs are forked from this process."""
    import torch  # noqa: F401

    import ssl_engine.engines.launcher  # noqa: F401
    import ssl_engine.trainer.default_hooks  # noqa: F401


def run_sample(tree: Path, picked, overrides, batch: int, timeout: float, memory_gb: float):
    """Run each picked file in a process forked from this one (imports done once), under
    ``timeout`` seconds and ``memory_gb`` of address space; (results, seconds)."""
    import multiprocessing

    _preload()
    fork = multiprocessing.get_context("fork")
    results = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vissl_run_logs_") as logs:
        for index, (name, hydra_args) in enumerate(picked, 1):
            began = time.perf_counter()
            log = os.path.join(logs, f"{index}.txt")
            receive, send = fork.Pipe(duplex=False)
            process = fork.Process(target=_child, args=(send, log, (
                str(tree), name, hydra_args, batch, list(overrides), memory_gb)))
            process.start()
            send.close()
            if receive.poll(timeout):
                try:
                    outcome = receive.recv()
                except EOFError:  # the process died before it could answer
                    outcome = None
            else:
                outcome = {"ok": False, "error": f"no result within {timeout:.0f} s"}
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
            if outcome is None:
                tail = [line for line in Path(log).read_text(errors="replace").splitlines()
                        if line.strip()][-1:]
                outcome = {"ok": False, "error": f"process ended with code {process.exitcode}"
                                                 f": {tail[0] if tail else ''}"[:300]}
            outcome.update(name=name, seconds=round(time.perf_counter() - began, 1))
            results.append(outcome)
            status = "ran" if outcome["ok"] else f"FAILED  {outcome['error']}"
            print(f"[{index}/{len(picked)}] {outcome['seconds']:6.1f} s  {name}: {status}",
                  flush=True)
    return results, time.perf_counter() - start


def print_table(results, seconds: float) -> None:
    ran = [r for r in results if r["ok"]]
    groups = defaultdict(list)
    for result in results:
        if not result["ok"]:
            groups[reason(result["error"])].append(result["name"])
    print(f"\nran {len(results)} configs for real ({seconds:.0f} s): {len(ran)} ran, "
          f"{len(results) - len(ran)} failed ({len(groups)} reasons)")
    engines = defaultdict(int)
    for result in ran:
        engines[result.get("engine", "?")] += 1
    if any("engine" in result for result in ran):  # not known from a log's lines
        print("  ran, by engine: " + ", ".join(f"{k} {v}" for k, v in sorted(engines.items())))
    print(f"\n{'files':>5}  failure (first line of the error)  [example]")
    for text, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(names):>5}  {text}  [{names[0]}]")
