// The FP8 accuracy study (issue 23, docs/fp8.md): RMSE of attention's output against float64 on
// FlashAttention-3's test distribution, N(0, 1) entries of which 0.1% are replaced by outliers
// N(0, 10^2), for
//   bf16, fp16      q, k, v rounded to bf16 (fp16); a naive kernel in that type (S and softmax in
//                   float32, P and out rounded to it: Emulate::kLowPrecision). FA3's paper
//                   compares with fp16.
//   fp8 tensor      q, k, v in e4m3 with one scale per tensor (amax / 448), FA3's fp8 kernel
//                   emulated (Emulate::kFp8Kernel: P scaled by 2^8 and rounded to e4m3, bf16 out)
//   fp8 block       one scale per (head, block of 128 rows) of q, k and v (FA3's block
//   quantization) fp8 tensor+rot  per-tensor scales after the random Hadamard rotation of q and k
//                   (attention/hadamard.h: incoherent processing)
//   fp8 block+rot   both: FA3's recipe
// for head dims 64/128/256 and several lengths (batch 1, 2 heads, not causal). The reference is
// float64 attention over the float32 inputs before any rounding. Block-scaled inputs are handed to
// the emulation dequantised (code x scale in float32, exact to 2^-24): the same values an fp8
// kernel that applied each block's descale to its products would see.
//
//   bench_fp8_accuracy [--seed S] [--lengths 512,1024,2048] [--dims 64,128,256]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention/hadamard.h"
#include "attention/reference/naive.h"
#include "common/float8.h"
#include "common/half.h"
#include "flashserve/attention.h"

namespace {

using flashserve::AttentionParams;
using flashserve::DType;
using flashserve::make_view;
namespace ref = flashserve::attention::reference;

constexpr int64_t kHeads = 2;
constexpr int64_t kBlockRows = 128;  // FA3's block quantization: one scale per block of rows

// [L, heads, d] float32, N(0, 1) with 0.1% of the entries N(0, 10^2).
std::vector<float> outlier_normal(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f), outlier(0.0f, 10.0f);
  std::bernoulli_distribution is_outlier(0.001);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = is_outlier(rng) ? outlier(rng) : normal(rng);
  return x;
}

// x quantised to e4m3 and dequantised, one scale (amax / 448) per group of elements: per tensor
// (rows_per_block = 0) or per (head, block of rows).
std::vector<float> fp8_roundtrip(const std::vector<float>& x, int64_t L, int64_t d,
                                 int64_t rows_per_block) {
  std::vector<float> y(x.size());
  const int64_t block = rows_per_block > 0 ? rows_per_block : L;
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t r0 = 0; r0 < L; r0 += block) {
      const int64_t r1 = std::min(L, r0 + block);
      auto at = [&](int64_t r, int64_t i) { return (r * kHeads + h) * d + i; };
      float amax = 0.0f;
      if (rows_per_block > 0) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::abs(x[at(r, i)]));
      } else {
        for (float v : x) amax = std::max(amax, std::abs(v));
      }
      const float scale = amax > 0 ? amax / flashserve::kE4m3Max : 1.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t i = 0; i < d; ++i)
          y[at(r, i)] = flashserve::round_to_e4m3(x[at(r, i)] / scale) * scale;
    }
  return y;
}

std::vector<uint16_t> to_16bit(const std::vector<float>& x, DType dt) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = dt == DType::kBFloat16 ? flashserve::to_bf16(x[i]).bits : flashserve::to_fp16(x[i]).bits;
  return y;
}

ref::NaiveOutput attention(void* q, void* k, void* v, DType dt, int64_t L, int64_t d,
                           ref::Emulate mode) {
  std::vector<uint16_t> out_storage(static_cast<size_t>(L * kHeads * d) * 2);  // never written
  AttentionParams p;
  p.q = make_view(q, dt, {1, L, kHeads, d});
  p.k = make_view(k, dt, {1, L, kHeads, d});
  p.v = make_view(v, dt, {1, L, kHeads, d});
  p.out = make_view(out_storage.data(), dt, {1, L, kHeads, d});
  return ref::naive_forward(p, mode);
}

double rmse(const ref::NaiveOutput& got, const ref::NaiveOutput& exact) {
  double s = 0;
  for (size_t i = 0; i < exact.out.size(); ++i) s += std::pow(got.out[i] - exact.out[i], 2);
  return std::sqrt(s / static_cast<double>(exact.out.size()));
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoll(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 23;
  std::vector<int64_t> lengths = {512, 1024, 2048}, dims = {64, 128, 256};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seed"))
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--lengths"))
      lengths = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dims"))
      dims = parse_list(argv[i + 1]);
    else
      return std::fprintf(stderr, "unknown option %s\n", argv[i]), 2;
  }
  std::printf(
      "FP8 accuracy: RMSE of the output against float64; N(0,1) with 0.1%% N(0,10^2) "
      "outliers; batch 1, %lld heads, not causal; seed %llu\n\n",
      static_cast<long long>(kHeads), static_cast<unsigned long long>(seed));
  std::printf(
      "| d | L | bf16 | fp16 | fp8 tensor | fp8 block | fp8 tensor+rot | fp8 block+rot | "
      "block+rot / bf16 | block+rot / fp16 | tensor / block+rot |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t d : dims)
    for (int64_t L : lengths) {
      std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(d * 100000 + L));
      const int64_t n = L * kHeads * d;
      std::vector<float> q = outlier_normal(n, rng), k = outlier_normal(n, rng),
                         v = outlier_normal(n, rng);
      const ref::NaiveOutput exact =
          attention(q.data(), k.data(), v.data(), DType::kFloat32, L, d, ref::Emulate::kExact);

      auto half = [&](DType dt) {
        std::vector<uint16_t> qh = to_16bit(q, dt), kh = to_16bit(k, dt), vh = to_16bit(v, dt);
        return rmse(
            attention(qh.data(), kh.data(), vh.data(), dt, L, d, ref::Emulate::kLowPrecision),
            exact);
      };
      const double e_bf16 = half(DType::kBFloat16), e_fp16 = half(DType::kFloat16);

      // q and k rotated by one random Hadamard matrix (q.k unchanged); v as it is.
      const flashserve::attention::RandomHadamard rot(d, seed + static_cast<uint64_t>(d));
      std::vector<float> qr = q, kr = k;
      rot.rotate_rows(qr.data(), L * kHeads);
      rot.rotate_rows(kr.data(), L * kHeads);

      auto fp8 = [&](const std::vector<float>& qq, const std::vector<float>& kk, int64_t block) {
        std::vector<float> q8 = fp8_roundtrip(qq, L, d, block), k8 = fp8_roundtrip(kk, L, d, block),
                           v8 = fp8_roundtrip(v, L, d, block);
        return rmse(attention(q8.data(), k8.data(), v8.data(), DType::kFloat32, L, d,
                              ref::Emulate::kFp8Kernel),
                    exact);
      };
      const double e_tensor = fp8(q, k, 0), e_block = fp8(q, k, kBlockRows);
      const double e_tensor_rot = fp8(qr, kr, 0), e_block_rot = fp8(qr, kr, kBlockRows);
      std::printf(
          "| %lld | %lld | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %.1f | %.1f | %.2f |\n",
          static_cast<long long>(d), static_cast<long long>(L), e_bf16, e_fp16, e_tensor, e_block,
          e_tensor_rot, e_block_rot, e_block_rot / e_bf16, e_block_rot / e_fp16,
          e_tensor / e_block_rot);
      std::fflush(stdout);
    }
  return 0;
}
