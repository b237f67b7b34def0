"""Children that die by SIGKILL or hang, for each place the library starts a process: model
builders (``bench --model`` contract) and a ``torch.compile`` backend."""

from __future__ import annotations

import os
import signal
import time


def killed():
    """A builder whose process is killed outright (as the kernel's OOM killer does)."""
    os.kill(os.getpid(), signal.SIGKILL)


def hung():
    """A builder that never returns."""
    time.sleep(600)


def killed_backend(gm, example_inputs):
    """A backend whose compile kills its process."""
    os.kill(os.getpid(), signal.SIGKILL)
