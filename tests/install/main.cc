// A downstream program of the installed flashserve (tests/install/check.sh builds it with CMake's
// find_package and with pkg-config, outside this source tree): CPU attention forward on a small
// random GQA batch with a bottom-right causal mask, checked against a naive float64 loop.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flashserve/attention.h"
#include "flashserve/error.h"
#include "flashserve/tensor.h"
#include "flashserve/version.h"

namespace {

constexpr int64_t kBatch = 2, kSeqQ = 5, kSeqK = 9, kHeadsQ = 4, kHeadsKv = 2, kDim = 16;

// q [b, t, h, d], k/v [b, j, h_kv, d], contiguous: query t sits at position kSeqK - kSeqQ + t and
// sees keys j <= that position; head h reads KV head h / (kHeadsQ / kHeadsKv).
double naive(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
             int64_t b, int64_t t, int64_t h, int64_t d) {
  const int64_t hk = h / (kHeadsQ / kHeadsKv);
  const int64_t last = kSeqK - kSeqQ + t;
  const double scale = 1.0 / std::sqrt(double(kDim));
  std::vector<double> s(last + 1);
  double max = -INFINITY;
  for (int64_t j = 0; j <= last; ++j) {
    double dot = 0;
    for (int64_t e = 0; e < kDim; ++e)
      dot += double(q[((b * kSeqQ + t) * kHeadsQ + h) * kDim + e]) *
             k[((b * kSeqK + j) * kHeadsKv + hk) * kDim + e];
    s[j] = dot * scale;
    max = std::max(max, s[j]);
  }
  double sum = 0, acc = 0;
  for (int64_t j = 0; j <= last; ++j) {
    const double p = std::exp(s[j] - max);
    sum += p;
    acc += p * v[((b * kSeqK + j) * kHeadsKv + hk) * kDim + d];
  }
  return acc / sum;
}

}  // namespace

int main() {
  std::mt19937 rng(20);
  std::normal_distribution<float> normal;
  auto random = [&](int64_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = normal(rng);
    return x;
  };
  std::vector<float> q = random(kBatch * kSeqQ * kHeadsQ * kDim);
  std::vector<float> k = random(kBatch * kSeqK * kHeadsKv * kDim);
  std::vector<float> v = random(kBatch * kSeqK * kHeadsKv * kDim);
  std::vector<float> out(q.size(), NAN);  // every element must be written

  using flashserve::DType;
  flashserve::AttentionParams p;
  p.q = flashserve::make_view(q.data(), DType::kFloat32, {kBatch, kSeqQ, kHeadsQ, kDim});
  p.k = flashserve::make_view(k.data(), DType::kFloat32, {kBatch, kSeqK, kHeadsKv, kDim});
  p.v = flashserve::make_view(v.data(), DType::kFloat32, {kBatch, kSeqK, kHeadsKv, kDim});
  p.out = flashserve::make_view(out.data(), DType::kFloat32, {kBatch, kSeqQ, kHeadsQ, kDim});
  p.causal = true;
  try {
    flashserve::attention_forward(p);
  } catch (const flashserve::Error& e) {
    std::fprintf(stderr, "attention_forward failed: %s\n", e.what());
    return 1;
  }

  double max_err = 0;
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t t = 0; t < kSeqQ; ++t)
      for (int64_t h = 0; h < kHeadsQ; ++h)
        for (int64_t d = 0; d < kDim; ++d) {
          const double got = out[((b * kSeqQ + t) * kHeadsQ + h) * kDim + d];
          const double err = std::fabs(got - naive(q, k, v, b, t, h, d));
          if (!(err <= max_err)) max_err = std::isnan(err) ? INFINITY : err;
        }
  // float32 inputs, float32 accumulation over at most 9 keys: a few ulps of values of size ~1.
  const bool ok = max_err < 1e-5;
  std::printf("flashserve %s: attention_forward vs naive loop, max |error| %.3g: %s\n",
              FLASHSERVE_VERSION, max_err, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}
