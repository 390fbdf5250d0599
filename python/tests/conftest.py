"""Shared fixtures: fresh random generators (the seed is printed, pytest shows it on failure) and
poisoned outputs (every output the library allocates starts as NaN, so unwritten elements show)."""

import secrets

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
        if dtype != "uint8":
            if framework == "torch":
                x.fill_(float("nan"))
            elif framework in ("numpy", "cupy", "unknown"):
                x.fill(float("nan"))
        return x

    monkeypatch.setattr(fs_tensor, "empty", poisoned)
