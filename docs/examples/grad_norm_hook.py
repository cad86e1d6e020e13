"""An example of a user hook: the norm of the gradients of every update, in the log line,
metrics.json and TensorBoard beside the loss. Use it with::

    SSL_ENGINE_PLUGINS=grad_norm_hook PYTHONPATH=docs/examples \\
    python tools/run_distributed_engines.py config=supervised/digits_resnet \\
        'config.HOOKS.EXTRA_HOOKS=[grad_norm]'
"""
import torch

from ssl_engine.hooks import SSLHook, register_hook


@register_hook("grad_norm")
class GradNormHook(SSLHook):
    """Puts the total norm of the gradients each update applied into the metrics store."""

    def __init__(self, cfg):  # a registered hook is built as cls(cfg)
        super().__init__()

    @torch.no_grad()
    def on_update(self, task):
        # training only, once per update, on every rank: every rank puts the same name
        # as often, so the writers can average it over ranks
        norms = [p.grad.norm() for p in task.base_model.parameters() if p.grad is not None]
        if norms:
            task.metrics.put("grad_norm", torch.stack(norms).norm())
