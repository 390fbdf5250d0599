// The CPU runner: the decoder in float32 with the GEMMs of cpu_ops.h and attention through
// flashserve's CPU path (varlen queries over the paged pool, bottom-right causal), so that CI and
// machines without a GPU run the same model, batch for batch, as the GPU does. The KV pool is
// float32 (auto), bf16 or e4m3 with per-(layer, KV head) scales (model/kv_cache_dtype.h): K and V
// are rounded to it where they are written, and the attention reads them back dequantised.
// Under tensor parallelism (a Communicator given) the runner is one rank: it loads its slice of
// every weight (model/weight_shard.h), computes its query heads, KV heads, MLP columns and
// vocabulary block, and all-reduces the row-parallel projections' partial sums and all-gathers
// the logits (docs/tensor-parallel.md); model/tensor_parallel_runner.h runs the ranks.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/thread_pool.h"
#include "flashserve/attention.h"
#include "flashserve/error.h"
#include "model/checkpoint.h"
#include "model/communicator.h"
#include "model/cpu_linear.h"
#include "model/cpu_ops.h"
#include "model/cpu_rank_runner.h"
#include "model/local_communicator.h"
#include "model/rope.h"
#include "model/runner.h"
#include "model/step_attention.h"
#include "model/tensor_parallel.h"
#include "model/tensor_parallel_runner.h"
#include "model/weight_shard.h"
#include "model/weights.h"

namespace flashserve::model {

namespace {

// A weight matrix as the GEMM reads it: bf16 where the checkpoint holds bf16 and our kernel runs
// on this CPU (half the memory and half the bytes a decode step reads; widening is exact), else
// float32 (a float32 or fp16 checkpoint, or a BLAS doing the GEMMs).
struct Matrix {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  cpu::Weight weight() const { return bf16.empty() ? cpu::Weight(f32.data()) : bf16.data(); }
  // The matrix from row `r` (of `width`) on: a tied LM head's vocabulary block of the embedding.
  cpu::Weight weight_from_row(int64_t r, int64_t width) const {
    return bf16.empty() ? cpu::Weight(f32.data() + r * width) : bf16.data() + r * width;
  }
  // Row r (of `width`) as float32 at dst.
  void row(int64_t r, int64_t width, float* dst) const {
    if (bf16.empty()) return (void)std::copy_n(f32.data() + r * width, width, dst);
    for (int64_t i = 0; i < width; ++i) dst[i] = to_float(bf16_t{bf16[r * width + i]});
  }
};

// One decoder layer, with q/k/v fused into one [q + 2 kv, hidden] matrix and gate/up into one
// [2 ffn, hidden] matrix so that each is one GEMM.
struct CpuLayer {
  std::vector<float> input_norm, qkv_bias, post_norm;
  std::vector<float> q_norm, k_norm;  // Qwen3: per-head RMSNorm scales [head_dim]
  Matrix qkv, o, gate_up, down;
};

// Qwen3's q_norm/k_norm: RMSNorm of each of `heads` consecutive vectors of `d`, in place. Serial
// (cpu::rms_norm would thread it): it runs inside the per-token loop, already on the pool.
void rms_norm_heads(float* x, const float* weight, int64_t heads, int64_t d, double eps) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(v[i]) * v[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) v[i] = v[i] * inv * weight[i];
  }
}

TensorView view(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return make_view(const_cast<void*>(data), dtype, shape);
}

// The pool's element type for a --kv-cache-dtype.
DType pool_dtype(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kBf16:
      return DType::kBFloat16;
    case KvCacheDtype::kFp8E4M3:
      return DType::kFloat8E4M3;
    default:
      return DType::kFloat32;
  }
}

// Writes one token's K (or V) row, `heads` heads of d floats, into slot `slot` of a pool of
// `dtype`; an e4m3 pool stores x / scale[h] (saturating at +-448).
void write_kv_row(const float* src, int64_t heads, int64_t d, DType dtype, std::byte* pool,
                  int64_t slot, const float* scale) {
  const int64_t n = heads * d;
  switch (dtype) {
    case DType::kBFloat16: {
      bf16_t* dst = reinterpret_cast<bf16_t*>(pool) + slot * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
      break;
    }
    case DType::kFloat8E4M3: {
      fp8_e4m3_t* dst = reinterpret_cast<fp8_e4m3_t*>(pool) + slot * n;
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < d; ++i) dst[h * d + i] = to_e4m3(src[h * d + i] / scale[h]);
      break;
    }
    default:
      std::copy_n(src, n, reinterpret_cast<float*>(pool) + slot * n);
      break;
  }
}

