"""simclr_info_nce_loss against a numpy loop, and 2 gloo processes against 1 process."""
import numpy as np
import pytest
import torch
import torch.distributed as dist

from gloo_utils import spawn_ranks
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.losses import SimclrInfoNCELoss, build_loss
from ssl_engine.utils.registry import UnknownNameError

TEMPERATURE = 0.2
DIM = 8


def numpy_nt_xent(z: np.ndarray, num_views: int, temperature: float) -> float:
    """Straightforward loop over anchors of view-major embeddings ``z`` (all samples)."""
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    num_samples = z.shape[0] // num_views
    losses = []
    for view in range(num_views):
        for sample in range(num_samples):
            anchor = view * num_samples + sample
            sims = z @ z[anchor] / temperature
            denominator = sum(np.exp(sims[k]) for k in range(z.shape[0]) if k != anchor)
            per_positive = [
                -np.log(np.exp(sims[other * num_samples + sample]) / denominator)
                for other in range(num_views)
                if other != view
            ]
            losses.append(np.mean(per_positive))
    return float(np.mean(losses))


def random_embeddings(num_views: int, num_samples: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_views * num_samples, DIM, generator=generator, dtype=torch.float64)


def make_loss(num_views: int) -> SimclrInfoNCELoss:
    return SimclrInfoNCELoss(temperature=TEMPERATURE, embedding_dim=DIM, num_views=num_views)


@pytest.mark.parametrize("num_views", [2, 3, 4])
def test_matches_numpy_loop(num_views):
    z = random_embeddings(num_views, num_samples=5, seed=num_views)
    loss = make_loss(num_views)([z], torch.zeros(z.shape[0], dtype=torch.long))
    assert loss.item() == pytest.approx(numpy_nt_xent(z.numpy(), num_views, TEMPERATURE), rel=1e-10)


def test_float32_and_lone_tensor_and_cached_masks():
    z = random_embeddings(2, num_samples=6, seed=7)
    loss_fn = make_loss(2)
    first = loss_fn(z.float(), torch.zeros(12, dtype=torch.long))
    second = loss_fn([z.float()], torch.zeros(12, dtype=torch.long))
    assert first.item() == pytest.approx(numpy_nt_xent(z.numpy(), 2, TEMPERATURE), rel=1e-5)
    assert second.item() == first.item()
    assert len(loss_fn._masks) == 1


def test_build_from_config_and_state():
    cfg = AttrDict(
        {
            "name": "simclr_info_nce_loss",
            "simclr_info_nce_loss": {"temperature": 0.5, "buffer_params": {"embedding_dim": 16}},
        }
    )
    loss = build_loss(cfg)
    assert isinstance(loss, SimclrInfoNCELoss)
    assert (loss.temperature, loss.embedding_dim, loss.num_views) == (0.5, 16, 2)
    assert dict(loss.get_classy_state()) == {}
    loss.set_classy_state({})


def test_unknown_loss_name_is_refused_with_suggestion():
    with pytest.raises(UnknownNameError, match="did you mean 'simclr_info_nce_loss'"):
        build_loss(AttrDict({"name": "simclr_info_nce"}))


def test_bad_shapes_are_refused():
    loss = make_loss(2)
    with pytest.raises(ValueError, match=r"shape \[N, 8\].*got \(4, 5\)"):
        loss([torch.zeros(4, 5)], None)
    with pytest.raises(ValueError, match="not a multiple of num_views=2"):
        loss([torch.ones(5, DIM)], None)
    with pytest.raises(ValueError, match="num_views >= 2"):
        SimclrInfoNCELoss(num_views=1)


# ---- two processes (gloo) against one process on the same global batch ----

WORLD_SIZE = 2
LOCAL_SAMPLES = 3
CASES = [(2, 11), (3, 12)]  # (num_views, seed)


def rank_rows(num_views: int, rank: int) -> torch.Tensor:
    """Rows of the global view-major batch that rank ``rank`` holds, in its own view-major order."""
    global_samples = WORLD_SIZE * LOCAL_SAMPLES
    return torch.tensor(
        [
            view * global_samples + rank * LOCAL_SAMPLES + sample
            for view in range(num_views)
            for sample in range(LOCAL_SAMPLES)
        ]
    )


def run_rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    try:
        results = {}
        for num_views, seed in CASES:
            z = random_embeddings(num_views, WORLD_SIZE * LOCAL_SAMPLES, seed)
            local = z[rank_rows(num_views, rank)].clone().requires_grad_(True)
            loss = make_loss(num_views)([local], None)
            loss.backward()
            results[num_views] = (loss.detach(), local.grad / WORLD_SIZE)
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_processes_match_one_process(tmp_path):
    spawn_ranks(run_rank, WORLD_SIZE, tmp_path, lambda init: (init, str(tmp_path)))
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    for num_views, seed in CASES:
        z = random_embeddings(num_views, WORLD_SIZE * LOCAL_SAMPLES, seed).requires_grad_(True)
        full_loss = make_loss(num_views)([z], None)
        full_loss.backward()
        mean_loss = sum(results[num_views][0] for results in per_rank) / WORLD_SIZE
        assert mean_loss.item() == pytest.approx(full_loss.item(), abs=1e-10)
        for rank, results in enumerate(per_rank):
            torch.testing.assert_close(results[num_views][1], z.grad[rank_rows(num_views, rank)], atol=1e-10, rtol=0)
