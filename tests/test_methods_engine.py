"""Every method trains end to end on its tiny synthetic config; a run crashed mid-epoch and
resumed ends bit-exact with an uninterrupted one (target networks, queues and schedules
included); 2 processes with half the batch each train like 1 process with the whole batch.
(SwAV's config adds multi-crop, a queue used from the second iteration and prototypes
frozen during the first update; DINO's multi-crop with a teacher on the global crops, a last
layer frozen during the first update, AdamW with a weight-decay schedule and gradient
clipping; MSN's ViT whose student drops patches, drawn anew each step, and a target network
on the first crop, with Sinkhorn-Knopp and the mean-entropy term over the global batch;
NNCLR's support set, a queue of projections that its two steps fill; CAPI's ViT teacher with
its clustering layer trained online and Sinkhorn-Knopp per patch position over the global
batch; data2vec 2.0's EMA teacher with an annealed momentum and masked copies of each image;
DINOv3's Gram teacher, taken from the EMA teacher at the first iteration and read back from
the checkpoint at the second; I-JEPA's EMA target encoder with its linear momentum and the
multi-block masks of each sample.)"""
import pytest
import torch

from engine_utils import (
    assert_trains_like_one_process,
    crash_hooks_at,
    final_weights,
    loss_state,
    metrics,
    run_engine,
    step_losses,
)

METHODS = ["moco_v2", "moco_v3", "byol", "simsiam", "barlow_twins", "vicreg", "swav", "dino",
           "msn", "multicrop_simclr", "swav_momentum", "npid", "pirl", "deepclusterv2", "nnclr",
           "capi", "data2vec", "dinov3", "ijepa"]
# 16 images, batch 8: 2 iterations in one epoch, a checkpoint after each.  (More steps of
# these tiny batch-normalised nets amplify float rounding beyond a useful tolerance.)
COMMON = ["config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16",
          "config.LOG_FREQUENCY=1", "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1",
          # batch norm over the global batch, so that 2 x 4 images normalise like 1 x 8
          "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=true"]
TERMS = {"moco_v3": {"view0_to_view1", "view1_to_view0"},
         "byol": {"view0_to_view1", "view1_to_view0"},
         "simsiam": {"view0_to_view1", "view1_to_view0"},
         "barlow_twins": {"on_diagonal", "off_diagonal"},
         "vicreg": {"invariance", "variance", "covariance"},
         "swav": {"assign_crop0", "assign_crop1"},
         "swav_momentum": {"assign_crop0", "assign_crop1"},
         "npid": {"output0"},
         "pirl": {"output0", "output1"},
         "deepclusterv2": {"clustering0", "clustering1"},
         "dino": {"teacher_crop0", "teacher_crop1"},
         "msn": {"cross_entropy", "me_max"},
         "nnclr": {"view0_to_view1", "view1_to_view0"},
         "capi": {"prediction", "clustering"},
         "data2vec": {"regression"},
         "dinov3": {"teacher_crop0", "teacher_crop1", "gram"},
         "ijepa": {"smooth_l1"}}
# what the collapse monitor logs of these (their first output is not an embedding)
MONITOR_KEY = {"data2vec": "prediction_std", "dinov3": "teacher_entropy",
               "ijepa": "prediction_std"}


# The trunk's norm in these runs.  Barlow Twins (like SimCLR, tested beside the engine's
# other distributed tests) proves that global batch norm makes 2 x B equal to 1 x 2B with
# BatchNorm everywhere.  For the others the heads keep (global) batch norm and the trunk uses
# GroupNorm: their sharper losses amplify the rounding differences of batch statistics over
# the 2x2 maps of these tiny nets beyond 1e-4 within two steps (measured: MoCo v3 6e-4).
# MoCo v2 still shuffles its key batch across the 2 ranks: equality proves the shuffle is
# undone exactly.  (With per-process batch norm, MoCo's shuffle makes 2 x B differ from
# 1 x 2B by design: each rank normalises a different half of the keys.)
TRUNK_NORM = {"barlow_twins": "BatchNorm"}