class CpuRunner final : public ModelRunner {
 public:
  CpuRunner(const std::string& dir, Communicator* comm) : comm_(comm) {
    const Checkpoint ckpt = Checkpoint::open(dir);
    check_weights(ckpt);
    config_ = ckpt.config();
    const ModelConfig& c = config_;
    const int64_t tp = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
    part_ = rank_shape(c, tp, rank);  // refuses a size that does not split the model
    const int64_t q = part_.q_heads * c.head_dim, kv = part_.kv_heads * c.head_dim;
    const RankWeights weights(ckpt, tp, rank);
    auto tensor = [&](const std::string& name) { return weights.tensor(name); };
    auto load = [&](const std::string& name, std::vector<float>& dst, size_t at = 0) {
      const RankTensor rt = tensor(name);
      const TensorInfo& t = rt.info;
      if (dst.size() < at + static_cast<size_t>(t.numel())) dst.resize(at + t.numel());
      copy_as_float(t, dst.data() + at);
    };
    const bool keep_bf16 = cpu::linear_nt_is_vectorised();
    // The tensors `names` stacked, in that order, into one matrix (q/k/v, gate/up): bf16 when all
    // of them are and our kernel runs here.
    auto load_matrix = [&](std::initializer_list<std::string> names, Matrix& dst) {
      std::vector<RankTensor> parts;
      for (const std::string& n : names) parts.push_back(tensor(n));
      const bool bf16 = keep_bf16 && std::all_of(parts.begin(), parts.end(), [](const auto& t) {
                          return t.info.dtype == DType::kBFloat16;
                        });
      size_t at = 0;
      for (const RankTensor& rt : parts) {
        const TensorInfo& t = rt.info;
        const size_t n = static_cast<size_t>(t.numel());
        if (bf16) {
          dst.bf16.resize(at + n);
          std::memcpy(dst.bf16.data() + at, t.data, n * 2);  // the mapping may be unaligned
        } else {
          dst.f32.resize(at + n);
          copy_as_float(t, dst.f32.data() + at);
        }
        at += n;
      }
    };
    load_matrix({"model.embed_tokens.weight"}, embed_);
    layers_.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      CpuLayer& L = layers_[l];
      auto name = [&](const char* suffix) { return layer_weight(l, suffix); };
      load(name("input_layernorm.weight"), L.input_norm);
      load_matrix({name("self_attn.q_proj.weight"), name("self_attn.k_proj.weight"),
                   name("self_attn.v_proj.weight")},
                  L.qkv);
      if (c.attention_bias) {
        L.qkv_bias.resize(static_cast<size_t>(q + 2 * kv));
        load(name("self_attn.q_proj.bias"), L.qkv_bias, 0);
        load(name("self_attn.k_proj.bias"), L.qkv_bias, q);
        load(name("self_attn.v_proj.bias"), L.qkv_bias, q + kv);
      }
      if (c.qk_norm) {
        load(name("self_attn.q_norm.weight"), L.q_norm);
        load(name("self_attn.k_norm.weight"), L.k_norm);
      }
      load_matrix({name("self_attn.o_proj.weight")}, L.o);
      load(name("post_attention_layernorm.weight"), L.post_norm);
      load_matrix({name("mlp.gate_proj.weight"), name("mlp.up_proj.weight")}, L.gate_up);
      load_matrix({name("mlp.down_proj.weight")}, L.down);
    }
    load("model.norm.weight", final_norm_);
    if (!c.tie_word_embeddings) load_matrix({"lm_head.weight"}, lm_head_);
    ckpt.check_unchanged();  // no file was rewritten while its weights were copied
    inv_freq_ = rope_inv_freq(c);
    rope_scale_ = rope_attention_scaling(c);
    CpuRunner::set_kv_cache(KvCacheConfig{});  // float32 until told otherwise
  }

  const ModelConfig& config() const override { return config_; }

  void set_kv_cache(const KvCacheConfig& kv) override {
    const size_t n = static_cast<size_t>(config_.num_hidden_layers * part_.kv_heads);
    check_kv_cache_config(kv, n);
    kv_dtype_ = pool_dtype(kv.dtype);
    k_scale_ = kv.k_scales.empty() ? std::vector<float>(n, 1.0f) : kv.k_scales;
    v_scale_ = kv.v_scales.empty() ? std::vector<float>(n, 1.0f) : kv.v_scales;
    kv_.clear();  // a pool of the old element size must not be written as the new one
    num_blocks_ = 0;
  }

  void allocate_kv(int64_t num_blocks, int32_t block_size) override {
    if (num_blocks < 1 || block_size < 1)
      throw Error(ErrorKind::kInvalidArgument, "allocate_kv",
                  "num_blocks and block_size must be positive");
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    const size_t per_pool =
        static_cast<size_t>(num_blocks * block_size * part_.kv_heads * config_.head_dim) *
        dtype_size(kv_dtype_);
    kv_.assign(static_cast<size_t>(config_.num_hidden_layers) * 2, {});
    for (auto& pool : kv_) pool.assign(per_pool, std::byte{0});
  }

  void forward(const ForwardBatch& b) override;

  std::vector<float> logits() const override { return logits_; }

  std::vector<float> logits_rows(const std::vector<int32_t>& rows) const override {
    const int64_t V = config_.vocab_size;
    std::vector<float> out;
    out.reserve(rows.size() * static_cast<size_t>(V));
    for (int32_t r : rows) {
      if (r < 0 || r >= logits_rows_)
        throw Error(ErrorKind::kInvalidArgument, "rows",
                    std::to_string(r) + " is not a sample row of the last forward (" +
                        std::to_string(logits_rows_) + ")");
      out.insert(out.end(), logits_.begin() + r * V, logits_.begin() + (r + 1) * V);
    }
    return out;
  }

  using ModelRunner::sample;
  std::vector<int32_t> sample(const ForwardBatch& b, const std::vector<SamplingParams>& params,
                              const std::vector<LogitsAdjust>& adjust) override {
    const int64_t rows = static_cast<int64_t>(b.sample_rows.size());
    if (static_cast<int64_t>(params.size()) != rows)
      throw Error(
          ErrorKind::kInvalidArgument, "params",
          std::to_string(params.size()) + " given for " + std::to_string(rows) + " sample rows");
    if (!adjust.empty() && static_cast<int64_t>(adjust.size()) != rows)
      throw Error(
          ErrorKind::kInvalidArgument, "adjust",
          std::to_string(adjust.size()) + " given for " + std::to_string(rows) + " sample rows");
    if (rows != logits_rows_)
      throw Error(ErrorKind::kInvalidArgument, "batch", "is not the batch of the last forward");
    const int64_t V = config_.vocab_size;
    std::vector<int32_t> out(static_cast<size_t>(rows));
    std::vector<float> row;  // an adjusted copy: the kept logits stay the model's
    for (int64_t i = 0; i < rows; ++i) {
      params[i].validate();
      const float u = sample_uniform(params[i].seed, b.positions[b.sample_rows[i]] + 1);
      const float* l = logits_.data() + i * V;
      if (!adjust.empty() && !adjust[i].empty()) {
        row.assign(l, l + V);
        apply_logits_adjust(row.data(), V, adjust[i]);
        l = row.data();
      }
      out[i] = sample_token(l, V, params[i], u);
    }
    return out;
  }

 private:
  void check_fits(const ForwardBatch& b) const;
  // x += y W^T for a row-parallel projection (o_proj, down_proj): alone, accumulated into x by the
  // GEMM; under tensor parallelism, this rank's partial sum over its columns, all-reduced, then
  // added (partial: a [rows, width] scratch).
  void add_projection(const float* y, const Matrix& w, float* x, std::vector<float>& partial,
                      int64_t rows, int64_t width, int64_t k) const;
  // logits_ = rows of `last` times the LM head: this rank's vocabulary block, all-gathered.
  void lm_head(const float* last, int64_t rows);

  ModelConfig config_;
  Communicator* comm_ = nullptr;  // null: the whole model on this runner
  RankShape part_;                // this rank's heads, MLP columns and vocabulary
  Matrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<CpuLayer> layers_;
  std::vector<double> inv_freq_;
  double rope_scale_ = 1.0;  // yarn's factor on cos and sin
  int64_t num_blocks_ = 0;
  int32_t block_size_ = 0;
  std::vector<std::vector<std::byte>> kv_;  // [layer * 2 + (0: K, 1: V)], of kv_dtype_
  DType kv_dtype_ = DType::kFloat32;
  std::vector<float> k_scale_, v_scale_;  // [layer * kv_heads + h]: e4m3 pools' scales
  std::vector<float> logits_;
  int64_t logits_rows_ = 0;
};

