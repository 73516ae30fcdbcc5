"""The card a run is on and the spec that prices its roofline (paged_edu.labs.card, issue 45): a card of
the GPU table by its exact CUDA name, an unknown card by its measured ceilings, a CPU run by the H200's
row -- each labelled; a roofline asked for on another card says so."""

from __future__ import annotations

import pytest
import torch

from paged_edu.core.hardware import GPUS, gpu_of_device, measured_gpu
from paged_edu.labs import card as card_mod
from paged_edu.labs.card import RooflineCard, roofline_card, this_card
from paged_edu.labs.timed_run import roofline_model
from paged_edu.models.config import smollm2_config


def test_a_device_name_finds_its_row_only_when_it_is_that_card():
    assert gpu_of_device("NVIDIA H100 80GB HBM3") is GPUS["h100"]
    assert gpu_of_device("NVIDIA H200") is GPUS["h200"]
    # Another card with a similar name (2.0 TB/s, not the SXM's 3.35): not priced as the SXM
    assert gpu_of_device("NVIDIA H100 PCIe") is None and gpu_of_device("") is None


def test_a_measured_row_takes_its_ceilings_from_the_measurement_and_says_so():
    g = measured_gpu("NVIDIA L4", 23_034 * 2**20, 0.25e12, 110e12)
    assert (g.key, g.name, g.hbm_bandwidth, g.datasheet_bandwidth, g.peak_flops) == (
        "measured",
        "NVIDIA L4",
        0.25e12,
        0.25e12,
        110e12,
    )
    assert "measured on this card" in g.source and "NVIDIA L4" in g.label


def test_a_cpu_run_is_priced_on_the_h200_and_labelled_assumed():
    card = this_card("cpu")
    assert (card.device_name, card.gpu, card.spec) == ("cpu", GPUS["h200"], "assumed")
    assert "assumed" in card.label and "no GPU" in card.label
    rec = card.record()
    assert rec["roofline_gpu"] == GPUS["h200"].name and rec["roofline_spec"] == "assumed"
    assert rec["roofline_bandwidth"] == GPUS["h200"].hbm_bandwidth and rec["device_name"] == "cpu"
    # the labs' default roofline is the run's card: on a CPU, the H200's row
    spec = smollm2_config().geometry("bf16")
    assert roofline_model(spec, device="cpu").gpu == GPUS["h200"]


def test_asking_for_another_card_prices_on_it_and_labels_it_as_another_card():
    other = roofline_card("h100", "cpu")
    assert other.gpu is GPUS["h100"] and other.spec == "other card"
    assert "another card" in other.label
    own = roofline_card("h200", "cpu")  # the CPU run's own row asked for by key: no label change
    assert own.spec == "assumed"
    assert own.names(GPUS["h200"]) == GPUS["h200"].label
    assert "not this run's card" in own.names(GPUS["a100-80gb"])


def test_a_gpu_run_takes_its_tables_row_or_measures_an_unknown_card(monkeypatch):
    """The CUDA branch with the device faked: a known name gives its row, an unknown one the measurement."""
    card_mod._cuda_card.cache_clear()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100 80GB HBM3")
    known = this_card("cuda:0")
    assert (known.gpu, known.spec, known.label) == (GPUS["h100"], "table", GPUS["h100"].label)
    card_mod._cuda_card.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA RTX 9000")
    measured = []
    monkeypatch.setattr(
        card_mod, "_measure", lambda index, name: measured.append(name) or measured_gpu(name, 2**34, 1e12, 1e14)
    )
    unknown = this_card("cuda:0")
    assert unknown.spec == "measured" and unknown.gpu.hbm_bandwidth == 1e12 and "measured" in unknown.label
    assert this_card("cuda:0") is unknown and measured == ["NVIDIA RTX 9000"]  # measured once per process
    card_mod._cuda_card.cache_clear()


@pytest.mark.parametrize("spec", ["table", "measured", "assumed", "other card"])
def test_every_label_names_the_card(spec):
    card = RooflineCard("NVIDIA X", GPUS["h100"], spec)
    assert ("NVIDIA X" in card.label) or (GPUS["h100"].label in card.label)