@pytest.mark.parametrize("method", METHODS)
def test_method_trains_resumes_exactly_and_scales_to_two_processes(tmp_path, method):
    config = f"config=test/quick_{method}_synthetic"
    norm = f"config.MODEL.TRUNK.RESNETS.NORM={TRUNK_NORM.get(method, 'GroupNorm')}"
    one = ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8", norm, *COMMON]
    run_engine(tmp_path / "straight", one, config=config)
    losses = step_losses(tmp_path / "straight")
    assert sorted(losses) == [1, 2]
    records = [r for r in metrics(tmp_path / "straight") if r.get("phase") == "train"]
    for record in records:  # the collapse monitor logs beside the loss (DINO: its teacher's
        # entropy instead of the spread of its output, which are prototype scores)
        key = MONITOR_KEY.get(method) or (
            "teacher_entropy" if method in ("dino", "msn", "capi") else "embedding_std")
        assert 0 < record["monitor"][key] < 2
    if method in TERMS:  # named terms, averaged over ranks, add up to the loss
        for record in records:
            assert set(record["loss_terms"]) == TERMS[method]
            assert sum(record["loss_terms"].values()) == pytest.approx(record["loss"], rel=1e-5)

    # crash after iteration 1 (its checkpoint written), resume from it
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_engine(tmp_path / "crashed", one, config=config,
                   hook_generator=crash_hooks_at(1))
    run_engine(tmp_path / "crashed", one + ["config.CHECKPOINT.AUTO_RESUME=true"], config=config)
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "crashed")
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    straight_loss, resumed_loss = loss_state(tmp_path / "straight"), loss_state(tmp_path / "crashed")
    assert straight_loss.keys() == resumed_loss.keys()
    for name in straight_loss:  # target network, queue and its pointer
        assert torch.equal(straight_loss[name], resumed_loss[name]), name
    assert step_losses(tmp_path / "crashed")[2] == losses[2]

    # two processes, half the batch each
    run_engine(tmp_path / "two", ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4", norm,
                                  "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", *COMMON],
               config=config)
    assert_trains_like_one_process(tmp_path / "two", losses, straight)
    two_loss = loss_state(tmp_path / "two")
    for name in straight_loss:
        if name == "queue":  # every rank's rows are enqueued, rank after rank: the same rows
            # as one process enqueues, in the order the two ranks' samples interleave (MoCo:
            # [keys, dim]; SwAV: [assigned crops, rows, dim], whose checkpoint gathers the
            # rows each rank keeps)
            order = lambda queue: queue.gather(  # noqa: E731
                -2, queue[..., :1].argsort(dim=-2).expand_as(queue))
            torch.testing.assert_close(order(two_loss[name]), order(straight_loss[name]),
                                       rtol=1e-3, atol=1e-3)
        elif two_loss[name].is_floating_point():
            torch.testing.assert_close(two_loss[name], straight_loss[name], rtol=1e-3,
                                       atol=1e-3, msg=name)
        else:
            assert torch.equal(two_loss[name], straight_loss[name]), name


@pytest.mark.parametrize("override, message", [
    ("config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,16]}]]",
     "BYOLLoss needs a projection head followed by 1 prediction head(s) in "
     "config.MODEL.HEAD.PARAMS, got 1 head(s)"),
    ("config.MODEL.HEAD.OUTPUT_HEADS=[0,2]",
     "config.MODEL.HEAD.OUTPUT_HEADS=[0, 2] must list indices of the 2 head(s) of "
     "config.MODEL.HEAD.PARAMS"),
])
def test_heads_a_method_cannot_use_are_refused_before_launch(tmp_path, capsys, override, message):
    from ssl_engine.engines.launcher import main

    code = main(["config=test/quick_byol_synthetic", f"config.CHECKPOINT.DIR={tmp_path}",
                 override])
    assert code == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"
    assert not any(tmp_path.iterdir())
