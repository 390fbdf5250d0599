"""Run by tests/install/check.sh from a folder outside the checkout, with the venv's python: the
pip-installed package must be the one imported, find its bundled library, carry the project's
version, and compute attention on NumPy arrays (the CPU path) like a naive loop does."""

import os
import sys

import numpy as np

import flashserve

expected_version, site_packages = sys.argv[1], os.path.realpath(sys.argv[2])
for name, path in (("package", flashserve.__file__), ("library", flashserve.library_path())):
    if not os.path.realpath(path).startswith(site_packages + os.sep):
        sys.exit(f"the {name} in use is {path}, not the installed one under {site_packages}")
if not flashserve.__version__ == flashserve.version() == expected_version:
    sys.exit(f"versions differ: package {flashserve.__version__}, library {flashserve.version()}, "
             f"CMakeLists.txt {expected_version}")

rng = np.random.default_rng(20)
batch, seq_q, seq_k, heads_q, heads_kv, dim = 2, 5, 9, 4, 2, 16
q = rng.standard_normal((batch, seq_q, heads_q, dim), dtype=np.float32)
k = rng.standard_normal((batch, seq_k, heads_kv, dim), dtype=np.float32)
v = rng.standard_normal((batch, seq_k, heads_kv, dim), dtype=np.float32)
out = flashserve.flash_attn_func(q, k, v, causal=True)

# Naive float64: head h reads KV head h // (heads_q // heads_kv); causal is bottom-right aligned
# (query t sees keys j <= seq_k - seq_q + t).
kk = np.repeat(k.astype(np.float64), heads_q // heads_kv, axis=2)
vv = np.repeat(v.astype(np.float64), heads_q // heads_kv, axis=2)
s = np.einsum("bthd,bjhd->bhtj", q.astype(np.float64), kk) / np.sqrt(dim)
s[:, :, np.arange(seq_q)[:, None] + seq_k - seq_q < np.arange(seq_k)[None, :]] = -np.inf
p = np.exp(s - s.max(axis=-1, keepdims=True))
ref = np.einsum("bhtj,bjhd->bthd", p / p.sum(axis=-1, keepdims=True), vv)
err = float(np.max(np.abs(out - ref)))
print(f"flashserve {flashserve.__version__} from {os.path.dirname(flashserve.__file__)}: "
      f"flash_attn_func vs naive, max |error| {err:.3g}")
if out.shape != q.shape or not err < 1e-5:
    sys.exit("flash_attn_func disagrees with the naive reference")
