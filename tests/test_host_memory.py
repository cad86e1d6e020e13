"""MACHINE.REUSE_FREED_MEMORY: glibc's malloc keeps the memory a step frees for the next one."""
import subprocess
import sys
import textwrap

import pytest

from ssl_engine.utils.host_memory import glibc

# In a fresh process (the setting stays for the life of a process): the page faults of
# allocating, touching and freeing a 64 MB tensor five times, with malloc's defaults, then
# after reuse_freed_memory().
MEASURE = textwrap.dedent("""
    import resource, torch
    from ssl_engine.utils.host_memory import reuse_freed_memory

    def faults_of_five_steps():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            block = torch.empty(16 * 2**20)  # 64 MB: above glibc's largest mmap threshold
            block.fill_(1.0)
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
    pages = 64 * 2**20 // 4096
    assert default >= 5 * pages * 0.9  # each step faulted its 16384 pages in again
    assert taken
    assert reused < pages / 10  # the same block, served from the heap with no new page
