"""Speed options (MODEL.AMP_PARAMS, MODEL.CHANNELS_LAST, MODEL.COMPILE) compute what fp32
eager computes, to a stated tolerance; a run with AMP resumes bit-exact; the log counts images
and views apart; NUM_DATALOADER_WORKERS=auto sizes the loader from the cores."""
import pytest
import torch

from engine_utils import crash_hooks_at, final_weights, metrics, run_engine, step_losses
from ssl_engine.config import ConfigError, load_config
from ssl_engine.data.collators import build_collator
from ssl_engine.hooks.log_hooks import batch_counts
from ssl_engine.losses import build_loss
from ssl_engine.models import build_model
from ssl_engine.trainer.amp import MixedPrecision, amp_dtype
from ssl_engine.utils.cpu_budget import auto_workers, compute_threads, processes_on_this_machine
from ssl_engine.utils.device import float32_outputs

QUICK = ["config=test/quick_simclr_synthetic", "config.CHECKPOINT.DIR=/tmp/unused"]


def loss_and_grads(cfg, images, channels_last=False, amp=None):
    """SimCLR loss of the quick config's model on ``images`` and the gradient of every
    parameter, with the given options applied the way the task applies them."""
    torch.manual_seed(0)
    model = build_model(cfg.MODEL)
    if channels_last:
        model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    loss_fn = build_loss(cfg.LOSS)
    amp = amp or MixedPrecision(None, "cpu")
    with amp.autocast():
        output = float32_outputs(model(images))
    loss = loss_fn(output, None)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def reference():
    _, cfg = load_config(QUICK)
    images = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return cfg, images, loss_and_grads(cfg, images)


