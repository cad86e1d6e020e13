"""MACHINE.REUSE_FREED_MEMORY: glibc's malloc keeps the memory a step frees for the next one."""
import subprocess
import sys
import textwrap

import pytest

from ssl_engine.utils.host_memory import glibc

# In a fresh process (the setting stays for the life of a process): the page faults of
# allocating, touching and freeing a 64 MB block five times, with malloc's defaults, then
# after reuse_freed_memory().  numpy's arrays are plain malloc blocks of the size asked for
# (torch's are aligned to 64 bytes, which lets a freed block of the same size serve the next
# request only once neighbouring blocks have merged: training steps reach that within a few
# steps, as docs/performance.md measures, a loop of one block may not).
MEASURE = textwrap.dedent("""
    import resource
    import numpy as np
    from ssl_engine.utils.host_memory import reuse_freed_memory

    def faults_of_five_steps():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            block = np.empty(16 * 2**20, dtype=np.float32)  # 64 MB: above any mmap threshold
            block.fill(1.0)
            del block
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    default = faults_of_five_steps()
    taken = reuse_freed_memory()
    faults_of_five_steps()  # the first step grows the heap once
    print(default, taken, faults_of_five_steps())
""")


@pytest.mark.skipif(glibc() is None, reason="the C library is not glibc")
def test_freed_memory_is_reused_without_page_faults():
    out = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True,
                         check=True).stdout.split()
    default, taken, reused = int(out[0]), out[1] == "True", int(out[2])
    assert default >= 5  # every step faulted fresh pages in (fewer where they are huge pages)
    assert taken
    assert reused * 20 <= default  # the same block, served from the heap: no new page
