"""Test set-up: one CPU thread, Triton's interpreter on machines without a GPU, the markers, and the
hang guard.

``OMP_NUM_THREADS=1`` (unless set): the suite's CPU work is small ops (a tiny model, a few tokens a
step), where torch's OpenMP threads only spin-wait for each other -- and on a 2-core machine doing
other work that spinning made the same tests 5-20x slower (lesson 6's pressure run: 36 s with two
threads, 1.9 s with one). The kernels that nbval, papermill and JupyterLab start inherit it; results
are the same (both sides of every engine-vs-transformers comparison run with it).

``TRITON_INTERPRET`` is read when a kernel is *decorated*, so it must be set before any
``paged_edu.kernels`` import -- here, before pytest imports the test modules.

nbval's own waits come from ``hang_guard.HANG_GUARD_S`` (see there): a cell's run and a kernel's
start (unless given on the command line), and the wait for each output message after a cell's reply
(nbval's fixed 5 s, after which it stops the kernel and every later cell of the lesson fails).
"""

import os
import shutil

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported (it reads it once)

import pytest  # noqa: E402
from hang_guard import HANG_GUARD_S  # noqa: E402


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    per_test = float(config.getini("timeout") or 0) if config.pluginmanager.hasplugin("timeout") else 0
    if per_test and per_test < 2 * HANG_GUARD_S:
        raise pytest.UsageError(
            f"pytest-timeout's timeout = {per_test:g} s must be at least twice "
            f"HANG_GUARD_S = {HANG_GUARD_S} s (tests/hang_guard.py says why)"
        )
    for option, flag in (
        ("nbval_cell_timeout", "--nbval-cell-timeout"),
        ("nbval_kernel_startup_timeout", "--nbval-kernel-startup-timeout"),
    ):
        if hasattr(config.option, option) and not any(a.startswith(flag) for a in config.invocation_params.args):
            setattr(config.option, option, HANG_GUARD_S)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if type(item).__name__ == "IPyNbCell":  # nbval's cell item: its output wait is an attribute
            item.output_timeout = HANG_GUARD_S
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def hf_greedy_case():
    """A small random transformers Llama (2 layers, 4 / 2 heads of 16), seven prompts of 2-29 tokens
    and transformers' own greedy 9 tokens for each: ``(hf, prompts, want)``, the oracle the graph
    paths of the runner are checked against."""
    import random

    import torch

    from dataclasses import replace

    from model_helpers import TINY_LLAMA

    from paged_edu.models.loaders import random_hf_llama

    cfg = replace(TINY_LLAMA, vocab_size=300, max_position_embeddings=256, tie_word_embeddings=False)
    hf = random_hf_llama(cfg, seed=3, initializer_range=0.25)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(2, 30))] for _ in range(7)]
    want = []
    with torch.no_grad():
        for p in prompts:
            out = hf.generate(torch.tensor([p]), max_new_tokens=9, do_sample=False, eos_token_id=None, pad_token_id=0)
            want.append(out[0, len(p) :].tolist())
    return hf, prompts, want
