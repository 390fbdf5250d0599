// An independent float64 reference of the Llama-family decoder for the model tests: straight loops
// over one whole sequence (no paging, no chunking, no BLAS, none of the production code's kernels),
// written from Hugging Face's modeling_llama / modeling_qwen2 / modeling_qwen3. Weights are read
// through the checkpoint reader (tested on its own) and widened to double here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "common/half.h"
#include "model/checkpoint.h"
#include "rope_reference.h"

namespace flashserve::model::testing {

struct RefLayer {
  std::vector<double> in_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, post_norm, wg, wu, wd;
};

struct RefModel {
  ModelConfig c;
  std::vector<double> embed, norm, head;
  std::vector<RefLayer> layers;
};

inline std::vector<double> ref_read(const Checkpoint& ck, const std::string& name) {
  const TensorInfo t = ck.tensor(name);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  const auto* p = static_cast<const uint8_t*>(t.data);
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      out[i] = f;
    } else {
      uint16_t bits;
      std::memcpy(&bits, p + 2 * i, 2);
      out[i] = t.dtype == DType::kBFloat16 ? to_float(bf16_t{bits}) : to_float(fp16_t{bits});
    }
  }
  return out;
}

inline RefModel ref_load(const std::string& dir) {
  const Checkpoint ck = Checkpoint::open(dir);
  RefModel m;
  m.c = ck.config();
  m.embed = ref_read(ck, "model.embed_tokens.weight");
  m.norm = ref_read(ck, "model.norm.weight");
  m.head = m.c.tie_word_embeddings ? m.embed : ref_read(ck, "lm_head.weight");
  for (int64_t l = 0; l < m.c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    RefLayer L;
    L.in_norm = ref_read(ck, p + "input_layernorm.weight");
    L.wq = ref_read(ck, p + "self_attn.q_proj.weight");
    L.wk = ref_read(ck, p + "self_attn.k_proj.weight");
    L.wv = ref_read(ck, p + "self_attn.v_proj.weight");
    if (m.c.attention_bias) {
      L.bq = ref_read(ck, p + "self_attn.q_proj.bias");
      L.bk = ref_read(ck, p + "self_attn.k_proj.bias");
      L.bv = ref_read(ck, p + "self_attn.v_proj.bias");
    }
    if (m.c.qk_norm) {
      L.q_norm = ref_read(ck, p + "self_attn.q_norm.weight");
      L.k_norm = ref_read(ck, p + "self_attn.k_norm.weight");
    }
    L.wo = ref_read(ck, p + "self_attn.o_proj.weight");
    L.post_norm = ref_read(ck, p + "post_attention_layernorm.weight");
    L.wg = ref_read(ck, p + "mlp.gate_proj.weight");
    L.wu = ref_read(ck, p + "mlp.up_proj.weight");
    L.wd = ref_read(ck, p + "mlp.down_proj.weight");
    m.layers.push_back(std::move(L));
  }
  return m;
}

// y[o] = sum_i W[o, i] x[i] (+ b[o])
inline std::vector<double> ref_matvec(const std::vector<double>& w, const std::vector<double>& x,
                                      int64_t out, const std::vector<double>* b = nullptr) {
  const int64_t in = static_cast<int64_t>(x.size());
  std::vector<double> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double s = b && !b->empty() ? (*b)[o] : 0.0;
    for (int64_t i = 0; i < in; ++i) s += w[o * in + i] * x[i];
    y[o] = s;
  }
  return y;
}

inline std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w,
                                       double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// Rotate-half RoPE of every head of `v` (heads * d) at position `pos`, cos and sin times `scale`.
inline void ref_rope(std::vector<double>& v, int64_t heads, int64_t d, int64_t pos,
                     const std::vector<double>& inv_freq, double scale) {
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> x(v.begin() + h * d, v.begin() + (h + 1) * d), y(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) {
      const double rot = i < d / 2 ? -x[i + d / 2] : x[i - d / 2];  // rotate_half
      const double a = static_cast<double>(pos) * inv_freq[i % (d / 2)];
      y[i] = x[i] * std::cos(a) * scale + rot * std::sin(a) * scale;
    }
    std::copy(y.begin(), y.end(), v.begin() + h * d);
  }
}

struct RefTrace {
  std::vector<std::vector<double>> logits;  // [position][vocab]
  std::vector<double> layer_rms;  // RMS of the residual stream after each layer (all tokens)
  double max_abs_activation = 0;  // over every intermediate value
};

