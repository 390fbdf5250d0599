"""Shared fixtures: fresh random generators (the seed is printed, pytest shows it on failure) and
poisoned outputs (every output the library allocates starts as NaN, so unwritten elements show)."""

import secrets
import sys

import pytest

import flashserve._tensor as fs_tensor


@pytest.fixture
def seed():
    value = secrets.randbits(32)
    print(f"seed = {value}")
    return value


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Wraps the allocator so that float outputs are filled with NaN before the library runs."""
    allocate = fs_tensor.empty

    def poisoned(like, framework, device, shape, dtype=None):
        x = allocate(like, framework, device, shape, dtype)
        poison = {"uint8": None, "int32": -123456789}.get(dtype, float("nan"))
        if poison is not None:
            if framework == "torch":
                x.fill_(poison)
            elif framework in ("numpy", "cupy", "unknown"):
                x.fill(poison)
        return x

    monkeypatch.setattr(fs_tensor, "empty", poisoned)
    if "torch" in sys.modules:  # the PyTorch path allocates through its own hook
        import flashserve._torch as fs_torch

        def poisoned_torch(like, shape, dtype=None):
            x = torch_allocate(like, shape, dtype)
            if dtype is None or dtype.is_floating_point:
                x.fill_(float("nan"))
            elif dtype != fs_torch.torch.uint8:
                x.fill_(-123456789)
            return x

        def poisoned_torch_like(t):
            x = torch_allocate_like(t)
            x.fill_(float("nan"))
            return x

        torch_allocate = fs_torch.empty
        torch_allocate_like = fs_torch.empty_like
        monkeypatch.setattr(fs_torch, "empty", poisoned_torch)
        monkeypatch.setattr(fs_torch, "empty_like", poisoned_torch_like)
