// One backward test case: an AttentionCase (its q, k, v and the forward's out and lse, which the
// test fills by running the forward), a fresh random dout (and optionally dlse), and gradient
// buffers laid out like q, k and v (the case's padding included), poisoned with NaN so that an
// element the backward leaves unwritten shows. Readers return the gradients in the row order of
// reference::naive_backward (every stored row of the tensor, in order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "attention/reference/naive.h"
#include "common/half.h"
#include "flashserve/attention_backward.h"
#include "support/attention_case.h"

namespace flashserve::testing {

// The storage offset of element i (row-major over the shape) of a view.
inline int64_t element_offset(const TensorView& t, int64_t i) {
  int64_t off = 0;
  for (int d = t.rank - 1; d >= 0; --d) {
    off += (i % t.shape[d]) * t.stride[d];
    i /= t.shape[d];
  }
  return off;
}

// Every element of a view as doubles, row-major over its shape (a strided view's padding is
// skipped).
inline std::vector<double> read_all(const TensorView& t) {
  std::vector<double> r(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) r[i] = load_float(t.data, element_offset(t, i), t.dtype);
  return r;
}

class BackwardCase {
 public:
  explicit BackwardCase(const CaseSpec& spec, bool with_dlse = false)
      : c_(with_lse(spec)), with_dlse_(with_dlse) {
    const auto bufs = c_.buffers();
    auto poisoned = [&](size_t bytes) {
      std::vector<std::byte> b(bytes);
      for (size_t i = 0; i < bytes / dtype_size(spec.dtype); ++i)
        store_nan(b.data(), static_cast<int64_t>(i), spec.dtype);
      return b;
    };
    dq_ = poisoned(bufs[AttentionCase::kQ].bytes);
    dk_ = poisoned(bufs[AttentionCase::kK].bytes);
    dv_ = poisoned(bufs[AttentionCase::kV].bytes);
    // dout: normal random values in every element of out's view, NaN in its padding.
    dout_ = poisoned(bufs[AttentionCase::kOut].bytes);
    std::mt19937_64 rng(spec.seed ^ 0x5851f42d4c957f2dull);
    std::normal_distribution<double> normal;
    fill_view(view_of(c_.params().out, dout_.data()), rng, normal);
    if (with_dlse_) {
      dlse_.resize(bufs[AttentionCase::kLse].bytes);
      fill_view(view_of(c_.params().lse, dlse_.data()), rng, normal);
    }
  }

  AttentionCase& attention() { return c_; }

  // Runs the forward (our CPU path) so that out and lse hold what a training step would save.
  void run_forward() { attention_forward(c_.params()); }

  // The gradient-side buffers, in the order of params()'s grad_ptrs: dout, dlse, dq, dk, dv.
  enum Grad { kDout, kDlse, kDq, kDk, kDv, kNumGrads };
  std::vector<AttentionCase::BufferInfo> grad_buffers() {
    return {{"dout", dout_.data(), dout_.size()},
            {"dlse", dlse_.data(), dlse_.size()},
            {"dq", dq_.data(), dq_.size()},
            {"dk", dk_.data(), dk_.size()},
            {"dv", dv_.data(), dv_.size()}};
  }

  // Views of the host buffers, or on `dev` of attn_ptrs (AttentionCase::buffers() order) and
  // grad_ptrs (grad_buffers() order).
  AttentionBackwardParams params(Device dev = {}, void* const* attn_ptrs = nullptr,
                                 void* const* grad_ptrs = nullptr) {
    AttentionBackwardParams p;
    p.attn = c_.params(dev, attn_ptrs);
    auto at = [&](Grad g, std::vector<std::byte>& host) -> void* {
      return grad_ptrs ? grad_ptrs[g] : host.data();
    };
    p.dout = view_of(p.attn.out, at(kDout, dout_));
    if (with_dlse_) p.dlse = view_of(p.attn.lse, at(kDlse, dlse_));
    p.dq = view_of(p.attn.q, at(kDq, dq_));
    p.dk = view_of(p.attn.k, at(kDk, dk_));
    p.dv = view_of(p.attn.v, at(kDv, dv_));
    return p;
  }

  // The gradients the backward wrote, in naive_backward's order.
  attention::reference::NaiveGrads read() {
    const AttentionBackwardParams p = params();
    return {read_all(p.dq), read_all(p.dk), read_all(p.dv)};
  }

  attention::reference::NaiveGrads reference(attention::reference::Emulate mode) {
    const AttentionBackwardParams p = params();
    return attention::reference::naive_backward(p.attn, p.dout, mode, p.dlse);
  }

 private:
  static CaseSpec with_lse(CaseSpec s) {
    s.with_lse = true;
    return s;
  }
  static TensorView view_of(TensorView like, void* data) {
    like.data = data;
    return like;
  }
  static void fill_view(const TensorView& t, std::mt19937_64& rng,
                        std::normal_distribution<double>& normal) {
    for (int64_t i = 0; i < t.numel(); ++i)
      store_float(t.data, element_offset(t, i), t.dtype, static_cast<float>(normal(rng)));
  }

  AttentionCase c_;
  bool with_dlse_;
  std::vector<std::byte> dout_, dlse_, dq_, dk_, dv_;
};

}  // namespace flashserve::testing
