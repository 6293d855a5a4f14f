"""parse_device: the one place a typed device name becomes a torch.device or a clear error."""

from __future__ import annotations

import pytest
import torch

from specformer.machine.devices import parse_device
from specformer.errors import UserError


def test_cpu_names_parse_to_the_cpu_device() -> None:
    assert parse_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name, fragment", [
    ("gpu", "is not a device name"),
    ("meta", "holds no data"),
    ("xla", "has no working xla backend"),  # parsed by torch.device, absent from a stock build (found by fuzzing)
    ("hpu", "has no working hpu backend"),
])
def test_bad_names_name_the_option_and_what_is_accepted(name: str, fragment: str) -> None:
    with pytest.raises(UserError) as info:
        parse_device(name, option="--serve-device")
    message = str(info.value)
    assert fragment in message and "--serve-device" in message and "cpu, cuda, cuda:N or mps" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_says_so_and_suggests_cpu() -> None:
    with pytest.raises(UserError, match="CUDA is not available on this machine; use --device cpu"):
        parse_device("cuda:0")


def test_a_cuda_index_past_the_devices_present_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parse_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(UserError, match="has 2 CUDA device"):
        parse_device("cuda:2")