void CpuRunner::check_fits(const ForwardBatch& b) const {
  b.validate();
  if (kv_.empty()) throw Error(ErrorKind::kInvalidArgument, "kv", "allocate_kv first");
  check_rope_positions(config_, b.positions);
  const int64_t slots = num_blocks_ * block_size_;
  for (int64_t t = 0; t < b.total_q; ++t) {
    if (b.input_ids[t] < 0 || b.input_ids[t] >= config_.vocab_size)
      throw Error(ErrorKind::kInvalidArgument, "batch.input_ids",
                  std::to_string(b.input_ids[t]) + " is outside the vocabulary of " +
                      std::to_string(config_.vocab_size));
    if (b.slot_mapping[t] < 0 || b.slot_mapping[t] >= slots)
      throw Error(ErrorKind::kInvalidArgument, "batch.slot_mapping",
                  std::to_string(b.slot_mapping[t]) + " is outside the pool of " +
                      std::to_string(slots) + " slots");
  }
  for (int32_t id : b.block_table)
    if (id < 0 || id >= num_blocks_)
      throw Error(
          ErrorKind::kInvalidArgument, "batch.block_table",
          "block " + std::to_string(id) + " is outside the pool of " + std::to_string(num_blocks_));
  for (int64_t i = 0; i < b.batch; ++i)
    if (b.seqused_k[i] > b.pages_per_seq * block_size_)
      throw Error(ErrorKind::kInvalidArgument, "batch.block_table",
                  "entry " + std::to_string(i) + "'s pages do not cover its " +
                      std::to_string(b.seqused_k[i]) + " keys");
}

