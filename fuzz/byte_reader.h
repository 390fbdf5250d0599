// Turns a fuzzer's bytes into the values a harness needs. Reading past the end gives zeros, so
// every input, however short, is a complete (if small) case: the fuzzer mutates bytes, and each
// byte keeps its meaning as the input grows. (libFuzzer's FuzzedDataProvider does the same, but is
// clang-only; the replay build of the harnesses uses any compiler.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace flashserve::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  template <typename T>
  T raw() {
    T v{};
    const size_t k = n_ < sizeof(T) ? n_ : sizeof(T);
    std::memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  // A value in [lo, hi] from one byte when the range fits in one, else eight.
  int64_t in(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
    const uint64_t x = span != 0 && span <= 256 ? raw<uint8_t>() : raw<uint64_t>();
    return span == 0 ? static_cast<int64_t>(x)
                     : static_cast<int64_t>(static_cast<uint64_t>(lo) + x % span);
  }
  bool flag() { return raw<uint8_t>() & 1; }
  // One in `n` (n >= 1).
  bool one_in(int n) { return raw<uint8_t>() % n == 0; }
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p_), n_);
    p_ += n_;
    n_ = 0;
    return s;
  }
  size_t remaining() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace flashserve::fuzz
