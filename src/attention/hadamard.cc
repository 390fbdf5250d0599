#include "attention/hadamard.h"

#include <cmath>
#include <random>
#include <string>

#include "flashserve/error.h"

namespace flashserve::attention {
namespace {

void check_size(int64_t n) {
  if (n < 1 || (n & (n - 1)) != 0)
    throw Error(ErrorKind::kInvalidArgument, "n",
                std::to_string(n) + " is not a power of two (the Walsh-Hadamard transform's size)");
}

// Butterflies over strides 1, 2, 4, ...: after the pass of stride h, every block of 2h holds the
// transform of its two halves (a + b, a - b); the 1/sqrt(n) comes once at the end.
template <typename T>
void fwht_impl(T* x, int64_t n) {
  check_size(n);
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const T a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int64_t i = 0; i < n; ++i) x[i] *= norm;
}

}  // namespace

void fwht(float* x, int64_t n) {
  fwht_impl(x, n);
}
void fwht(double* x, int64_t n) {
  fwht_impl(x, n);
}

RandomHadamard::RandomHadamard(int64_t n, uint64_t seed) {
  check_size(n);
  std::mt19937_64 rng(seed);
  signs_.resize(static_cast<size_t>(n));
  for (float& s : signs_) s = (rng() >> 63) ? -1.0f : 1.0f;
}

void RandomHadamard::rotate(float* x) const {
  for (int64_t i = 0; i < size(); ++i) x[i] *= signs_[i];
  fwht(x, size());
}

void RandomHadamard::rotate(double* x) const {
  for (int64_t i = 0; i < size(); ++i) x[i] *= signs_[i];
  fwht(x, size());
}

void RandomHadamard::unrotate(float* x) const {
  fwht(x, size());
  for (int64_t i = 0; i < size(); ++i) x[i] *= signs_[i];
}

void RandomHadamard::rotate_rows(float* x, int64_t rows) const {
  for (int64_t r = 0; r < rows; ++r) rotate(x + r * size());
}

}  // namespace flashserve::attention
