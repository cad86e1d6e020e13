"""iBOT and MAE train end to end on their tiny synthetic configs; a run crashed mid-epoch and
resumed ends bit-exact with an uninterrupted one (the masks of the data pipeline replayed, the
teacher and centers of iBOT included); 2 processes with half the batch each train like 1
process with the whole batch (the iBOT centers averaged over ranks)."""
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

# 16 images, batch 8: 2 iterations in one epoch, a checkpoint after each
COMMON = ["config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16",
          "config.LOG_FREQUENCY=1", "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"]
TERMS = {"ibot": {"cls", "patch"}, "mae": {"masked_mse"}}


@pytest.mark.parametrize("method", ["ibot", "mae"])
def test_method_trains_resumes_exactly_and_scales_to_two_processes(tmp_path, method):
    config = f"config=test/quick_{method}_synthetic"
    one = ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8", *COMMON]
    run_engine(tmp_path / "straight", one, config=config)
    losses = step_losses(tmp_path / "straight")
    assert sorted(losses) == [1, 2]
    for record in (r for r in metrics(tmp_path / "straight") if r.get("phase") == "train"):
        assert set(record["loss_terms"]) == TERMS[method]
        assert sum(record["loss_terms"].values()) == pytest.approx(record["loss"], rel=1e-5)
        assert record["loss_terms"][sorted(TERMS[method])[-1]] > 0

    with pytest.raises(RuntimeError, match="simulated crash"):
        run_engine(tmp_path / "crashed", one, config=config, hook_generator=crash_hooks_at(1))
    run_engine(tmp_path / "crashed", one + ["config.CHECKPOINT.AUTO_RESUME=true"], config=config)
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "crashed")
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    straight_loss = loss_state(tmp_path / "straight")
    resumed_loss = loss_state(tmp_path / "crashed")
    assert straight_loss.keys() == resumed_loss.keys()
    if method == "ibot":  # the teacher and both centers are checkpointed
        assert {"center", "center2"} <= set(straight_loss)
        assert any(name.startswith("target_network") for name in straight_loss)
    for name in straight_loss:
        assert torch.equal(straight_loss[name], resumed_loss[name]), name
    assert step_losses(tmp_path / "crashed")[2] == losses[2]

    run_engine(tmp_path / "two", ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                                  "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", *COMMON],
               config=config)
    assert_trains_like_one_process(tmp_path / "two", losses, straight)
    two_loss = loss_state(tmp_path / "two")
    for name in straight_loss:
        torch.testing.assert_close(two_loss[name], straight_loss[name], rtol=1e-3, atol=1e-3,
                                   msg=name)
