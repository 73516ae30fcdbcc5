"""Test set-up: Triton's interpreter on machines without a GPU, and the markers.

``TRITON_INTERPRET`` is read when a kernel is *decorated*, so it must be set before any
``paged_edu.kernels`` import -- here, before pytest imports the test modules.
"""

import os
import shutil

import pytest


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
