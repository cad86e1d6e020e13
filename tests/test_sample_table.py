"""A folder's listing shared by forked data-loading workers: reading samples from the
SampleTable copies none of its pages, where a Python list of (path, label) tuples is copied page
by page as it is read (each read writes a reference count). Measured in a forked process as the
growth of its private dirty memory (/proc/self/smaps_rollup) over 20,000 random reads."""
import multiprocessing
import os
import random

import numpy as np
import pytest

from ssl_engine.data.datasources.sample_table import SampleTable

NUM_SAMPLES = 100_000
READS = 20_000


def fake_listing(count):
    return [(f"/data/imagenet/train/n{index % 1000:08d}/n{index % 1000:08d}_{index}.JPEG",
             index % 1000) for index in range(count)]


def private_dirty_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))


def _read_in_child(samples, queue):
    order = random.Random(0).sample(range(len(samples)), READS)
    before = private_dirty_kb()
    total = 0
    for index in order:
        path, label = samples[index]
        total += len(path) + label
    queue.put((private_dirty_kb() - before, total))


def growth_in_forked_reader(samples):
    """(KiB of private memory a forked process gains reading READS random samples, a checksum
    of what it read)."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(samples, queue))
    child.start()
    result = queue.get(timeout=120)
    child.join(timeout=60)
    return result


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux /proc only")
def test_forked_readers_share_the_table_and_copy_the_list():
    listing = fake_listing(NUM_SAMPLES)
    table = SampleTable(listing)
    assert len(table) == NUM_SAMPLES and table[12345] == listing[12345]
    assert table[-1] == listing[-1] and list(table)[:3] == listing[:3]
    table_growth, table_sum = growth_in_forked_reader(table)
    list_growth, list_sum = growth_in_forked_reader(listing)
    assert table_sum == list_sum  # the same samples were read
    # the list: most of its pages (tuples and strings, ~15 MB) are copied on their first read
    assert list_growth > 8_000, list_growth
    assert table_growth < 1_000, table_growth
    assert table.nbytes < 0.5 * sum(len(path) + 100 for path, _ in listing)


def test_a_worker_started_by_a_forkserver_gets_the_table_as_a_handle():
    """The engine's ranks start their workers with a forkserver: the dataset is pickled to each
    (multiprocessing's ForkingPickler, with torch's reductions). The table travels as handles to
    its shared memory; the list is copied whole. Unpickled, the table reads the same."""
    from multiprocessing.reduction import ForkingPickler

    listing = fake_listing(20_000)
    table = SampleTable(listing)
    table_bytes, list_bytes = ForkingPickler.dumps(table), ForkingPickler.dumps(listing)
    assert len(table_bytes) < 5_000 < 1_000_000 < len(list_bytes)
    assert ForkingPickler.loads(table_bytes)[19_999] == listing[19_999]


def test_the_table_keeps_any_path_and_refuses_an_index_out_of_range():
    odd = [("/data/ä b/\udcff.png", 3), ("", 0), ("/x.jpg", 2**40)]
    table = SampleTable(odd)
    assert list(table) == odd and table.labels.tolist() == [3, 0, 2**40]
    assert table == SampleTable(odd) and table != SampleTable(odd[:2])
    with pytest.raises(IndexError, match="sample 3 of 3"):
        table[3]
    assert len(SampleTable([])) == 0 and np.array_equal(SampleTable([]).offsets, [0])
