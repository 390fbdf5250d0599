"""Issue 9's reproduction: once the library has run a multi-tile CPU call, a child made by fork()
(multiprocessing's default start method on Linux, PyTorch DataLoader workers) must be able to run
the next call. Before the fix the child waited forever on the parent's worker threads; here a
child that does not finish within the timeout is killed and the test fails."""

import os
import signal
import time

import numpy as np
import pytest

from flashserve import flash_attn_func

TIMEOUT_S = 60


def wait_or_kill(pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_child_after_fork_runs_the_same_call(seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 256, 4, 64)).astype(np.float32) for _ in range(3))
    parent = flash_attn_func(q, k, v)  # multi-tile: the worker threads are started and used
    pid = os.fork()
    if pid == 0:  # the child: nothing of pytest's may run here
        code = 1
        try:
            child = flash_attn_func(q, k, v)
            code = 0 if np.array_equal(child, parent) else 2
        finally:
            os._exit(code)
    code = wait_or_kill(pid, TIMEOUT_S)
    assert code is not None, f"the child's call did not return within {TIMEOUT_S} s"
    assert code == 0, "the child's output differs from the parent's" if code == 2 else code
    # And the parent's pool still works.
    np.testing.assert_array_equal(flash_attn_func(q, k, v), parent)
