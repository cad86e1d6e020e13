"""Settings VISSL's configs write for GPUs (or for apex), rewritten to what the run can do, with
one warning each.

Called by ``validate_config`` on the composed config (plain dicts), before the unsupported
settings are refused; the processes then get the rewritten config, so each warning is given
once, by the launcher:

- ``MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE``: torch's SyncBatchNorm (``pytorch``) and apex's refuse
  CPU tensors; on a CPU run the batch norms are synchronised with ``all_reduce`` (the engine's
  GlobalBatchNorm: the same statistics over the same processes). On GPUs ``apex`` (not
  maintained for current torch) becomes ``pytorch``, which computes the same statistics.
- ``MODEL.AMP_PARAMS.AMP_TYPE=apex`` on a CPU (apex needs CUDA): torch.amp, bfloat16.
- ``MODEL.AMP_PARAMS.AMP_ARGS`` keys that only apex read (``opt_level``,
  ``keep_batchnorm_fp32``, ``loss_scale``, ``master_weights``) with torch.amp: dropped, as VISSL
  passed AMP_ARGS to apex only.
- ``MODEL.FSDP_CONFIG.FORCE_SYNC_CUDA`` on a CPU: there is no CUDA to synchronise.

``DATA.PIN_MEMORY`` and ``MODEL.CUDA_CACHE`` need nothing here: a CPU run does not pin batches
and has no CUDA cache to empty (trainer/cuda_cache.py says so), as in VISSL.
"""
import logging
from typing import List

logger = logging.getLogger(__name__)

APEX_AMP_ARGS = ("opt_level", "keep_batchnorm_fp32", "loss_scale", "master_weights")
_SYNC_BN = "config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE"
_AMP = "config.MODEL.AMP_PARAMS"


def _section(cfg: dict, *path: str) -> dict:
    """``cfg[path[0]][path[1]]...`` when every part is a dict, else an empty dict."""
    node = cfg
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _sync_bn(model: dict, on_cpu: bool) -> List[str]:
    sync = _section(model, "SYNC_BN_CONFIG")
    kind = sync.get("SYNC_BN_TYPE")
    if not sync.get("CONVERT_BN_TO_SYNC_BN") or kind not in ("pytorch", "apex"):
        return []
    if on_cpu:
        sync["SYNC_BN_TYPE"] = "all_reduce"
        why = "torch's SyncBatchNorm" if kind == "pytorch" else "apex"
        return [f"{_SYNC_BN}={kind} is for GPUs ({why} refuses CPU tensors): on this CPU run "
                "(config.MACHINE.DEVICE=cpu) the batch norms are synchronised with all_reduce "
                "instead, the same statistics over the same processes"]
    if kind == "apex":
        sync["SYNC_BN_TYPE"] = "pytorch"
        return [f"{_SYNC_BN}=apex: apex is not maintained for current torch; torch's "
                "SyncBatchNorm (pytorch), which computes the same statistics, is used instead"]
    return []


def _amp(model: dict, on_cpu: bool) -> List[str]:
    amp = _section(model, "AMP_PARAMS")
    if not amp.get("USE_AMP"):
        return []
    warnings = []
    if on_cpu and str(amp.get("AMP_TYPE", "")).lower() == "apex":
        amp["AMP_TYPE"] = "pytorch"
        warnings.append(f"{_AMP}.AMP_TYPE=apex needs CUDA: on this CPU run "
                        "(config.MACHINE.DEVICE=cpu) mixed precision is torch.amp's "
                        "(AMP_TYPE=pytorch, bfloat16 autocast) instead")
    args = amp.get("AMP_ARGS")
    if str(amp.get("AMP_TYPE", "")).lower() == "pytorch" and isinstance(args, dict):
        apex_keys = [key for key in APEX_AMP_ARGS if key in args]
        for key in apex_keys:
            args.pop(key)
        if apex_keys:
            written = ", ".join(f"{key}" for key in apex_keys)
            warnings.append(f"{_AMP}.AMP_ARGS {written}: only apex read these (VISSL passed "
                            "AMP_ARGS to apex only); with AMP_TYPE=pytorch they are ignored, "
                            "as in VISSL (torch.amp takes AMP_ARGS.dtype)")
    return warnings


def _fsdp(model: dict, on_cpu: bool) -> List[str]:
    fsdp = _section(model, "FSDP_CONFIG")
    if not on_cpu or not fsdp.get("FORCE_SYNC_CUDA"):
        return []
    fsdp["FORCE_SYNC_CUDA"] = False
    return ["config.MODEL.FSDP_CONFIG.FORCE_SYNC_CUDA=true has no effect on a CPU run "
            "(config.MACHINE.DEVICE=cpu): there is no CUDA to synchronise"]


def adapt_gpu_settings(cfg: dict) -> List[str]:
    """Rewrite, in place, the GPU-only settings of ``cfg`` (a composed config with its
    ``config`` section, plain dicts) to what the run's device can do; warns once for each and
    returns the warnings."""
    config = _section(cfg, "config")
    model = _section(config, "MODEL")
    on_cpu = str(_section(config, "MACHINE").get("DEVICE", "gpu")) == "cpu"
    warnings = _sync_bn(model, on_cpu) + _amp(model, on_cpu) + _fsdp(model, on_cpu)
    for text in warnings:
        logger.warning(text)
    return warnings
