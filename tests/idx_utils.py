"""IDX files (MNIST's and Fashion-MNIST's format) written by tests, gzipped or not."""
import gzip

import numpy as np


def write_idx(path, array) -> None:
    """``array`` as an IDX file of unsigned bytes at ``path``, gzipped when it ends in .gz."""
    array = np.asarray(array)
    header = (0x0800 + array.ndim).to_bytes(4, "big") + b"".join(
        n.to_bytes(4, "big") for n in array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())
