// One attention test case: a spec (shapes, layouts, mask, dtype, seed) and the host buffers it
// implies, filled with fresh normal random values. The CPU tests point AttentionParams at the host
// buffers; a GPU test copies every buffer to the device (buffers() lists them with their names and
// sizes) and asks params() for views of the device copies.
//
// Poisoning: out and lse start as NaN. Key/value slots that no sequence uses (the tail of a
// sequence's last page, the spare pages of the pool, block-table entries past a sequence's pages,
// which point at spare pages, keys past seqused_k) and the padding of strided views are NaN too, so
// a kernel that reads what the contract says it must not read turns the result into NaN.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention/reference/naive.h"
#include "common/half.h"
#include "flashserve/attention.h"

namespace flashserve::testing {

enum class QLayout { kDense, kVarlen };
// float8_e4m3fn inputs (attention.h): none, k and v (an fp8 KV cache beside q of `dtype`), or q, k
// and v (FA3's fp8 path; out bfloat16). Values are N(0, 1) / descale rounded to e4m3, so the
// dequantised inputs are N(0, 1) quantised.
enum class Fp8 { kNone, kKV, kQKV };
enum class KVLayout { kDense, kVarlen, kPaged };

struct CaseSpec {
  int64_t batch = 1;
  // Per sequence lengths: `batch` entries, or one entry used for every sequence. Dense layouts need
  // equal lengths (dense KV with seqused_k excepted); varlen ones allow any, including 0.
  std::vector<int64_t> q_lens{1};
  std::vector<int64_t> kv_lens{1};
  int64_t h_q = 1, h_kv = 1;
  int64_t head_dim = 64;
  int64_t head_dim_v = 0;  // 0: head_dim
  DType dtype = DType::kFloat32;
  Fp8 fp8 = Fp8::kNone;
  bool descales = true;  // with fp8: random descale factors in [1/4, 1) per (sequence, KV head)
  QLayout q_layout = QLayout::kDense;
  KVLayout kv_layout = KVLayout::kDense;
  int64_t page_size = 16;   // paged KV
  int64_t spare_pages = 3;  // paged KV: pages in the pool that no sequence uses
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  bool with_lse = true;
  float softmax_scale = 0.0f;
  float softcap = 0.0f;  // > 0: tanh capping of the scores
  int alibi = 0;         // ALiBi slopes, random in [0.05, 0.8): 0 none, 1 [h_q], 2 [batch, h_q]
  int32_t num_splits = 1;
  uint64_t seed = 1;
  // Extra elements after every head row of q, k, v and out: non-contiguous (strided) views.
  int64_t pad = 0;
  // Dense or varlen KV: pass seqused_k = kv_lens, with kv_extra more keys stored per sequence.
  // (Paged KV always passes seqused_k.)
  bool use_seqused_k = false;
  int64_t kv_extra = 0;
  bool poison_unused_kv = true;

  int64_t q_len(int64_t b) const { return q_lens.size() == 1 ? q_lens[0] : q_lens.at(b); }
  int64_t kv_len(int64_t b) const { return kv_lens.size() == 1 ? kv_lens[0] : kv_lens.at(b); }
  int64_t dv() const { return head_dim_v ? head_dim_v : head_dim; }
  bool seqused() const { return use_seqused_k || kv_layout == KVLayout::kPaged; }
  DType q_dtype() const { return fp8 == Fp8::kQKV ? DType::kFloat8E4M3 : dtype; }
  DType kv_dtype() const { return fp8 == Fp8::kNone ? dtype : DType::kFloat8E4M3; }
  DType out_dtype() const { return fp8 == Fp8::kQKV ? DType::kBFloat16 : dtype; }