void CpuRunner::forward(const ForwardBatch& b) {
  check_fits(b);
  const ModelConfig& c = config_;
  const int64_t T = b.total_q, H = c.hidden_size, F = part_.ffn;
  const int64_t hq = part_.q_heads, hkv = part_.kv_heads, d = c.head_dim;
  const int64_t qw = hq * d, kvw = hkv * d, qkvw = qw + 2 * kvw;
  const int64_t S = static_cast<int64_t>(b.sample_rows.size());

  std::vector<float> x(static_cast<size_t>(T * H)), hbuf(x.size());
  std::vector<float> qkv(static_cast<size_t>(T * qkvw)), attn(static_cast<size_t>(T * qw));
  std::vector<float> gu(static_cast<size_t>(T * 2 * F)), act(static_cast<size_t>(T * F));
  std::vector<float> partial(comm_ ? x.size() : 0);
  for (int64_t t = 0; t < T; ++t) embed_.row(b.input_ids[t], H, x.data() + t * H);

  // The step's attention, planned once from the batch's lengths and run per layer.
  StepAttentionTensors at;
  at.q = view(qkv.data(), DType::kFloat32, {T, hq, d});
  at.q.stride[0] = qkvw;  // q is the first qw columns of the fused qkv rows
  at.out = view(attn.data(), DType::kFloat32, {T, hq, d});
  at.kv_pool = view(kv_[0].data(), kv_dtype_, {num_blocks_, block_size_, hkv, d});
  at.cu_seqlens_q = b.cu_seqlens_q.data();
  at.seqused_k = b.seqused_k.data();
  at.block_table = b.block_table.data();
  at.table_width = b.pages_per_seq;
  at.num_splits = 1;
  const StepAttention attention(c, b, at);

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const CpuLayer& L = layers_[l];
    std::byte* kcache = kv_[2 * l].data();
    std::byte* vcache = kv_[2 * l + 1].data();
    const float* k_scale = k_scale_.data() + l * hkv;
    const float* v_scale = v_scale_.data() + l * hkv;
    cpu::rms_norm(x.data(), L.input_norm.data(), hbuf.data(), T, H, c.rms_norm_eps);
    cpu::linear(hbuf.data(), L.qkv.weight(), qkv.data(), T, qkvw, H);
    cpu::for_rows(T, qkvw * 4, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* row = qkv.data() + t * qkvw;
        if (!L.qkv_bias.empty())
          for (int64_t i = 0; i < qkvw; ++i) row[i] += L.qkv_bias[i];
        if (c.qk_norm) {  // each q and k head normalized on its own, before the rotation
          rms_norm_heads(row, L.q_norm.data(), hq, d, c.rms_norm_eps);
          rms_norm_heads(row + qw, L.k_norm.data(), hkv, d, c.rms_norm_eps);
        }
        apply_rope(row, hq, d, d, b.positions[t], inv_freq_, rope_scale_);
        apply_rope(row + qw, hkv, d, d, b.positions[t], inv_freq_, rope_scale_);
        const int64_t slot = b.slot_mapping[t];
        write_kv_row(row + qw, hkv, d, kv_dtype_, kcache, slot, k_scale);
        write_kv_row(row + qw + kvw, hkv, d, kv_dtype_, vcache, slot, v_scale);
      }
    });
    if (kv_dtype_ == DType::kFloat8E4M3)
      attention.run(l, kcache, vcache, k_scale, v_scale);
    else
      attention.run(l, kcache, vcache);

    add_projection(attn.data(), L.o, x.data(), partial, T, H, qw);  // x += attn W_o^T
    cpu::rms_norm(x.data(), L.post_norm.data(), hbuf.data(), T, H, c.rms_norm_eps);
    cpu::linear(hbuf.data(), L.gate_up.weight(), gu.data(), T, 2 * F, H);
    cpu::silu_mul(gu.data(), act.data(), T, F);
    add_projection(act.data(), L.down, x.data(), partial, T, H, F);  // x += act W_down^T
  }

  // Only the sampled rows go through the final norm and the LM head.
  std::vector<float> last(static_cast<size_t>(S * H));
  for (int64_t i = 0; i < S; ++i)
    std::copy_n(x.data() + static_cast<int64_t>(b.sample_rows[i]) * H, H, last.data() + i * H);
  cpu::rms_norm(last.data(), final_norm_.data(), last.data(), S, H, c.rms_norm_eps);
  lm_head(last.data(), S);
}

