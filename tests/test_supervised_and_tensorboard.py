"""A supervised run on the bundled digits learns; TensorBoard events are written when asked."""
from pathlib import Path

from engine_utils import metrics, run_engine


def test_supervised_digits_learns_and_writes_tensorboard(tmp_path):
    run_engine(tmp_path, ["config.OPTIMIZER.num_epochs=2", "config.LOG_FREQUENCY=5",
                          "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=true",
                          "config.HOOKS.RUN_REPORT.ENABLED=false"],  # seconds not tested here
               config="config=supervised/digits_resnet")
    test_ends = [r for r in metrics(tmp_path) if r.get("phase_end") == "test"]
    assert len(test_ends) == 2
    top1 = test_ends[-1]["meters"]["accuracy_list_meter"]["top_1"]["0"]
    top5 = test_ends[-1]["meters"]["accuracy_list_meter"]["top_5"]["0"]
    assert top1 >= 80.0, top1  # chance is 10%; measured about 90% after 2 epochs
    assert top5 >= top1

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(tmp_path) / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "Losses/train_loss" in tags and "Optimizer/lr" in tags
    assert "Meters/test/accuracy_list_meter/top_1/0" in tags
    assert len(events.Scalars("Losses/train_loss")) == 8  # 2 x 20 iterations / LOG_FREQUENCY 5
