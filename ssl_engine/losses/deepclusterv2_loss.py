"""DeepCluster v2 (the baseline of Caron et al. 2020): every epoch, k-means on a memory bank of
the embeddings of the whole training set gives each sample a cluster per clustering; the
model learns to predict the clusters of its crops by their similarity to the centroids."""
from typing import List, Sequence

import torch
import torch.nn.functional as F

from ssl_engine.data import build_dataloader
from ssl_engine.hooks.deepclusterv2_hooks import DeepClusterV2Hook
from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.memory_bank import gather_rows
from ssl_engine.losses.outputs import embedding_output, total_of
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.cpu_budget import loader_workers

UNASSIGNED = -100  # a sample not in the memory (yet): no loss
CENTROID_SEED = 0  # the k-means starts are the same on every rank, a function of the epoch


@register_loss("deepclusterv2_loss")
class DeepClusterV2Loss(SSLLoss):
    """The model's ``output[0]``: ``num_crops * B`` embeddings, crop-major; the target: each
    row's sample index (``DATA.TRAIN.LABEL_TYPE: sample_index``).  For each clustering ``h``
    of ``num_clusters``: cross entropy of ``normalize(e) . centroids_h / temperature`` against
    the sample's cluster, for every crop; averaged over the clusterings.

    The memory bank holds, for every training sample and every crop of ``crops_for_mb``, its
    last normalised embedding (a first pass over the data fills it before training, the
    training steps overwrite the global batch's rows).  At the start of every epoch,
    clustering ``h`` runs ``kmeans_iters`` iterations of spherical k-means on memory bank
    ``h mod len(crops_for_mb)``, starting from ``num_clusters[h]`` random entries.  Every rank
    holds the whole memory and clusters it alike, so any number of processes gives the same
    clusters."""

    crops_key = "num_crops"
    sample_index_targets = True  # its memory bank is indexed by sample
    config_keys = {"crops_for_mb": "memory_params.crops_for_mb",
                   "embedding_dim": "memory_params.embedding_dim"}

    def __init__(self, num_clusters: Sequence[int] = (3000, 3000, 3000), kmeans_iters: int = 10,
                 temperature: float = 0.1, num_crops: int = 2, crops_for_mb: Sequence[int] = (0,),
                 embedding_dim: int = 128, num_train_samples: int = -1):
        super().__init__()
        self.num_clusters = [int(k) for k in num_clusters]
        self.crops_for_mb = [int(c) for c in crops_for_mb]
        if int(num_train_samples) < 1:
            raise ValueError("deepclusterv2_loss needs num_train_samples (filled in from the "
                             f"training set), got {num_train_samples}")
        if not self.num_clusters or min(self.num_clusters) < 1:
            raise ValueError(f"deepclusterv2_loss: num_clusters must be positive counts, got "
                             f"{self.num_clusters}")
        if not self.crops_for_mb or not all(0 <= c < num_crops for c in self.crops_for_mb):
            raise ValueError(f"deepclusterv2_loss: memory_params.crops_for_mb "
                             f"{self.crops_for_mb} must be crop indices below num_crops="
                             f"{num_crops}")
        if temperature <= 0 or kmeans_iters < 0:
            raise ValueError(f"deepclusterv2_loss: temperature must be > 0 and kmeans_iters "
                             f">= 0, got {temperature} and {kmeans_iters}")
        self.kmeans_iters = int(kmeans_iters)
        self.temperature = float(temperature)
        self.num_crops = int(num_crops)
        self.embedding_dim = int(embedding_dim)
        size = int(num_train_samples)
        self.register_buffer("memory", torch.zeros(len(self.crops_for_mb), size,
                                                   self.embedding_dim))
        self.register_buffer("in_memory", torch.zeros(size, dtype=torch.bool))
        self.register_buffer("assignments", torch.full((len(self.num_clusters), size),
                                                       UNASSIGNED, dtype=torch.long))
        for index, clusters in enumerate(self.num_clusters):
            self.register_buffer(f"centroids{index}", torch.zeros(clusters, self.embedding_dim))

    @classmethod
    def build_hooks(cls) -> List:
        return [DeepClusterV2Hook()]

    def centroids(self, index: int) -> torch.Tensor:
        return getattr(self, f"centroids{index}")

    # ------------------------------------------------------------------ the loss
    def forward(self, output, target: torch.Tensor) -> torch.Tensor:
        embedding = embedding_output(output, "deepclusterv2_loss", self.embedding_dim)
        rows = embedding.shape[0]
        index = target.reshape(-1).long()
        if rows % self.num_crops or index.shape[0] != rows:
            raise ValueError(f"deepclusterv2_loss: {rows} embeddings and {index.shape[0]} "
                             f"targets for num_crops={self.num_crops} (multicrop_collator "
                             "gives one sample index per crop)")
        if bool((index < 0).any()) or int(index.max()) >= self.memory.shape[1]:
            raise ValueError("deepclusterv2_loss: targets must be sample indices below "
                             f"{self.memory.shape[1]} (DATA.TRAIN.LABEL_TYPE: sample_index)")
        embedding = F.normalize(embedding, dim=1)
        terms = {}
        for head in range(len(self.num_clusters)):
            scores = embedding @ self.centroids(head).t().to(embedding.dtype) / self.temperature
            labels = self.assignments[head][index]
            total = F.cross_entropy(scores, labels, ignore_index=UNASSIGNED, reduction="sum")
            terms[f"clustering{head}"] = total / max(1, int((labels != UNASSIGNED).sum())) \
                / len(self.num_clusters)
        if self.step_context.train:
            self.update_memory(embedding, index)
        return total_of(self, terms)

    # ------------------------------------------------------------------ the memory
    @torch.no_grad()
    def update_memory(self, embedding: torch.Tensor, index: torch.Tensor) -> None:
        """The rows of ``crops_for_mb`` of the global batch into the memory, on every rank."""
        batch = embedding.shape[0] // self.num_crops
        embedding, index = gather_rows(embedding.reshape(self.num_crops, batch, -1)
                                       .transpose(0, 1).contiguous(), index[:batch])
        for bank, crop in enumerate(self.crops_for_mb):
            self.memory[bank, index] = embedding[:, crop].to(self.memory.dtype)
        self.in_memory.index_fill_(0, index, True)  # no value copied from the host

    @torch.no_grad()
    def init_memory(self, task) -> None:
        """One pass over the training data (this rank's share, the first epoch's crops) with
        the model as it is, its embeddings into the memory."""
        cfg = task.config
        loader = build_dataloader(task.datasets["TRAIN"], cfg.DATA.TRAIN,
                                  num_workers=loader_workers(cfg), pin_memory=False, epoch=0,
                                  seed=cfg.SEED_VALUE)
        model, was_training = task.base_model, task.base_model.training
        model.train()
        try:
            for batch in loader:
                batch = task.to_device(batch)
                embedding = embedding_output(model(batch["input"]), "deepclusterv2_loss",
                                             self.embedding_dim).float()
                self.update_memory(F.normalize(embedding, dim=1), batch["target"].reshape(-1))
        finally:
            model.train(was_training)

    # ------------------------------------------------------------------ the clustering
    @torch.no_grad()
    def cluster_memory(self, epoch: int) -> None:
        """k-means of every clustering on its memory bank (the samples in the memory)."""
        rows = self.in_memory.nonzero().squeeze(1)
        for head, clusters in enumerate(self.num_clusters):
            if rows.numel() < clusters:
                raise ValueError(f"deepclusterv2_loss: {clusters} clusters for the "
                                 f"{rows.numel()} samples in the memory: reduce num_clusters")
            points = self.memory[head % len(self.crops_for_mb), rows]
            centroids, assigned = spherical_kmeans(
                points, clusters, self.kmeans_iters,
                seed=CENTROID_SEED + epoch * len(self.num_clusters) + head)
            self.centroids(head).copy_(centroids)
            self.assignments[head].fill_(UNASSIGNED)
            self.assignments[head, rows] = assigned


def spherical_kmeans(points: torch.Tensor, clusters: int, iterations: int, seed: int):
    """(centroids [clusters, dim], assignment of each point): k-means by cosine similarity of
    unit ``points``, from ``clusters`` distinct random points (a function of ``seed``); a
    centroid is the normalised mean of its points, an empty one stays where it was."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randperm(points.shape[0], generator=generator)[:clusters]
    centroids = points[start.to(points.device)].clone()
    for _ in range(iterations):
        assigned = (points @ centroids.t()).argmax(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, assigned, points)
        counts = torch.bincount(assigned, minlength=clusters)
        filled = counts > 0
        centroids[filled] = sums[filled] / counts[filled, None].to(sums.dtype)
        centroids = F.normalize(centroids, dim=1)
    return centroids, (points @ centroids.t()).argmax(dim=1)
