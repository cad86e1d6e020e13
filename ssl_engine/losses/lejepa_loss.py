"""LeJEPA (Balestriero & LeCun 2025): every view's embedding predicts the mean embedding of the
global views (the prediction term), and SIGReg pulls the distribution of the embeddings
toward an isotropic Gaussian; no teacher, no stop-gradient, no negatives."""
import torch

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import as_output_list, embedding_output, total_of
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.device import from_host
from ssl_engine.utils.distributed import all_reduce_sum_with_grad, get_world_size
from ssl_engine.utils.errors import ConfigError

DIRECTIONS_SEED = 0  # with the iteration: the same slices on every rank and after a resume


def sigreg(projections: torch.Tensor, directions: torch.Tensor, t_max: float,
           knots: int) -> torch.Tensor:
    """SIGReg of [V, N, D] embeddings along the unit columns of ``directions`` [D, M]: per view
    and direction, the Epps-Pulley statistic ``N * int |phi_N(t) - exp(-t^2/2)|^2 exp(-t^2/2)
    dt`` over t in [-t_max, t_max] (trapezoid rule on ``knots`` points of [0, t_max], the
    integrand being even), averaged over views and directions.  ``phi_N`` is the empirical
    characteristic function over the global batch (sums all-reduced with gradient)."""
    t = torch.linspace(0, t_max, knots, dtype=projections.dtype, device=projections.device)
    gaussian = torch.exp(-t.square() / 2)
    step = t_max / (knots - 1)
    knot = torch.arange(knots, device=projections.device)  # trapezoid: half weight at the ends
    weights = torch.where((knot == 0) | (knot == knots - 1), step, 2 * step).to(t.dtype)
    samples = projections.shape[1] * get_world_size()
    angles = (projections @ directions).unsqueeze(-1) * t  # V, N, M, knots
    cos_mean = all_reduce_sum_with_grad(angles.cos().sum(dim=1)) / samples
    sin_mean = all_reduce_sum_with_grad(angles.sin().sum(dim=1)) / samples
    error = (cos_mean - gaussian).square() + sin_mean.square()
    return ((error @ (weights * gaussian)) * samples).mean()


def random_directions(dim: int, count: int, iteration: int) -> torch.Tensor:
    """[dim, count] Gaussian columns scaled to unit length, a function of the iteration."""
    generator = torch.Generator().manual_seed(DIRECTIONS_SEED * 1_000_003 + int(iteration))
    directions = torch.randn(dim, count, generator=generator)
    return directions / directions.norm(dim=0)


@register_loss("lejepa_loss")
class LeJEPALoss(SSLLoss):
    """``output[-1]`` holds ``num_crops * B`` embeddings, crop-major, the ``num_global_crops``
    global crops first (multicrop_collator's order).  With ``mu`` the mean of a sample's global
    views:

        loss = lambda_ * SIGReg(all views) + (1 - lambda_) * mean over views, samples and
               dimensions of (view - mu)^2

    SIGReg's ``num_slices`` directions are drawn anew each iteration from a generator seeded
    by it (the same on every rank and after a resume)."""

    batch_coupling = "SIGReg compares the batch's distribution of embeddings with a Gaussian"
    crops_key = "num_crops"

    def __init__(self, embedding_dim: int = 128, num_crops: int = 2, num_global_crops: int = 2,
                 lambda_: float = 0.05, num_slices: int = 1024, knots: int = 17,
                 t_max: float = 3.0):
        super().__init__()
        if not 1 <= num_global_crops <= num_crops or num_crops < 2:
            raise ValueError(f"lejepa_loss needs 1 <= num_global_crops <= num_crops and "
                             f"num_crops >= 2, got {num_global_crops} and {num_crops}")
        if not 0 <= lambda_ <= 1 or num_slices < 1 or knots < 2 or t_max <= 0:
            raise ValueError("lejepa_loss: lambda_ in [0, 1], num_slices >= 1, knots >= 2 and "
                             f"t_max > 0, got {lambda_}, {num_slices}, {knots}, {t_max}")
        self.embedding_dim, self.num_crops = int(embedding_dim), int(num_crops)
        self.num_global_crops, self.lambda_ = int(num_global_crops), float(lambda_)
        self.num_slices, self.knots, self.t_max = int(num_slices), int(knots), float(t_max)

    @classmethod
    def derive_config(cls, cfg) -> None:
        """num_crops from the transforms (the default), num_global_crops from
        ImgPilToMultiCrop's first resolution (every crop of ImgReplicatePil is global)."""
        super().derive_config(cfg)
        settings = cfg.LOSS.setdefault(cfg.LOSS.name, {})
        for transform in cfg.DATA.TRAIN.TRANSFORMS or []:
            if transform.get("name") == "ImgPilToMultiCrop" and not cfg.TEST_ONLY:
                settings["num_global_crops"] = int(transform["num_crops"][0])
            elif transform.get("name") == "ImgReplicatePil" and not cfg.TEST_ONLY:
                settings["num_global_crops"] = int(transform.get("num_times", 2))
        if settings.get("num_global_crops", 2) > settings.get("num_crops", 2):
            raise ConfigError(f"config.LOSS.{cfg.LOSS.name}.num_global_crops must not exceed "
                              "num_crops")

    def forward(self, output, target=None) -> torch.Tensor:
        embedding = embedding_output(output, "lejepa_loss", self.embedding_dim,
                                     len(as_output_list(output)) - 1)  # the last output
        rows = embedding.shape[0]
        if rows % self.num_crops:
            raise ValueError(f"lejepa_loss expects num_crops * B rows (LOSS.lejepa_loss."
                             f"num_crops={self.num_crops}), got {rows}")
        views = embedding.float().view(self.num_crops, rows // self.num_crops, -1)
        centre = views[:self.num_global_crops].mean(dim=0)
        directions = random_directions(self.embedding_dim, self.num_slices,
                                       self.step_context.iteration)
        directions = from_host(directions, views.device)
        return total_of(self, {
            "sigreg": self.lambda_ * sigreg(views, directions, self.t_max, self.knots),
            "prediction": (1 - self.lambda_) * (views - centre).square().mean()})