void CpuRunner::add_projection(const float* y, const Matrix& w, float* x,
                               std::vector<float>& partial, int64_t rows, int64_t width,
                               int64_t k) const {
  if (!comm_) return cpu::linear(y, w.weight(), x, rows, width, k, true);
  cpu::linear(y, w.weight(), partial.data(), rows, width, k);
  comm_->all_reduce_sum(partial.data(), rows * width, DType::kFloat32);
  cpu::for_rows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * width; i < end * width; ++i) x[i] += partial[static_cast<size_t>(i)];
  });
}

void CpuRunner::lm_head(const float* last, int64_t S) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  // A tied head is the embedding's rows of this rank's vocabulary (the embedding is replicated).
  const cpu::Weight head = config_.tie_word_embeddings
                               ? embed_.weight_from_row(part_.vocab_begin, H)
                               : lm_head_.weight();
  logits_rows_ = S;
  if (!comm_) {
    logits_.assign(static_cast<size_t>(S * V), 0.0f);
    return cpu::linear(last, head, logits_.data(), S, V, H);
  }
  // Every rank sends a block of vocab_block columns per row (the last rank's padded), the
  // gather's equal blocks, and keeps what each rank's vocabulary covers.
  const int64_t block = part_.vocab_block, n = comm_->size();
  std::vector<float> mine(static_cast<size_t>(S * part_.vocab)),
      sent(static_cast<size_t>(S * block));
  cpu::linear(last, head, mine.data(), S, part_.vocab, H);
  for (int64_t i = 0; i < S; ++i)
    std::copy_n(mine.data() + i * part_.vocab, part_.vocab, sent.data() + i * block);
  std::vector<float> all(static_cast<size_t>(n * S * block));
  comm_->all_gather(sent.data(), all.data(), S * block, DType::kFloat32);
  // NaN first, so that a column no rank wrote shows.
  logits_.assign(static_cast<size_t>(S * V), std::numeric_limits<float>::quiet_NaN());
  for (int64_t r = 0; r < n; ++r) {
    const int64_t begin = std::min(V, r * block), count = std::min(V, begin + block) - begin;
    for (int64_t i = 0; i < S; ++i)
      std::copy_n(all.data() + (r * S + i) * block, count, logits_.data() + i * V + begin);
  }
}

}  // namespace

std::unique_ptr<ModelRunner> make_cpu_rank_runner(const std::string& dir, Communicator* comm) {
#if !FLASHSERVE_WITH_BLAS
  throw Error(ErrorKind::kUnsupported, "device",
              "cpu: this flashserve is built without OpenBLAS (apt-get install libopenblas-dev)");
#endif
  return std::make_unique<CpuRunner>(dir, comm);
}

std::unique_ptr<ModelRunner> make_cpu_runner(const std::string& dir, int tensor_parallel_size) {
  if (tensor_parallel_size == 1) return make_cpu_rank_runner(dir, nullptr);
  // Refused by name before any rank loads (and before a group of a nonsense size is made).
  check_tensor_parallel(Checkpoint::open(dir).config(), tensor_parallel_size);
  auto group = make_local_group(tensor_parallel_size);
  std::vector<std::unique_ptr<ModelRunner>> ranks;
  for (int r = 0; r < tensor_parallel_size; ++r)
    ranks.push_back(make_cpu_rank_runner(dir, &group->rank(r)));
  return make_tensor_parallel_runner(std::move(group), std::move(ranks));
}

}  // namespace flashserve::model