// What the KV cache does to a head's d values of K (is_v false) or V as it stores them, in place
// (an fp8 or bf16 cache rounds them); none: the cache keeps them exactly.
using RefKvStore =
    std::function<void(int64_t layer, int64_t kv_head, bool is_v, double* x, int64_t d)>;

// The whole sequence `tokens` from position 0: logits at every position.
inline RefTrace ref_forward(const RefModel& m, const std::vector<int32_t>& tokens,
                            const RefKvStore& store = nullptr) {
  const ModelConfig& c = m.c;
  const int64_t n = static_cast<int64_t>(tokens.size()), H = c.hidden_size, d = c.head_dim;
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads, F = c.intermediate_size;
  const std::vector<double> inv_freq = ref_inv_freq(c);
  const double rope_scale = ref_attention_scaling(c);
  // Qwen3's q_norm/k_norm: each head of `v` through RMSNorm with the [d] weight.
  auto norm_heads = [&](std::vector<double>& v, const std::vector<double>& w) {
    for (size_t h = 0; h * d < v.size(); ++h) {
      const std::vector<double> head(v.begin() + h * d, v.begin() + (h + 1) * d);
      const std::vector<double> y = ref_rmsnorm(head, w, c.rms_norm_eps);
      std::copy(y.begin(), y.end(), v.begin() + h * d);
    }
  };
  RefTrace tr;
  auto track = [&](const std::vector<double>& v) {
    for (double x : v) tr.max_abs_activation = std::max(tr.max_abs_activation, std::fabs(x));
  };
  std::vector<std::vector<double>> x(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t)
    x[t].assign(m.embed.begin() + tokens[t] * H, m.embed.begin() + (tokens[t] + 1) * H);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const RefLayer& L = m.layers[l];
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      const auto h = ref_rmsnorm(x[t], L.in_norm, c.rms_norm_eps);
      q[t] = ref_matvec(L.wq, h, hq * d, &L.bq);
      k[t] = ref_matvec(L.wk, h, hkv * d, &L.bk);
      v[t] = ref_matvec(L.wv, h, hkv * d, &L.bv);
      if (c.qk_norm) {
        norm_heads(q[t], L.q_norm);
        norm_heads(k[t], L.k_norm);
      }
      ref_rope(q[t], hq, d, t, inv_freq, rope_scale);
      ref_rope(k[t], hkv, d, t, inv_freq, rope_scale);
      track(q[t]);
      track(k[t]);
      track(v[t]);
      if (store)
        for (int64_t h = 0; h < hkv; ++h) {
          store(l, h, false, k[t].data() + h * d, d);
          store(l, h, true, v[t].data() + h * d, d);
        }
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> attn(static_cast<size_t>(hq * d), 0.0);
      const int64_t first =
          c.sliding_window > 0 ? std::max<int64_t>(0, t - c.sliding_window + 1) : 0;
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t g = h / (hq / hkv);
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t j = first; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[t][h * d + i] * k[j][g * d + i];
          s.push_back(dot / std::sqrt(static_cast<double>(d)));
          mx = std::max(mx, s.back());
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = first; j <= t; ++j)
          for (int64_t i = 0; i < d; ++i) attn[h * d + i] += s[j - first] / z * v[j][g * d + i];
      }
      const auto o = ref_matvec(L.wo, attn, H);
      for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];
      const auto h2 = ref_rmsnorm(x[t], L.post_norm, c.rms_norm_eps);
      const auto g = ref_matvec(L.wg, h2, F), u = ref_matvec(L.wu, h2, F);
      std::vector<double> a(static_cast<size_t>(F));
      for (int64_t i = 0; i < F; ++i) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      track(a);
      const auto dn = ref_matvec(L.wd, a, H);
      for (int64_t i = 0; i < H; ++i) x[t][i] += dn[i];
      track(x[t]);
    }
    double ss = 0;
    for (const auto& row : x)
      for (double e : row) ss += e * e;
    tr.layer_rms.push_back(std::sqrt(ss / static_cast<double>(n * H)));
  }
  for (int64_t t = 0; t < n; ++t)
    tr.logits.push_back(
        ref_matvec(m.head, ref_rmsnorm(x[t], m.norm, c.rms_norm_eps), c.vocab_size));
  return tr;
}

}  // namespace flashserve::model::testing
