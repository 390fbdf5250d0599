"""examples/train_gpt.py at a tiny size on the CPU: the model trained with flashserve's attention
(forward and backward) and with PyTorch's SDPA from the same seed must give the same loss curve to
float32 rounding, and the loss must fall. Skipped without PyTorch (2.4+: flashserve's autograd)."""

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "register_autograd"):
    pytest.skip(f"PyTorch {torch.__version__} lacks torch.library.register_autograd",
                allow_module_level=True)

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_gpt.py")


def load_example():
    spec = importlib.util.spec_from_file_location("train_gpt", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_training_curves_agree(capsys):
    example = load_example()
    curves = example.main(["--device", "cpu", "--steps", "30", "--layers", "2", "--d-model",
                           "32", "--heads", "4", "--kv-heads", "2", "--seq", "33", "--batch", "4",
                           "--vocab", "64", "--sequences", "8", "--lr", "1e-2"])
    fs, sdpa = curves["flashserve"], curves["sdpa"]
    assert len(fs) == len(sdpa) == 30
    # Attention differs from SDPA by float32 rounding (~1e-7); 30 Adam steps amplify it to ~1e-5
    # at most. A wrong gradient (one term dropped) leaves the curves apart by > 1e-2 within steps.
    for i, (a, b) in enumerate(zip(fs, sdpa)):
        assert abs(a - b) <= 1e-3 * abs(b), f"step {i}: flashserve {a} against sdpa {b}"
    # Memorising 8 random sequences (at first the tokens' frequencies): the loss falls.
    assert sum(fs[-5:]) / 5 < sum(fs[:5]) / 5 - 0.1
    assert "flashserve" in capsys.readouterr().out