def test_channels_last_matches_fp32_eager(reference):
    cfg, images, (loss, grads) = reference
    cl_loss, cl_grads = loss_and_grads(cfg, images, channels_last=True)
    # the same arithmetic in another memory order: only the summation order differs
    torch.testing.assert_close(cl_loss, loss, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(cl_grads[name], grads[name], rtol=1e-3, atol=1e-5, msg=name)


def test_bf16_autocast_matches_fp32_eager_to_bf16_precision(reference):
    cfg, images, (loss, grads) = reference
    amp = MixedPrecision(torch.bfloat16, "cpu")
    bf_loss, bf_grads = loss_and_grads(cfg, images, amp=amp)
    # bf16 keeps 8 bits of mantissa: the loss agrees within 2%; the gradients of this tiny
    # random network carry that rounding (measured: cosine 0.95 over all parameters, 0.79 for
    # the worst tensor, a batch-norm bias): they point the same way, with the same norm
    assert bf_loss.dtype == torch.float32
    torch.testing.assert_close(bf_loss, loss, rtol=2e-2, atol=1e-3)
    for name in grads:  # parameters and gradients stay float32
        assert bf_grads[name].dtype == torch.float32, name
        assert cosine(bf_grads[name], grads[name]) > 0.7, name
    every, every_bf = (torch.cat([g[n].flatten() for n in grads]) for g in (grads, bf_grads))
    assert cosine(every_bf, every) > 0.9
    assert float(every_bf.norm()) == pytest.approx(float(every.norm()), rel=0.1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def test_compiled_trunk_matches_fp32_eager(tmp_path):
    """MODEL.COMPILE as the task applies it: the trunk compiled in place (parameter names
    unchanged), the loss and gradients of eager fp32.  The backend is aot_eager (TorchDynamo's
    graph capture and AOTAutograd's joint graph, run with eager kernels): inductor's C++
    compilation of a ResNet-18 costs 30-40 s on 2 cores, too slow for this suite; it runs end to
    end in benchmarks/train_speed.py's compile variants."""
    from ssl_engine.trainer import SelfSupervisionTask

    torch._dynamo.reset()
    tasks = {}
    for name, options in {"eager": [], "compiled": [
            "config.MODEL.COMPILE.USE_COMPILE=true", "config.MODEL.COMPILE.BACKEND=aot_eager"]}.items():
        _, cfg = load_config(["config=test/quick_simclr_synthetic",
                              f"config.CHECKPOINT.DIR={tmp_path / name}", *options])
        torch.manual_seed(0)
        task = SelfSupervisionTask.from_config(cfg, torch.device("cpu"))
        task.prepare()
        tasks[name] = task
    images = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    results = {}
    for name, task in tasks.items():
        loss = task.loss(float32_outputs(task.model(images)), None)
        loss.backward()
        results[name] = (loss.detach(), {n: p.grad.clone()
                                         for n, p in task.base_model.named_parameters()})
    (loss, grads), (c_loss, c_grads) = results["eager"], results["compiled"]
    assert hasattr(tasks["compiled"].base_model.trunk, "_compiled_call_impl")
    assert c_grads.keys() == grads.keys()  # checkpoints keep their names
    torch.testing.assert_close(c_loss, loss, rtol=1e-5, atol=1e-6)
    for name in grads:  # the same kernels; only the graph's evaluation order may differ
        torch.testing.assert_close(c_grads[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("args, message", [
    ({"USE_AMP": True, "AMP_TYPE": "apex", "AMP_ARGS": {"opt_level": "O1"}}, "AMP_TYPE=pytorch"),
    ({"USE_AMP": True, "AMP_TYPE": "pytorch", "AMP_ARGS": {"dtype": "float16"}}, "needs a GPU"),
    ({"USE_AMP": True, "AMP_TYPE": "pytorch", "AMP_ARGS": {"dtype": "int8"}}, "bfloat16, float16"),
    ({"USE_AMP": True, "AMP_TYPE": "pytorch", "AMP_ARGS": {"level": 1}}, "unknown"),
])
def test_amp_settings_that_cannot_run_are_refused(args, message):
    from ssl_engine.config.attr_dict import AttrDict

    with pytest.raises(ConfigError, match=message):
        amp_dtype(AttrDict(args), "cpu")


def test_amp_defaults_to_bf16_on_cpu_and_fp16_with_a_scaler_on_gpu():
    from ssl_engine.config.attr_dict import AttrDict

    on = AttrDict({"USE_AMP": True, "AMP_TYPE": "pytorch", "AMP_ARGS": {}})
    assert amp_dtype(on, "cpu") == torch.bfloat16
    assert amp_dtype(on, "cuda") == torch.float16
    assert amp_dtype(AttrDict(dict(on, USE_AMP=False)), "cpu") is None
    assert MixedPrecision(torch.bfloat16, "cpu").scaler is None


def test_bf16_run_resumes_exactly(tmp_path):
    """BYOL (a momentum target run under autocast too) with bf16 on, crashed after its first
    update and resumed: the same weights, bit for bit."""
    config = "config=test/quick_byol_synthetic"
    args = ["config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16",
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8", "config.LOG_FREQUENCY=1",
            "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1", "config.MODEL.AMP_PARAMS.USE_AMP=true",
            "config.MODEL.CHANNELS_LAST=true"]
    run_engine(tmp_path / "straight", args, config=config)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_engine(tmp_path / "crashed", args, config=config,
                   hook_generator=crash_hooks_at(1))
    run_engine(tmp_path / "crashed", args + ["config.CHECKPOINT.AUTO_RESUME=true"], config=config)
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "crashed")
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert step_losses(tmp_path / "crashed") == step_losses(tmp_path / "straight")
    record = next(r for r in metrics(tmp_path / "straight") if r.get("phase") == "train")
    # 8 images of 2 views each per step
    assert record["views_per_sec"] == pytest.approx(2 * record["images_per_sec"])


def test_throughput_counts_images_and_views_apart():
    samples = [{"data": [torch.zeros(3, 4, 4), torch.ones(3, 4, 4)], "label": [i, i],
                "data_idx": i, "data_valid": True} for i in range(5)]
    assert batch_counts(build_collator("simclr_collator")(samples)) == (5, 10)
    assert batch_counts(build_collator("moco_collator")(samples)) == (5, 10)
    single = [dict(s, data=s["data"][:1], label=s["label"][:1]) for s in samples]
    assert batch_counts(build_collator("default")(single)) == (5, 5)


def test_auto_workers_follow_the_cores():
    assert auto_workers(2, "cpu") == 2 and compute_threads(2, 2, auto=True) == 2
    assert auto_workers(32, "cpu") == 8 and compute_threads(32, 8, auto=True) == 24
    assert auto_workers(16, "gpu") == 8 and auto_workers(1, "gpu") == 0
    assert compute_threads(32, 2, auto=False) == 32  # explicit workers: torch keeps the cores


def test_processes_under_torchrun_share_the_cores_as_spawned_ones_do(monkeypatch):
    cfg = load_config(["config=test/quick_simclr_synthetic"])[1]  # NUM_PROC_PER_NODE 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert processes_on_this_machine(cfg) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun --nproc_per_node=2
    assert processes_on_this_machine(cfg) == 2


@pytest.mark.parametrize("value, ok", [("auto", True), (3, True), ("many", False), (-1, False)])
def test_num_dataloader_workers_takes_auto_or_a_count(value, ok):
    override = QUICK + [f"config.DATA.NUM_DATALOADER_WORKERS={value}"]
    if ok:
        assert load_config(override)[1].DATA.NUM_DATALOADER_WORKERS == value
    else:
        with pytest.raises(ConfigError, match="NUM_DATALOADER_WORKERS"):
            load_config(override)


def test_persistent_workers_augment_each_epoch_as_fresh_workers_do(tmp_path):
    """Two epochs with 2 loader workers kept alive between phases train exactly as with
    workers started anew for every phase: the epoch travels with each index."""
    args = ["config.DATA.NUM_DATALOADER_WORKERS=2", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16"]
    run_engine(tmp_path / "persistent", args + ["config.DATA.PERSISTENT_WORKERS=true"])
    run_engine(tmp_path / "fresh", args + ["config.DATA.PERSISTENT_WORKERS=false"])
    persistent, fresh = final_weights(tmp_path / "persistent"), final_weights(tmp_path / "fresh")
    for name in fresh:
        assert torch.equal(persistent[name], fresh[name]), name
    assert step_losses(tmp_path / "persistent") == step_losses(tmp_path / "fresh")
