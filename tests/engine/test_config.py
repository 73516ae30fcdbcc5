"""The engine's one configuration: ``Engine(model, config=None, *, allocator=None, **settings)``.

Settings by name keep working as the lessons write them, route to ``EngineConfig`` or its nested
``KernelConfig``, and reach the model runner as one object; an unknown name, a bad value or a
positional setting is refused, naming the field; ``engine.config`` is the config in force. Also
held here: the step's phases live in one module (``engine/step.py``), and async scheduling reaches
into no private member of the engine.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest

from paged_edu.core.validation import FieldTypeError, FieldValueError
from paged_edu.engine import Engine, EngineConfig, KernelConfig
from paged_edu.engine.config import make_config, setting_names
from paged_edu.labs.engine_lab import tiny_model
from paged_edu.models.llama import Kernels

ENGINE_DIR = Path(__file__).resolve().parents[2] / "paged_edu" / "engine"


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1, vocab_size=300)


def test_the_signature_is_model_config_allocator_and_settings():
    params = inspect.signature(Engine.__init__).parameters
    assert list(params) == ["self", "model", "config", "allocator", "overrides"]
    kinds = [p.kind for p in params.values()]
    P = inspect.Parameter
    assert kinds == [
        P.POSITIONAL_OR_KEYWORD,
        P.POSITIONAL_OR_KEYWORD,
        P.POSITIONAL_OR_KEYWORD,
        P.KEYWORD_ONLY,
        P.VAR_KEYWORD,
    ]
    assert params["config"].default is None and params["allocator"].default is None


def test_settings_by_name_route_to_the_engine_and_kernel_records(model):
    engine = Engine(
        model, num_blocks=16, block_size=4, max_num_seqs=3, attn_impl="loop", fused_impl="torch", gemm_impl="torch"
    )
    c = engine.config
    assert isinstance(c, EngineConfig) and isinstance(c.kernels, KernelConfig)
    assert (c.num_blocks, c.block_size, c.max_num_seqs) == (16, 4, 3)
    assert (c.kernels.attn_impl, c.kernels.fused_impl, c.kernels.gemm_impl) == ("loop", "torch", "torch")
    assert engine.scheduler.max_num_seqs == 3 and engine.allocator.block_size == 4
    # one object down to the model: the runner's Kernels are the KernelConfig's, named by op
    assert engine.runner.kernels == Kernels(decode="loop", prefill="torch", fused="torch", gemm="torch").resolve(
        model.device
    )


def test_settings_override_a_given_config_which_stays_as_it_was(model):
    given = EngineConfig(num_blocks=16, block_size=8, kernels=KernelConfig(attn_impl="loop"))
    engine = Engine(model, given, block_size=4, prefill_impl="torch")
    assert engine.config.block_size == 4 and engine.config.num_blocks == 16
    assert engine.config.kernels.attn_impl == "loop" and engine.config.kernels.prefill_impl == "torch"
    assert given.block_size == 8 and given.kernels.prefill_impl is None  # frozen: never changed
    assert given.replace(block_size=2, attn_impl="torch").kernels.attn_impl == "torch"


def test_engine_config_is_the_config_in_force(model):
    """Every ``None`` default decided for this model and device; rebuilding from it gives the same."""
    engine = Engine(model, num_blocks=16, block_size=4, preemption_mode="swap")
    c = engine.config
    assert c.num_cpu_blocks == 16  # swap: as many CPU blocks as GPU blocks
    assert c.max_model_len == engine.max_model_len == 64  # the pool: 16 blocks of 4
    assert (c.kernels.attn_impl, c.kernels.prefill_impl, c.kernels.cuda_graphs) == ("torch", "torch", False)  # a CPU
    assert Engine(model, c).config == c
    assert Engine(model, num_blocks=16, block_size=4).config.num_cpu_blocks == 0  # recompute: no swap space
    assert engine.model.config.vocab_size == 300  # the model's config is the model's


def test_the_records_are_frozen():
    config = EngineConfig(num_blocks=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_blocks = 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.kernels.pdl = False


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(num_block=8), "num_block"),  # a typo
        (dict(num_blocks=8, cuda_graph=False), "cuda_graph"),
        (dict(num_blocks=8, bogus=1), "bogus"),
    ],
)
def test_an_unknown_name_is_refused_naming_it(model, settings, field):
    with pytest.raises(TypeError, match=f"unknown engine setting '{field}'") as err:
        Engine(model, **settings)
    assert err.value.field == field
    with pytest.raises(TypeError, match=field):
        make_config(EngineConfig(num_blocks=8), settings)


def test_the_typo_gets_a_suggestion(model):
    with pytest.raises(TypeError, match="did you mean 'num_blocks'"):
        Engine(model, num_block=8)


def test_a_positional_setting_or_no_pool_is_refused(model):
    with pytest.raises(FieldTypeError, match="config must be an EngineConfig") as err:
        Engine(model, 64)  # the old positional num_blocks
    assert err.value.field == "config"
    with pytest.raises(TypeError, match="positional"):
        Engine(model, 64, 16, True, "swap")
    with pytest.raises(FieldTypeError, match="num_blocks") as err:
        Engine(model, block_size=16)
    assert err.value.field == "num_blocks"


@pytest.mark.parametrize(
    "make, field, err",
    [
        (lambda: EngineConfig(num_blocks=8.0), "num_blocks", FieldTypeError),
        (lambda: EngineConfig(num_blocks=True), "num_blocks", FieldTypeError),
        (lambda: EngineConfig(num_blocks=0), "num_blocks", FieldValueError),
        (lambda: EngineConfig(num_blocks=8, block_size=16.0), "block_size", FieldTypeError),
        (lambda: EngineConfig(num_blocks=8, max_num_seqs=False), "max_num_seqs", FieldTypeError),
        (lambda: EngineConfig(num_blocks=8, max_num_batched_tokens=2.5), "max_num_batched_tokens", FieldTypeError),
        (lambda: EngineConfig(num_blocks=8, num_cpu_blocks=-1), "num_cpu_blocks", FieldValueError),
        (lambda: EngineConfig(num_blocks=8, preemption_mode="drop"), "preemption_mode", FieldValueError),
        (
            lambda: EngineConfig(num_blocks=8, preemption_mode="swap", num_cpu_blocks=0),
            "num_cpu_blocks",
            FieldValueError,
        ),
        (lambda: EngineConfig(num_blocks=8, seed=-1), "seed", FieldValueError),
        (lambda: EngineConfig(num_blocks=8, async_scheduling="yes"), "async_scheduling", FieldTypeError),
        (lambda: EngineConfig(num_blocks=8, kernels="fast"), "kernels", FieldTypeError),
        (lambda: KernelConfig(attn_impl="flash"), "attn_impl", FieldValueError),
        (lambda: KernelConfig(prefill_impl="loop"), "prefill_impl", FieldValueError),
        (lambda: KernelConfig(gemm_impl="cublas"), "gemm_impl", FieldValueError),
        (lambda: KernelConfig(cuda_graphs=1), "cuda_graphs", FieldTypeError),
    ],
)
def test_each_value_is_checked_when_the_record_is_made(make, field, err):
    with pytest.raises(err, match=field) as caught:
        make()
    assert caught.value.field == field


def test_every_setting_name_is_a_field_and_each_is_documented_once():
    assert set(setting_names()) == {f.name for f in dataclasses.fields(EngineConfig)} | {
        f.name for f in dataclasses.fields(KernelConfig)
    }
    for record in (EngineConfig, KernelConfig):
        for f in dataclasses.fields(record):
            assert f"``{f.name}``" in record.__doc__, (record.__name__, f.name)
    assert "attn_impl" not in Engine.__doc__ and "fuse_decode_store" not in Engine.__doc__  # not a second time


# ----------------------------------------------------------------------------------------------
# One step: the phases in one module, async scheduling without the engine's private members
# ----------------------------------------------------------------------------------------------


def test_overlap_uses_no_private_member_of_the_engine():
    """``overlap.py`` reads no ``x._name`` but its own (``self._...``, ``AsyncScheduling._...``) and
    never names an engine at all: it gets the step's phases."""
    tree = ast.parse((ENGINE_DIR / "overlap.py").read_text())
    private = [
        (node.lineno, ast.unparse(node))
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "AsyncScheduling"))
    ]
    assert private == []
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not names & {"e", "engine", "Engine"}


def test_the_phases_are_named_in_one_module():
    """``.phase(...)`` -- the one construct that names, times and attributes a phase -- appears only in
    ``engine/step.py``; the engine and async scheduling call the phases, they do not spell them."""
    where = {}
    for path in ENGINE_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "phase":
                where.setdefault(path.name, []).append(node.args[0].value)
    assert set(where) == {"step.py"}
    assert set(where["step.py"]) == {"schedule", "block copies", "prepare", "forward", "sample", "update"}


@pytest.mark.parametrize("bad", [8.0, True, np.float64(8.0)])
@pytest.mark.parametrize(
    "field",
    ["num_blocks", "block_size", "num_cpu_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "seed"],
)
def test_integer_settings_refuse_floats_and_bools_alike(model, field, bad):
    settings = {"num_blocks": 8, field: bad}
    with pytest.raises(FieldTypeError) as err:
        EngineConfig(**settings)
    assert err.value.field == field
    with pytest.raises(FieldTypeError):
        Engine(model, **settings)
    value = getattr(EngineConfig(**{**settings, field: np.int64(8)}), field)
    assert value == 8 and type(value) is int  # an integer type is one, kept as a plain int
