"""NNCLR (Dwibedi et al. 2021): contrastive learning whose positive is the nearest neighbour of
a view's projection in a support set of past projections, not the projection itself."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import embedding_output, total_of, two_views
from ssl_engine.losses.simclr_info_nce_loss import SimclrInfoNCELoss
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all

SUPPORT_SEED = 0  # the initial support set is the same on every rank and in every run


@register_loss("nnclr_loss")
class NNCLRLoss(SSLLoss):
    """The model returns the projection ``z`` and the prediction ``p`` of two views
    (MODEL.HEAD.OUTPUT_HEADS [0, 1]: the projector, then the predictor).  Each view's ``z`` is
    replaced by its nearest neighbour (cosine) in the support set, without gradient, and that
    neighbour is the positive of the other view's prediction in NT-Xent over the global batch:

        loss = (NT-Xent(NN(z0), p1) + NT-Xent(NN(z1), p0)) / 2

    where NT-Xent(a, b) is SimCLR's loss on the 2N rows [a; b] (each row's positive is its
    sample's row in the other half, every other row a negative).  Both views look up the
    support set as it was before the step; then view 1's projections of every rank are
    enqueued (rank after rank, oldest overwritten).  The support set (``queue``) and its
    pointer (``queue_ptr``) are buffers, so they are in every checkpoint and a resumed run
    continues them exactly."""

    batch_coupling = ("its negatives are the other samples of the batch, and the support set "
                      "grows by every micro-batch")

    def __init__(self, embedding_dim: int = 256, temperature: float = 0.1,
                 support_set_size: int = 98304):
        super().__init__()
        if support_set_size < 1:
            raise ValueError(f"nnclr_loss: support_set_size must be >= 1, got {support_set_size}")
        self.embedding_dim = int(embedding_dim)
        self.info_nce = SimclrInfoNCELoss(temperature, self.embedding_dim, num_views=2)
        generator = torch.Generator().manual_seed(SUPPORT_SEED)
        support = F.normalize(torch.randn(int(support_set_size), self.embedding_dim,
                                          generator=generator), dim=1)
        self.register_buffer("queue", support)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @classmethod
    def check_model_config(cls, model_cfg) -> None:
        outputs = model_cfg.HEAD.get("OUTPUT_HEADS", [-1])
        if len(model_cfg.HEAD.PARAMS or []) < 2 or len(outputs or []) != 2:
            raise ValueError("nnclr_loss needs a projection head and a prediction head in "
                             "config.MODEL.HEAD.PARAMS with config.MODEL.HEAD.OUTPUT_HEADS "
                             f"[0, 1], got {len(model_cfg.HEAD.PARAMS or [])} head(s) and "
                             f"OUTPUT_HEADS {outputs}")

    @torch.no_grad()
    def nearest_neighbours(self, projection: torch.Tensor) -> torch.Tensor:
        """The support set's row of highest cosine with each row of ``projection``."""
        support = self.queue
        cosines = F.normalize(projection, dim=1) @ F.normalize(support, dim=1).t()
        return support.index_select(0, cosines.argmax(dim=1))

    @torch.no_grad()
    def enqueue(self, projections: torch.Tensor) -> None:
        """Write ``projections`` over the oldest rows; the pointer stays on the device (reading
        it would make the host wait)."""
        size, count, skip = self.queue.shape[0], projections.shape[0], 0
        if count > size:  # a support set smaller than the global batch keeps the last rows
            projections, skip = projections[count - size:], count - size
        offsets = torch.arange(skip, skip + projections.shape[0], device=projections.device)
        self.queue[(self.queue_ptr + offsets) % size] = projections.to(self.queue)
        self.queue_ptr.add_(count).remainder_(size)

    def forward(self, output, target=None) -> torch.Tensor:
        projection = embedding_output(output, "nnclr_loss", self.embedding_dim, index=0)
        prediction = embedding_output(output, "nnclr_loss", self.embedding_dim, index=1)
        z0, z1 = two_views(projection.detach(), "nnclr_loss")
        p0, p1 = two_views(prediction, "nnclr_loss")
        nn0, nn1 = self.nearest_neighbours(z0), self.nearest_neighbours(z1)
        terms = {"view0_to_view1": 0.5 * self.info_nce([torch.cat([nn0.to(p1), p1])]),
                 "view1_to_view0": 0.5 * self.info_nce([torch.cat([nn1.to(p0), p0])])}
        if self.step_context.train:
            self.enqueue(gather_from_all(z1))
        return total_of(self, terms)
