"""SimCLR's InfoNCE over multi-crop batches (the multi-crop of SwAV, Caron et al. 2020)."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import embedding_output
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all, get_rank


@register_loss("multicrop_simclr_info_nce_loss")
class MultiCropSimclrInfoNCELoss(SSLLoss):
    """Every crop of a sample is a positive of every other crop of it; the crops of the other
    samples, on every rank, are the negatives.

    ``output[0]`` holds ``num_crops * B`` embeddings of this rank's ``B`` samples, crop-major
    (rows ``c*B .. c*B+B-1`` are crop ``c``, as ``multicrop_collator`` gives them).  With cosine
    similarities ``s`` over the temperature, per anchor ``a`` and positive ``p``:
    ``-log(exp(s_ap) / (exp(s_ap) + sum_n exp(s_an)))``, ``n`` over the crops of the other
    samples of the global batch (the anchor's other positives are not in the denominator);
    averaged over the ``num_crops - 1`` positives and the local anchors.  With two crops it is
    ``simclr_info_nce_loss``.
    """

    batch_coupling = (
        "its negatives are the other samples of the batch, and accumulation does not add negatives"
    )
    crops_key = "num_crops"
    config_keys = {"embedding_dim": "buffer_params.embedding_dim"}  # VISSL's place for it

    def __init__(self, temperature: float = 0.1, embedding_dim: int = 128, num_crops: int = 2):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"multicrop_simclr_info_nce_loss: temperature must be > 0, got "
                             f"{temperature}")
        if num_crops < 2:
            raise ValueError(f"multicrop_simclr_info_nce_loss needs num_crops >= 2, got "
                             f"{num_crops}")
        self.temperature = float(temperature)
        self.embedding_dim = int(embedding_dim)
        self.num_crops = int(num_crops)

    def forward(self, output, target=None) -> torch.Tensor:
        embedding = embedding_output(output, "multicrop_simclr_info_nce_loss",
                                     self.embedding_dim)
        rows = embedding.shape[0]
        if rows % self.num_crops:
            raise ValueError(f"multicrop_simclr_info_nce_loss got {rows} rows, not a multiple "
                             f"of num_crops={self.num_crops} (taken from the ImgPilToMultiCrop "
                             "of DATA.TRAIN.TRANSFORMS)")
        batch = rows // self.num_crops
        embedding = F.normalize(embedding, dim=1)
        candidates = gather_from_all(embedding)  # [world * rows, dim], rank after rank
        logits = embedding @ candidates.t() / self.temperature
        device = embedding.device
        local = torch.arange(rows, device=device)
        crop, sample = local // batch, local % batch
        offset = get_rank() * rows
        # every crop of the anchor's own sample (itself included) is left out of the negatives
        same_sample = offset + torch.arange(self.num_crops, device=device)[None, :] * batch \
            + sample[:, None]
        negatives = logits.scatter(1, same_sample, float("-inf"))
        negative_mass = torch.logsumexp(negatives, dim=1, keepdim=True)
        shifts = torch.arange(1, self.num_crops, device=device)
        positive_columns = offset + ((crop[:, None] + shifts[None, :]) % self.num_crops) * batch \
            + sample[:, None]
        positives = logits.gather(1, positive_columns)
        return -(positives - torch.logaddexp(positives, negative_mass)).mean()
