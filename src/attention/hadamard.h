// The random Hadamard rotation of FlashAttention-3's incoherent processing: R = H D / sqrt(n),
// H the n x n Walsh-Hadamard matrix (n a power of two), D a diagonal of random signs. R is
// orthogonal, so rotating every query and key row by the same R leaves each score q.k, hence the
// attention, unchanged, while it spreads an outlier coordinate over all n: a row's largest
// magnitude drops towards its norm / sqrt(n), and an e4m3 quantisation scaled to that largest
// magnitude then loses less of the row's other coordinates. The fast transform costs
// n log2(n) additions per row.
#pragma once

#include <cstdint>
#include <vector>

namespace flashserve::attention {

// x <- H x / sqrt(n) in place (orthogonal and its own inverse); n a power of two, else
// Error(kInvalidArgument).
void fwht(float* x, int64_t n);
void fwht(double* x, int64_t n);

class RandomHadamard {
 public:
  // n a power of two; the signs are drawn from `seed`.
  RandomHadamard(int64_t n, uint64_t seed);

  int64_t size() const { return static_cast<int64_t>(signs_.size()); }
  // x <- R x = H (D x) / sqrt(n).
  void rotate(float* x) const;
  void rotate(double* x) const;
  // x <- R^T x = D (H x) / sqrt(n): undoes rotate.
  void unrotate(float* x) const;
  // Every one of `rows` consecutive rows of n values (a [tokens, heads, n] tensor's head rows).
  void rotate_rows(float* x, int64_t rows) const;

 private:
  std::vector<float> signs_;  // +-1
};

}  // namespace flashserve::attention
