"""The data source ``worker_killing_synthetic``: the synthetic images, except that data-loader
worker 0 SIGKILLs itself when it starts reading its $SSL_ENGINE_TEST_KILL_AT-th sample (as a
segfaulting decoder or the out-of-memory killer would end it)."""
import os
import signal

from torch.utils.data import get_worker_info

from ssl_engine.data.datasources.synthetic import SyntheticImageSource
from ssl_engine.data.registry import register_datasource


@register_datasource("worker_killing_synthetic")
class WorkerKillingSyntheticSource(SyntheticImageSource):
    samples_read = 0  # in this process

    def __getitem__(self, index: int):
        worker = get_worker_info()
        if worker is not None and worker.id == 0:
            WorkerKillingSyntheticSource.samples_read += 1
            if self.samples_read == int(os.environ["SSL_ENGINE_TEST_KILL_AT"]):
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)
