"""What every trunk offers the model: named stages, a default output and their widths."""
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn


def drop_path_rates(rate: float, num_blocks: int) -> List[float]:
    """The stochastic-depth rate of each of ``num_blocks`` blocks, rising linearly from 0 to
    ``rate``. Computed on the CPU whatever the default device, so that a model built on the
    meta device (the checks before launch) builds as it does for real."""
    return torch.linspace(0, rate, num_blocks, device="cpu").tolist()


class StagedTrunk(nn.Module):
    """A trunk whose forward returns the outputs of named stages.

    Subclasses set ``stage_dims`` (stage name -> channels, in forward order) and
    ``default_out_feat_key``, and implement ``stages()``: (name, callable) pairs in order.
    """

    stage_dims: Dict[str, int]
    default_out_feat_key: str
    # what VISSL's trunk of the same name puts before these parameter names in its checkpoints
    # ("" where the names are VISSL's already; None where they are not VISSL's names at all, so
    # that they are read as they are but not converted; see checkpoint/formats.py)
    VISSL_KEY_PREFIX: Optional[str] = ""

    def __init__(self, model_cfg=None):
        """A trunk built from ``model_cfg`` (the MODEL section) first refuses what its
        ``check_config`` refuses, so that building it directly fails as a launch would."""
        super().__init__()
        if model_cfg is not None:
            self.check_config(model_cfg)

    @classmethod
    def derive_config(cls, cfg) -> None:
        """Fill, in place and before launch, the settings of ``cfg`` (the whole config) that
        follow from this trunk's; called by the config's derivations (``derive_settings``) for
        the trunk MODEL.TRUNK.NAME, before ``check_config``.  Does nothing by default."""

    @classmethod
    def check_config(cls, model_cfg) -> None:
        """Refuse the MODEL settings this trunk cannot build, naming the key; called before any
        process starts (``check_trunk_config``) and by ``__init__``. Accepts all by default."""

    @property
    def stage_names(self) -> List[str]:
        return list(self.stage_dims)

    @property
    def output_dim(self) -> int:
        """Channels of the default output."""
        return self.stage_dims[self.default_out_feat_key]

    def stages(self):
        raise NotImplementedError

    def check_out_feat_keys(self, out_feat_keys: Optional[Sequence[str]]) -> List[str]:
        """The requested stage names (default: the default output); unknown names fail."""
        keys = [self.default_out_feat_key] if not out_feat_keys else list(out_feat_keys)
        unknown = [key for key in keys if key not in self.stage_dims]
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no stage(s) {unknown}; "
                f"its stages are: {', '.join(self.stage_names)}"
            )
        return keys

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        """The outputs of the stages in ``out_feat_keys``, in that order.

        Stages after the last requested one are not run.
        """
        keys = self.check_out_feat_keys(out_feat_keys)
        wanted = set(keys)
        found: Dict[str, torch.Tensor] = {}
        for name, stage in self.stages():
            x = stage(x)
            if name in wanted:
                found[name] = x
                if len(found) == len(wanted):
                    break
        return [found[key] for key in keys]
