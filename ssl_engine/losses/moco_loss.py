"""MoCo v2 (He et al. 2020; Chen et al. 2020): InfoNCE of a query against its key from the
momentum encoder and a queue of keys of past batches."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import embedding_output
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.device import from_host
from ssl_engine.utils.distributed import gather_from_all, get_rank, get_world_size


QUEUE_SEED = 0  # the initial queue is the same on every rank and in every run


@register_loss("moco_loss")
class MoCoLoss(MomentumTargetLoss):
    """``-log(exp(q.k/t) / (exp(q.k/t) + sum_j exp(q.n_j/t)))`` with ``q`` the model's output on
    one view, ``k`` the momentum encoder's output on the other (``moco_collator`` gives the
    model ``input`` and the encoder ``input_momentum``), ``n_j`` the ``queue_size`` keys in the
    queue, all l2-normalised.  After each update the keys of every rank are enqueued (in rank
    order, oldest overwritten) and the encoder moves with ``momentum``.

    ``shuffle_batch``: the encoder sees the global batch of keys shuffled over ranks, so that
    a rank's batch norm never sees a query's image and its key's image together.  With one
    process the keys are shuffled within the batch, which matters when MODEL.BATCH_NORM_SPLITS
    normalises the batch in slices (one process then trains as that many ranks would).
    """

    def __init__(self, embedding_dim: int = 128, queue_size: int = 65536,
                 momentum: float = 0.999, temperature: float = 0.2, shuffle_batch: bool = True):
        super().__init__(momentum, "constant")
        if temperature <= 0:
            raise ValueError(f"moco_loss: temperature must be > 0, got {temperature}")
        if queue_size < 1:
            raise ValueError(f"moco_loss: queue_size must be >= 1, got {queue_size}")
        self.embedding_dim = int(embedding_dim)
        self.temperature = float(temperature)
        self.shuffle_batch = bool(shuffle_batch)
        generator = torch.Generator().manual_seed(QUEUE_SEED)
        queue = F.normalize(torch.randn(int(queue_size), self.embedding_dim, generator=generator),
                            dim=1)
        self.register_buffer("queue", queue)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))
        self._keys_to_enqueue = None

    def target_input(self, batch):
        """The keys' view, which ``moco_collator`` gives apart from the queries' (``input``).
        Without it the encoder would see the queries' own view and the positive pair would
        be one image twice: refused rather than trained."""
        if "input_momentum" not in batch:
            raise ValueError("moco_loss: the batch has no 'input_momentum' (the keys' view), so "
                             "each key would be its query's own view: set "
                             "config.DATA.TRAIN.COLLATE_FUNCTION=moco_collator")
        return batch["input_momentum"]

    def run_target(self, inputs, task) -> torch.Tensor:
        if not self.shuffle_batch:
            return super().run_target(inputs, task)
        # with one process the gather is the batch itself and the slices of the batch norm
        # (MODEL.BATCH_NORM_SPLITS) play the ranks
        world_size, rank = get_world_size(), get_rank()
        everything = gather_from_all(inputs)
        # the same permutation on every rank, and again after a resume
        seed = task.config.SEED_VALUE * 1_000_003 + task.iteration
        generator = torch.Generator().manual_seed(seed)
        order = from_host(torch.randperm(everything.shape[0], generator=generator),
                          everything.device)
        keys = super().run_target(everything[order].chunk(world_size)[rank], task)
        shuffled_keys = gather_from_all(keys)
        unshuffled = torch.empty_like(shuffled_keys)
        unshuffled[order] = shuffled_keys
        return unshuffled.chunk(world_size)[rank]

    def forward(self, output, target=None) -> torch.Tensor:
        query = F.normalize(embedding_output(output, "moco_loss", self.embedding_dim), dim=1)
        key = F.normalize(self.get_target_output().detach(), dim=1)
        if key.shape != query.shape:
            raise ValueError(f"moco_loss: {tuple(key.shape)} keys for {tuple(query.shape)} "
                             "queries; use moco_collator (one query and one key view)")
        positive = (query * key).sum(dim=1, keepdim=True)
        negative = query @ self.queue.detach().t()
        logits = torch.cat([positive, negative], dim=1) / self.temperature
        labels = torch.zeros(query.shape[0], dtype=torch.long, device=query.device)
        self._keys_to_enqueue = gather_from_all(key)
        return F.cross_entropy(logits, labels)

    @torch.no_grad()
    def update_target(self, online, step: int, total: int) -> None:
        super().update_target(online, step, total)
        if self._keys_to_enqueue is not None:
            keys, self._keys_to_enqueue = self._keys_to_enqueue, None
            # the pointer stays on the device: reading it would make the host wait
            size, count, skip = self.queue.shape[0], keys.shape[0], 0
            if count > size:  # a queue smaller than the global batch keeps the last keys
                keys, skip = keys[count - size:], count - size
            offsets = torch.arange(skip, skip + keys.shape[0], device=keys.device)
            rows = (self.queue_ptr + offsets) % size
            self.queue[rows] = keys
            self.queue_ptr.add_(count).remainder_(size)