  // A readable identifier (letters, digits, '_') for parametrised test names.
  std::string name() const {
    std::ostringstream os;
    auto lens = [&](const std::vector<int64_t>& v) {
      for (size_t i = 0; i < v.size(); ++i) os << (i ? "x" : "") << v[i];
    };
    os << "b" << batch << "_q";
    lens(q_lens);
    os << "_k";
    lens(kv_lens);
    os << "_h" << h_q << "_" << h_kv << "_d" << head_dim;
    if (dv() != head_dim) os << "v" << dv();
    if (fp8 != Fp8::kQKV)
      os << "_" << (dtype == DType::kFloat32 ? "f32" : dtype == DType::kFloat16 ? "f16" : "bf16");
    if (fp8 != Fp8::kNone) os << (fp8 == Fp8::kKV ? "_fp8kv" : "_fp8") << (descales ? "_ds" : "");
    if (q_layout == QLayout::kVarlen) os << "_qvar";
    if (kv_layout == KVLayout::kVarlen) os << "_kvvar";
    if (kv_layout == KVLayout::kPaged) os << "_page" << page_size;
    if (use_seqused_k) os << "_used" << kv_extra;
    if (causal) os << "_causal";
    if (window_left >= 0) os << "_wl" << window_left;
    if (window_right >= 0) os << "_wr" << window_right;
    if (!with_lse) os << "_nolse";
    if (num_splits != 1) os << "_split" << num_splits;
    if (softcap > 0) os << "_cap" << static_cast<int>(softcap * 10);
    if (alibi) os << "_alibi" << alibi;
    if (pad) os << "_pad" << pad;
    return os.str();
  }
};

// `s` changed by f: a case written as a variation of a base one.
template <typename F>
CaseSpec with(CaseSpec s, F f) {
  f(s);
  return s;
}

// GoogleTest prints a failing parameter with this (instead of its bytes).
inline void PrintTo(const CaseSpec& spec, std::ostream* os) {
  *os << spec.name();
}

// A seed that differs between cases: FNV-1a of the case's name, mixed with a base seed.
inline uint64_t seed_for(const std::string& name, uint64_t base = 0) {
  uint64_t h = 1469598103934665603ull ^ base;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

inline void store_nan(void* base, int64_t i, DType dtype) {
  store_float(base, i, dtype, std::numeric_limits<float>::quiet_NaN());
}

class AttentionCase {
 public:
  // Order of buffers() and of the device_ptrs argument of params().
  enum Buffer {
    kQ,
    kK,
    kV,
    kOut,
    kLse,
    kCuSeqlensQ,
    kCuSeqlensK,
    kSequsedK,
    kBlockTable,
    kAlibi,
    kQDescale,
    kKDescale,
    kVDescale,
    kNum
  };
  struct BufferInfo {
    const char* name;
    std::byte* host;
    size_t bytes;  // 0: not used by this case (its view stays undefined)
  };

  explicit AttentionCase(CaseSpec spec) : s_(std::move(spec)) {
    const int64_t B = s_.batch;
    if (B < 0) throw std::invalid_argument("CaseSpec: negative batch");
    for (int64_t b = 0; b < B; ++b) {
      if (s_.q_layout == QLayout::kDense && s_.q_len(b) != s_.q_len(0))
        throw std::invalid_argument("CaseSpec: dense q needs equal q_lens");
      if (s_.kv_layout == KVLayout::kDense && !s_.use_seqused_k && s_.kv_len(b) != s_.kv_len(0))
        throw std::invalid_argument("CaseSpec: dense kv needs equal kv_lens (or use_seqused_k)");
    }
    const int64_t D = s_.head_dim, Dv = s_.dv(), P = s_.pad;
    const int64_t q_esz = static_cast<int64_t>(dtype_size(s_.q_dtype()));
    const int64_t kv_esz = static_cast<int64_t>(dtype_size(s_.kv_dtype()));
    const int64_t out_esz = static_cast<int64_t>(dtype_size(s_.out_dtype()));

    // Query side.
    cu_q_.assign(B + 1, 0);
    for (int64_t b = 0; b < B; ++b) cu_q_[b + 1] = cu_q_[b] + s_.q_len(b);
    max_q_ = 0;
    for (int64_t b = 0; b < B; ++b) max_q_ = std::max(max_q_, s_.q_len(b));
    q_rows_ = s_.q_layout == QLayout::kDense ? B * (B ? s_.q_len(0) : 0) : cu_q_[B];
    alloc(kQ, q_rows_ * s_.h_q * (D + P) * q_esz);
    alloc(kOut, q_rows_ * s_.h_q * (Dv + P) * out_esz);
    if (s_.with_lse) alloc(kLse, q_rows_ * s_.h_q * 4);
    if (s_.q_layout == QLayout::kVarlen) {
      alloc(kCuSeqlensQ, (B + 1) * 4);
      std::memcpy(buf_[kCuSeqlensQ].data(), cu_q_.data(), (B + 1) * 4);
    }

    // Key/value side: slots_[b] = the row (token slot) of each key j of sequence b.
    max_kv_ = 0;
    for (int64_t b = 0; b < B; ++b) max_kv_ = std::max(max_kv_, s_.kv_len(b));
    std::vector<int64_t> first_slot(B, 0);
    if (s_.kv_layout == KVLayout::kDense) {
      kv_seq_ = max_kv_ + (s_.use_seqused_k ? s_.kv_extra : 0);
      kv_slots_ = B * kv_seq_;
      for (int64_t b = 0; b < B; ++b) first_slot[b] = b * kv_seq_;
    } else if (s_.kv_layout == KVLayout::kVarlen) {
      cu_k_.assign(B + 1, 0);
      for (int64_t b = 0; b < B; ++b)
        cu_k_[b + 1] = cu_k_[b] + s_.kv_len(b) + (s_.use_seqused_k ? s_.kv_extra : 0);
      kv_slots_ = cu_k_[B];
      for (int64_t b = 0; b < B; ++b) first_slot[b] = cu_k_[b];
      alloc(kCuSeqlensK, (B + 1) * 4);
      std::memcpy(buf_[kCuSeqlensK].data(), cu_k_.data(), (B + 1) * 4);
    } else {
      const int64_t ps = s_.page_size;
      if (ps <= 0) throw std::invalid_argument("CaseSpec: page_size must be positive");
      std::vector<int64_t> pages(B);
      int64_t used = 0, widest = 0;
      for (int64_t b = 0; b < B; ++b) {
        pages[b] = (s_.kv_len(b) + ps - 1) / ps;
        used += pages[b];
        widest = std::max(widest, pages[b]);
      }
      num_pages_ = used + s_.spare_pages;
      pages_per_seq_ = widest + 1;  // one column more than needed: it points at a spare page
      std::vector<int32_t> perm(num_pages_);
      std::iota(perm.begin(), perm.end(), 0);
      std::mt19937_64 shuffle_rng(s_.seed ^ 0x9e3779b97f4a7c15ull);
      std::shuffle(perm.begin(), perm.end(), shuffle_rng);
      table_.assign(B * pages_per_seq_, 0);
      const int32_t spare = s_.spare_pages > 0 ? perm[used] : (num_pages_ > 0 ? perm[0] : 0);
      int64_t next = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < pages_per_seq_; ++i)
          table_[b * pages_per_seq_ + i] = i < pages[b] ? perm[next++] : spare;
      kv_slots_ = num_pages_ * ps;
      alloc(kBlockTable, table_.size() * 4);
      // (memcpy from an empty vector's null data is undefined even for 0 bytes: batch 0.)
      if (!table_.empty()) std::memcpy(buf_[kBlockTable].data(), table_.data(), table_.size() * 4);
    }
    if (s_.seqused()) {
      alloc(kSequsedK, B * 4);
      auto* u = reinterpret_cast<int32_t*>(buf_[kSequsedK].data());
      for (int64_t b = 0; b < B; ++b) u[b] = static_cast<int32_t>(s_.kv_len(b));
    }
    alloc(kK, kv_slots_ * s_.h_kv * (D + P) * kv_esz);
    alloc(kV, kv_slots_ * s_.h_kv * (Dv + P) * kv_esz);

    // Values: NaN everywhere, then normal random numbers where the contract lets a kernel read.
    std::mt19937_64 rng(s_.seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    // The descale factors, drawn first from their own stream (the cases without fp8 keep their
    // values): one per (sequence, KV head) of each e4m3 tensor.
    std::vector<float> descale[3];  // q, k, v
    if (s_.fp8 != Fp8::kNone && s_.descales) {
      std::mt19937_64 ds_rng(s_.seed ^ 0x5851f42d4c957f2dull);
      std::uniform_real_distribution<float> factor(0.25f, 1.0f);
      const Buffer bufs[3] = {kQDescale, kKDescale, kVDescale};
      for (int i = s_.fp8 == Fp8::kQKV ? 0 : 1; i < 3; ++i) {
        descale[i].resize(static_cast<size_t>(B * s_.h_kv));
        for (float& f : descale[i]) f = factor(ds_rng);
        alloc(bufs[i], B * s_.h_kv * 4);
        std::memcpy(buf_[bufs[i]].data(), descale[i].data(), descale[i].size() * 4);
      }
    }
    // The sequence of each KV slot (the descale factor of a key is its sequence's).
    std::vector<int64_t> slot_seq(kv_slots_, 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < s_.kv_len(b); ++j) slot_seq[kv_slot(b, j, first_slot[b])] = b;
    // `which` of dtype dt; row r's descale factors for KV head hk are ds[seq(r) * h_kv + hk].
    auto fill = [&](Buffer which, DType dt, int64_t rows, int64_t heads, int64_t dim,
                    const std::vector<bool>* live, const std::vector<float>& ds,
                    auto&& seq_of_row) {
      void* base = buf_[which].data();
      const int64_t row = heads * (dim + P);
      const int64_t group = heads / s_.h_kv;  // q's heads per KV head (1 for k and v)
      for (int64_t i = 0; i < rows * row; ++i) store_nan(base, i, dt);
      for (int64_t r = 0; r < rows; ++r) {
        if (live && !(*live)[r]) continue;
        for (int64_t h = 0; h < heads; ++h) {
          const float inv = ds.empty() ? 1.0f : 1.0f / ds[seq_of_row(r) * s_.h_kv + h / group];
          for (int64_t d = 0; d < dim; ++d)
            store_float(base, r * row + h * (dim + P) + d, dt,
                        static_cast<float>(normal(rng)) * inv);
        }
      }
    };
    std::vector<bool> live(kv_slots_, !s_.poison_unused_kv);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < s_.kv_len(b); ++j) live[kv_slot(b, j, first_slot[b])] = true;
    // The sequence of each row of q (dense b * seqlen + t, varlen by cu_seqlens_q; rows past the
    // last sequence take the last one's factors: nothing reads them).
    auto q_seq = [&](int64_t r) {
      if (s_.q_layout == QLayout::kDense) return B ? r / std::max<int64_t>(1, s_.q_len(0)) : 0;
      const int64_t b = std::upper_bound(cu_q_.begin(), cu_q_.end(), r) - cu_q_.begin() - 1;
      return std::clamp<int64_t>(b, 0, std::max<int64_t>(0, B - 1));
    };
    auto kv_seq = [&](int64_t r) { return slot_seq[r]; };
    fill(kQ, s_.q_dtype(), q_rows_, s_.h_q, D, nullptr, descale[0], q_seq);
    fill(kK, s_.kv_dtype(), kv_slots_, s_.h_kv, D, &live, descale[1], kv_seq);
    fill(kV, s_.kv_dtype(), kv_slots_, s_.h_kv, Dv, &live, descale[2], kv_seq);
    if (s_.alibi) {  // drawn after q, k, v: the cases without ALiBi keep their values
      const int64_t n = (s_.alibi == 2 ? B : 1) * s_.h_q;
      alloc(kAlibi, n * 4);
      std::uniform_real_distribution<float> slope(0.05f, 0.8f);
      for (int64_t i = 0; i < n; ++i)
        store_float(buf_[kAlibi].data(), i, DType::kFloat32, slope(rng));
    }
    poison_outputs();
  }

  const CaseSpec& spec() const { return s_; }

  std::vector<BufferInfo> buffers() {
    static const char* const names[kNum] = {"q",
                                            "k",
                                            "v",
                                            "out",
                                            "lse",
                                            "cu_seqlens_q",
                                            "cu_seqlens_k",
                                            "seqused_k",
                                            "block_table",
                                            "alibi_slopes",
                                            "q_descale",
                                            "k_descale",
                                            "v_descale"};
    std::vector<BufferInfo> r;
    for (int i = 0; i < kNum; ++i) r.push_back({names[i], buf_[i].data(), buf_[i].size()});
    return r;
  }

  // NaN in every element of out (padding included) and lse.
  void poison_outputs() {
    const int64_t n = static_cast<int64_t>(buf_[kOut].size() / dtype_size(s_.out_dtype()));
    for (int64_t i = 0; i < n; ++i) store_nan(buf_[kOut].data(), i, s_.out_dtype());
    for (size_t i = 0; i < buf_[kLse].size() / 4; ++i)
      store_nan(buf_[kLse].data(), static_cast<int64_t>(i), DType::kFloat32);
  }

  // Views of the buffers on `dev`: the host buffers, or device_ptrs[i] for buffers()[i].
  AttentionParams params(Device dev = {}, void* const* device_ptrs = nullptr) {
    auto ptr = [&](Buffer i) -> void* {
      if (buf_[i].empty()) return nullptr;
      return device_ptrs ? device_ptrs[i] : buf_[i].data();
    };
    const int64_t D = s_.head_dim, Dv = s_.dv(), P = s_.pad, B = s_.batch;
    AttentionParams p;
    auto qlike = [&](Buffer i, int64_t dim, DType dt) {
      const int64_t hs = dim + P;  // stride between heads
      if (s_.q_layout == QLayout::kDense) {
        const int64_t S = B ? s_.q_len(0) : 0;
        return view(ptr(i), dt, dev, {B, S, s_.h_q, dim}, {S * s_.h_q * hs, s_.h_q * hs, hs, 1});
      }
      return view(ptr(i), dt, dev, {q_rows_, s_.h_q, dim}, {s_.h_q * hs, hs, 1});
    };
    auto kvlike = [&](Buffer i, int64_t dim) {
      const int64_t hs = dim + P;
      const DType dt = s_.kv_dtype();
      switch (s_.kv_layout) {
        case KVLayout::kDense:
          return view(ptr(i), dt, dev, {B, kv_seq_, s_.h_kv, dim},
                      {kv_seq_ * s_.h_kv * hs, s_.h_kv * hs, hs, 1});
        case KVLayout::kVarlen:
          return view(ptr(i), dt, dev, {kv_slots_, s_.h_kv, dim}, {s_.h_kv * hs, hs, 1});
        default:
          return view(ptr(i), dt, dev, {num_pages_, s_.page_size, s_.h_kv, dim},
                      {s_.page_size * s_.h_kv * hs, s_.h_kv * hs, hs, 1});
      }
    };
    p.q = qlike(kQ, D, s_.q_dtype());
    p.out = qlike(kOut, Dv, s_.out_dtype());
    p.k = kvlike(kK, D);
    p.v = kvlike(kV, Dv);
    if (s_.with_lse) {
      if (s_.q_layout == QLayout::kDense) {
        const int64_t S = B ? s_.q_len(0) : 0;
        p.lse = view(ptr(kLse), DType::kFloat32, dev, {B, s_.h_q, S}, {s_.h_q * S, S, 1});
      } else {
        p.lse = view(ptr(kLse), DType::kFloat32, dev, {s_.h_q, q_rows_}, {q_rows_, 1});
      }
    }
    if (s_.q_layout == QLayout::kVarlen) {
      p.cu_seqlens_q = view(ptr(kCuSeqlensQ), DType::kInt32, dev, {B + 1}, {1});
      p.max_seqlen_q = max_q_;
    }
    if (s_.kv_layout == KVLayout::kVarlen) {
      p.cu_seqlens_k = view(ptr(kCuSeqlensK), DType::kInt32, dev, {B + 1}, {1});
      p.max_seqlen_k = max_kv_ + (s_.use_seqused_k ? s_.kv_extra : 0);
    }
    if (s_.kv_layout == KVLayout::kPaged) {
      p.block_table =
          view(ptr(kBlockTable), DType::kInt32, dev, {B, pages_per_seq_}, {pages_per_seq_, 1});
      p.max_seqlen_k = max_kv_;
    }
    if (s_.seqused()) {
      p.seqused_k = view(ptr(kSequsedK), DType::kInt32, dev, {B}, {1});
      if (s_.kv_layout != KVLayout::kDense) p.max_seqlen_k = std::max(p.max_seqlen_k, max_kv_);
    }
    p.softmax_scale = s_.softmax_scale;
    p.causal = s_.causal;
    p.window_left = s_.window_left;
    p.window_right = s_.window_right;
    p.num_splits = s_.num_splits;
    p.softcap = s_.softcap;
    if (s_.alibi == 1) p.alibi_slopes = view(ptr(kAlibi), DType::kFloat32, dev, {s_.h_q}, {1});
    if (s_.alibi == 2)
      p.alibi_slopes = view(ptr(kAlibi), DType::kFloat32, dev, {B, s_.h_q}, {s_.h_q, 1});
    TensorView* descales[3] = {&p.q_descale, &p.k_descale, &p.v_descale};
    for (int i = 0; i < 3; ++i)
      if (!buf_[kQDescale + i].empty())
        *descales[i] = view(ptr(static_cast<Buffer>(kQDescale + i)), DType::kFloat32, dev,
                            {B, s_.h_kv}, {s_.h_kv, 1});
    return p;
  }

  attention::reference::NaiveOutput exact() {
    return attention::reference::naive_forward(params(), attention::reference::Emulate::kExact);
  }
  attention::reference::NaiveOutput lowp() {
    return attention::reference::naive_forward(params(),
                                               attention::reference::Emulate::kLowPrecision);
  }

  int64_t q_rows() const { return q_rows_; }

 private:
  static TensorView view(void* data, DType dt, Device dev, std::initializer_list<int64_t> shape,
                         std::initializer_list<int64_t> stride) {
    TensorView t;
    t.data = data;
    t.dtype = dt;
    t.device = dev;
    t.rank = static_cast<int32_t>(shape.size());
    int i = 0;
    for (int64_t x : shape) t.shape[i++] = x;
    i = 0;
    for (int64_t x : stride) t.stride[i++] = x;
    return t;
  }

  void alloc(Buffer i, int64_t bytes) { buf_[i].assign(static_cast<size_t>(bytes), std::byte{0}); }

  int64_t kv_slot(int64_t b, int64_t j, int64_t first) const {
    if (s_.kv_layout != KVLayout::kPaged) return first + j;
    const int64_t ps = s_.page_size;
    return int64_t{table_[b * pages_per_seq_ + j / ps]} * ps + j % ps;
  }

  CaseSpec s_;
  std::vector<std::byte> buf_[kNum];
  std::vector<int32_t> cu_q_, cu_k_, table_;
  int64_t q_rows_ = 0, max_q_ = 0, max_kv_ = 0, kv_seq_ = 0, kv_slots_ = 0;
  int64_t num_pages_ = 0, pages_per_seq_ = 0;
};

}  // namespace flashserve::testing
