#include "model/cuda/cuda_runner.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "common/cuda_device_count.h"
#include "flashserve/attention.h"
#include "flashserve/error.h"
#include "model/checkpoint.h"
#include "model/communicator.h"
#include "model/cuda/check.h"
#include "model/cuda/convert.h"
#include "model/cuda/embedding.h"
#include "model/cuda/fused_gemv.h"
#include "model/cuda/gemm.h"
#include "model/cuda/logits_adjust.h"
#include "model/cuda/rmsnorm.h"
#include "model/cuda/rope_kv_write.h"
#include "model/cuda/sample.h"
#include "model/cuda/silu_mul.h"
#include "model/decode_kernels.h"
#include "model/nccl_communicator.h"
#include "model/rope.h"
#include "model/step_attention.h"
#include "model/step_graphs.h"
#include "model/tensor_parallel.h"
#include "model/tensor_parallel_runner.h"
#include "model/weight_shard.h"
#include "model/weights.h"

namespace flashserve::model::cuda {
namespace {

using bf16 = __nv_bfloat16;

// What the CPU runner runs and this one does not: Qwen3's per-head q/k RMSNorm would need a
// reduction over each head inside rope_kv_write (not written yet).
void check_cuda_supports(const ModelConfig& c) {
  if (c.qk_norm)
    throw Error(ErrorKind::kUnsupported, "architectures",
                c.architecture +
                    " is not supported by the CUDA runner yet (its q/k RMSNorm); use --device cpu");
}

// Device memory freed on destruction; grow() reallocates only when asked for more than it holds.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() { release(); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // Returns true when it reallocated (the old contents are gone).
  bool grow(size_t bytes, const char* what) {
    if (bytes <= bytes_) return false;
    release();
    check_cuda(cudaMalloc(&ptr_, bytes), what);
    bytes_ = bytes;
    return true;
  }
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct LayerWeights {
  bf16 *ln1 = nullptr, *qkv = nullptr, *qkv_bias = nullptr, *o = nullptr;
  bf16 *ln2 = nullptr, *gate_up = nullptr, *down = nullptr;
};

size_t align256(size_t b) {
  return (b + 255) / 256 * 256;
}

}  // namespace

struct CudaRunner::Impl {
  ModelConfig cfg;  // the whole model's
  // Tensor parallelism (comm set): this rank's query heads, KV heads, MLP columns and vocabulary
  // block (model/tensor_parallel.h); without it, the whole model (rank 0 of 1).
  Communicator* comm = nullptr;
  RankShape part;
  int device = 0;
  int sms = 132;
  cudaStream_t stream = nullptr;
  Gemm* gemm = nullptr;  // created after the device is set
  std::unique_ptr<Gemm> gemm_owner;

  // Weights: one allocation, each tensor at a 256-byte aligned offset.
  DeviceMemory weight_mem;
  size_t weight_cursor = 0;
  bf16 *embed = nullptr, *final_norm = nullptr, *lm_head = nullptr;
  std::vector<LayerWeights> layers_w;
  float* inv_freq = nullptr;  // [head_dim / 2], in the weight allocation
  float rope_scale = 1.0f;    // yarn's factor on cos and sin

  // KV pool: per layer K then V, each [num_blocks, block_size, kv_heads, head_dim] of bf16, or
  // (kv_fp8) of e4m3 codes with per-(layer, KV head) scales: K's [layers * kv_heads] then V's
  // in kv_scale_mem (set_kv_cache's, 1.0 when none were given).
  DeviceMemory kv_mem, kv_scale_mem;
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  bool kv_fp8 = false;
  std::vector<float> k_scales, v_scales;
  int64_t kv_elem_bytes() const { return kv_fp8 ? 1 : 2; }

  // Step buffers, grown to the largest step seen.
  DeviceMemory act_mem, idx_mem, attn_ws, sample_mem;
  // Sampling with adjustments (penalties, biases, masks): the adjusted copy of the logits, then
  // the rows' lists (CudaRunner::sample).
  DeviceMemory adjust_mem;
  int64_t token_cap = 0, sample_cap = 0;
  bf16 *x = nullptr, *h = nullptr, *qkv = nullptr, *q = nullptr, *attn = nullptr, *delta = nullptr,
       *gu = nullptr, *act = nullptr, *hs = nullptr;
  float* logits = nullptr;  // [sample rows, vocab]: the whole vocabulary's on every rank
  float *logits_sent = nullptr, *logits_gathered = nullptr;  // tensor parallelism's gather
  int32_t* tokens_dev = nullptr;
  RowSampling* params_dev = nullptr;
  // Pinned staging of the step's index arrays (one memcpy per step) and of sampling parameters.
  void* pinned = nullptr;
  size_t pinned_bytes = 0;
  cudaEvent_t staged = nullptr;  // the last copy out of `pinned` has completed
  int64_t last_samples = 0;

  // Profiling.
  bool profiling = false;
  std::vector<cudaEvent_t> events;
  std::vector<std::pair<std::string, int>> marks;  // stage name, index of its end event
  int event_next = 0;
  std::map<std::string, double> totals;

  ~Impl() {
    cudaSetDevice(device);  // a tensor-parallel runner drops its ranks from one thread
    if (stream) cudaStreamSynchronize(stream);
    drop_graphs();
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (staged) cudaEventDestroy(staged);
    if (pinned) cudaFreeHost(pinned);
    gemm_owner.reset();
    if (stream) cudaStreamDestroy(stream);
  }

  // The model and this runner's part of it (comm null: all of it). Before init.
  void set_model(const ModelConfig& config, Communicator* c) {
    cfg = config;
    comm = c;
    // Refuses a size that does not split the model, naming tensor_parallel_size.
    part = rank_shape(cfg, tp_size(), comm ? comm->rank() : 0);
  }

  void init(int dev) {
    device = dev;
    // Graphs on or off, and the largest mixed step that takes one (model/step_graphs.h).
    const StepGraphOptions env = step_graph_options_from_env();
    use_graphs = env.graphs;
    mixed_max_tokens = env.mixed_max_tokens;
    const int count = cuda_device_count();
    if (dev < 0 || dev >= count)
      throw Error(ErrorKind::kInvalidArgument, "device",
                  "CUDA device " + std::to_string(dev) + " does not exist (" +
                      std::to_string(count) + " found)");
    // The context is made here: on a device another process has filled, this is where it fails
    // (the H200 with all but 192 MiB held by another process: "cudaSetDevice: out of memory").
    const cudaError_t set = cudaSetDevice(dev);
    if (set == cudaErrorMemoryAllocation)
      throw Error(ErrorKind::kCuda, "device",
                  "CUDA device " + std::to_string(dev) +
                      " has no memory left to start on (cudaSetDevice: out of memory): other "
                      "processes hold it (nvidia-smi lists them)");
    check_cuda(set, "cudaSetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    check_cuda(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming), "event");
    gemm_owner = std::make_unique<Gemm>();
    gemm = gemm_owner.get();
    // The small steps' products and programmatic dependent launch (model/decode_kernels.h).
    const DecodeKernelOptions kernels = decode_kernel_options_from_env(
        std::getenv("FLASHSERVE_GEMV"), std::getenv("FLASHSERVE_PDL"),
        std::getenv("FLASHSERVE_PDL_ATTENTION"), std::getenv("FLASHSERVE_EARLY_WEIGHTS"));
    int major = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "CC");
    pdl = kernels.pdl && major >= 9;
    pdl_attention = kernels.pdl_attention;
    early_weights = kernels.early_weights;
    gemm->set_gemv_rows(kernels.gemv_rows);
    gemm->set_pdl(pdl);
    gemm->set_early_weights(pdl && early_weights);
    fusion = decode_fusion_from_env(std::getenv("FLASHSERVE_FUSE_NORM"),
                                    std::getenv("FLASHSERVE_FUSE_SILU"));
    if (comm) {
      refuse_fused_norm("FLASHSERVE_FUSE_NORM");
      comm->set_stream(stream);  // its collectives order with this rank's kernels
      if (!comm->capturable()) {
        use_graphs = false;
        mixed_max_tokens = 0;
      }
    }
  }

  // The fused norm adds the o and down products into the residual stream inside the product
  // (model/decode_kernels.h), where a rank's partial sum would be added before the all-reduce.
  void refuse_fused_norm(const char* what) const {
    if (comm && fusion.norm)
      throw Error(ErrorKind::kUnsupported, what,
                  "the fused norm adds the o and down products into the residual stream before "
                  "the tensor-parallel all-reduce could sum them: leave it off with ranks");
  }

  // --- weights -----------------------------------------------------------------------------
  // This rank's widths: its query heads' columns (q; o's inputs), its KV heads' (k, v), its MLP
  // columns and its LM-head rows (the whole model's without tensor parallelism).
  int64_t q_cols() const { return part.q_heads * cfg.head_dim; }
  int64_t kv_cols() const { return part.kv_heads * cfg.head_dim; }
  int64_t qkv_rows() const { return q_cols() + 2 * kv_cols(); }
  int64_t ffn() const { return part.ffn; }
  int32_t q_heads() const { return static_cast<int32_t>(part.q_heads); }
  int32_t kv_heads() const { return static_cast<int32_t>(part.kv_heads); }
  int64_t tp_size() const { return comm ? comm->size() : 1; }

  size_t weight_plan_bytes() const {
    const int64_t H = cfg.hidden_size, I = ffn(), V = cfg.vocab_size;
    size_t b = align256(V * H * 2) + align256(H * 2) + align256(cfg.head_dim / 2 * 4);
    if (!cfg.tie_word_embeddings) b += align256(part.vocab * H * 2);
    const size_t layer = align256(H * 2) * 2 + align256(qkv_rows() * H * 2) +
                         (cfg.attention_bias ? align256(qkv_rows() * 2) : 0) +
                         align256(q_cols() * H * 2) + align256(2 * I * H * 2) + align256(I * H * 2);
    return b + layer * cfg.num_hidden_layers;
  }
  template <typename T>
  T* carve(int64_t n) {
    T* p = reinterpret_cast<T*>(static_cast<char*>(weight_mem.get()) + weight_cursor);
    weight_cursor += align256(n * sizeof(T));
    return p;
  }
  void carve_all() {
    const int64_t H = cfg.hidden_size, I = ffn(), V = cfg.vocab_size;
    weight_mem.grow(weight_plan_bytes(), "weights");
    embed = carve<bf16>(V * H);  // whole on every rank (docs/tensor-parallel.md says why)
    final_norm = carve<bf16>(H);
    // A tied head is the embedding's rows of this rank's vocabulary.
    lm_head = cfg.tie_word_embeddings ? embed + part.vocab_begin * H : carve<bf16>(part.vocab * H);
    inv_freq = carve<float>(cfg.head_dim / 2);
    layers_w.resize(cfg.num_hidden_layers);
    for (auto& l : layers_w) {
      l.ln1 = carve<bf16>(H);
      l.ln2 = carve<bf16>(H);
      l.qkv = carve<bf16>(qkv_rows() * H);
      if (cfg.attention_bias) l.qkv_bias = carve<bf16>(qkv_rows());
      l.o = carve<bf16>(q_cols() * H);
      l.gate_up = carve<bf16>(2 * I * H);
      l.down = carve<bf16>(I * H);
    }
    // Float32, as Hugging Face keeps inv_freq; the kernel forms position * inv_freq in float32 too.
    const auto inv64 = rope_inv_freq(cfg);
    const std::vector<float> inv(inv64.begin(), inv64.end());
    rope_scale = static_cast<float>(rope_attention_scaling(cfg));
    check_cuda(cudaMemcpy(inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice),
               "inv_freq");
  }

  // Copies a checkpoint tensor (any float dtype) into dst as bf16, through a device staging
  // buffer in pieces of at most 64 MiB.
  void upload(const TensorInfo& t, bf16* dst, DeviceMemory& staging) {
    const size_t elem = dtype_size(t.dtype);
    const int64_t n = t.numel();
    if (t.dtype == DType::kBFloat16) {
      check_cuda(cudaMemcpy(dst, t.data, t.bytes, cudaMemcpyHostToDevice), "upload");
      return;
    }
    const int64_t piece = (int64_t{64} << 20) / static_cast<int64_t>(elem);
    staging.grow(piece * elem, "staging");
    for (int64_t i = 0; i < n; i += piece) {
      const int64_t m = std::min(piece, n - i);
      check_cuda(cudaMemcpy(staging.get(), static_cast<const char*>(t.data) + i * elem, m * elem,
                            cudaMemcpyHostToDevice),
                 "upload");
      convert_to_bf16(staging.get(), t.dtype, dst + i, m, nullptr);
    }
    check_cuda(cudaDeviceSynchronize(), "convert");
  }

  // This rank's slice of every tensor (model/weight_shard.h; all of each without tensor
  // parallelism). check_weights has checked every shape against the config.
  void load(const Checkpoint& ck) {
    carve_all();
    DeviceMemory staging;
    const RankWeights weights(ck, tp_size(), comm ? comm->rank() : 0);
    auto put = [&](const std::string& name, bf16* dst) {
      upload(weights.tensor(name).info, dst, staging);
    };
    const int64_t H = cfg.hidden_size, I = ffn(), q = q_cols(), kv = kv_cols();
    put("model.embed_tokens.weight", embed);
    put("model.norm.weight", final_norm);
    if (!cfg.tie_word_embeddings) put("lm_head.weight", lm_head);
    for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
      auto name = [&](const char* suffix) { return layer_weight(i, suffix); };
      LayerWeights& l = layers_w[i];
      put(name("input_layernorm.weight"), l.ln1);
      put(name("post_attention_layernorm.weight"), l.ln2);
      // Fused QKV: rows q | k | v of one [q + 2 kv, hidden] matrix, so one GEMM makes all three.
      put(name("self_attn.q_proj.weight"), l.qkv);
      put(name("self_attn.k_proj.weight"), l.qkv + q * H);
      put(name("self_attn.v_proj.weight"), l.qkv + (q + kv) * H);
      if (cfg.attention_bias) {
        put(name("self_attn.q_proj.bias"), l.qkv_bias);
        put(name("self_attn.k_proj.bias"), l.qkv_bias + q);
        put(name("self_attn.v_proj.bias"), l.qkv_bias + q + kv);
      }
      put(name("self_attn.o_proj.weight"), l.o);
      // Fused gate/up: gate rows first (silu_mul reads them so).
      put(name("mlp.gate_proj.weight"), l.gate_up);
      put(name("mlp.up_proj.weight"), l.gate_up + I * H);
      put(name("mlp.down_proj.weight"), l.down);
    }
    check_cuda(cudaDeviceSynchronize(), "load");
    ck.check_unchanged();  // no file was rewritten while its weights were uploaded
  }

  // Under tensor parallelism each rank draws its own slices (a model of the same cost, not the
  // split of the one rank 0 of 1 draws) and the same replicated tensors as every other rank.
  void randomize(uint64_t seed) {
    carve_all();
    const int64_t H = cfg.hidden_size, I = ffn(), q = q_cols();
    const uint64_t rank_mix = comm ? uint64_t(comm->rank()) * 0x9E3779B97F4A7C15ull : 0;
    // Uniform [-a, a] has variance a^2 / 3: a = sqrt(3 / fan_in) keeps each product's output at
    // the input's scale (fan_in: the whole model's, as the all-reduced sum has it).
    auto fill = [&](bf16* p, int64_t n, int64_t fan_in) {
      fill_uniform_bf16(p, n, (seed++) ^ rank_mix, std::sqrt(3.0f / static_cast<float>(fan_in)),
                        0.0f, stream);
    };
    auto ones = [&](bf16* p, int64_t n) { fill_uniform_bf16(p, n, seed++, 0.0f, 1.0f, stream); };
    fill_uniform_bf16(embed, cfg.vocab_size * H, seed++, 1.0f, 0.0f, stream);
    ones(final_norm, H);
    if (!cfg.tie_word_embeddings) fill(lm_head, part.vocab * H, H);
    for (auto& l : layers_w) {
      ones(l.ln1, H);
      ones(l.ln2, H);
      fill(l.qkv, qkv_rows() * H, H);
      if (l.qkv_bias) fill(l.qkv_bias, qkv_rows(), 64);
      fill(l.o, H * q, cfg.q_size());
      fill(l.gate_up, 2 * I * H, H);
      fill(l.down, H * I, cfg.intermediate_size);
    }
    check_cuda(cudaStreamSynchronize(stream), "random weights");
  }

  // --- step buffers ------------------------------------------------------------------------
  bool ensure_tokens(int64_t tokens) {  // true when the buffers moved
    if (tokens <= token_cap) return false;
    const int64_t T = std::max<int64_t>(tokens, 256);
    const int64_t H = cfg.hidden_size, I = ffn();
    const size_t sizes[] = {size_t(T * H),        size_t(T * H),        size_t(T * qkv_rows()),
                            size_t(T * q_cols()), size_t(T * q_cols()), size_t(T * H),
                            size_t(T * 2 * I),    size_t(T * I)};
    size_t total = 0;
    for (size_t s : sizes) total += align256(s * 2);
    check_cuda(cudaStreamSynchronize(stream), "grow");
    act_mem.release();
    act_mem.grow(total, "activations");
    char* p = static_cast<char*>(act_mem.get());
    bf16** dst[] = {&x, &h, &qkv, &q, &attn, &delta, &gu, &act};
    for (int i = 0; i < 8; ++i) {
      *dst[i] = reinterpret_cast<bf16*>(p);
      p += align256(sizes[i] * 2);
    }
    token_cap = T;
    return true;
  }

  bool ensure_samples(int64_t rows) {  // true when the buffers moved
    if (rows <= sample_cap) return false;
    const int64_t S = std::max<int64_t>(rows, 64);
    check_cuda(cudaStreamSynchronize(stream), "grow");
    const size_t hs_b = align256(S * cfg.hidden_size * 2), lg_b = align256(S * cfg.vocab_size * 4);
    const size_t tok_b = align256(S * 4), par_b = align256(S * sizeof(RowSampling));
    // Tensor parallelism: this rank's block of the logits, padded to the gather's block (sent),
    // and every rank's blocks (gathered).
    const size_t sent_b = comm ? align256(S * part.vocab_block * 4) : 0;
    const size_t gathered_b = comm ? align256(tp_size() * S * part.vocab_block * 4) : 0;
    sample_mem.release();
    sample_mem.grow(hs_b + lg_b + tok_b + par_b + sent_b + gathered_b, "sample buffers");
    char* p = static_cast<char*>(sample_mem.get());
    hs = reinterpret_cast<bf16*>(p);
    logits = reinterpret_cast<float*>(p + hs_b);
    tokens_dev = reinterpret_cast<int32_t*>(p + hs_b + lg_b);
    params_dev = reinterpret_cast<RowSampling*>(p + hs_b + lg_b + tok_b);
    p += hs_b + lg_b + tok_b + par_b;
    logits_sent = comm ? reinterpret_cast<float*>(p) : nullptr;
    logits_gathered = comm ? reinterpret_cast<float*>(p + sent_b) : nullptr;
    sample_cap = S;
    return true;
  }

  void* stage(size_t bytes) {
    // The previous step's copy out of the pinned buffer must be done before it is overwritten.
    check_cuda(cudaEventSynchronize(staged), "staging");
    if (bytes > pinned_bytes) {
      if (pinned) cudaFreeHost(pinned);
      pinned_bytes = std::max(bytes, pinned_bytes * 2);
      check_cuda(cudaMallocHost(&pinned, pinned_bytes), "pinned staging");
    }
    return pinned;
  }

  // --- profiling -----------------------------------------------------------------------------
  void mark(const char* stage) {
    if (!profiling) return;
    if (event_next == static_cast<int>(events.size())) {
      cudaEvent_t e;
      check_cuda(cudaEventCreate(&e), "event");
      events.push_back(e);
    }
    check_cuda(cudaEventRecord(events[event_next], stream), "event record");
    if (stage) marks.emplace_back(stage, event_next);
    ++event_next;
  }
  void collect() {
    if (marks.empty()) return;
    check_cuda(cudaStreamSynchronize(stream), "profile");
    for (const auto& [name, end] : marks) {
      float ms = 0;
      cudaEventElapsedTime(&ms, events[end - 1], events[end]);
      totals[name] += ms;
    }
    marks.clear();
    event_next = 0;
  }

  // --- the step ------------------------------------------------------------------------------
  void check_batch(const ForwardBatch& b) const {
    b.validate();
    if (!kv_mem.get()) throw Error(ErrorKind::kInvalidArgument, "kv", "allocate_kv first");
    check_rope_positions(cfg, b.positions);
    for (int32_t id : b.input_ids)
      if (id < 0 || id >= cfg.vocab_size)
        throw Error(ErrorKind::kInvalidArgument, "input_ids",
                    "token id " + std::to_string(id) + " outside the vocabulary of " +
                        std::to_string(cfg.vocab_size));
    const int64_t slots = num_blocks * block_size;
    for (int32_t s : b.slot_mapping)
      if (s >= slots)
        throw Error(ErrorKind::kInvalidArgument, "slot_mapping",
                    "slot " + std::to_string(s) + " outside the pool of " + std::to_string(slots));
    for (int32_t blk : b.block_table)
      if (blk < 0 || blk >= num_blocks)
        throw Error(
            ErrorKind::kInvalidArgument, "block_table",
            "block " + std::to_string(blk) + " outside the pool of " + std::to_string(num_blocks));
  }

  // CUDA graphs of the whole forward (every layer's launches, the attention's included), one per
  // shape of step; model/step_graphs.h decides which steps take one and at how many rows. Between
  // steps of one graph only the index arrays change, and they are copied into the same device
  // buffer before the replay. Any reallocation of a buffer a graph points into drops every graph.
  //   - Decode-only steps: keyed by the batch, the block table's width rounded up to a power of
  //     two and the attention plan's replay key; the table is padded to that width and the
  //     attention planned for replay at the width's keys (max_seqlen_k its capacity, an upper
  //     bound the contract allows; the kernels stop at seqused_k): split for that bound, so a
  //     replay may split the keys otherwise than an eager step would, and by length where the
  //     step's lengths are unequal (attention/cuda/plan.h DecodeBalance), which the key tells
  //     apart (at most two graphs a batch and width).
  //   - Mixed steps (prefill chunks, with or without decodes) of up to mixed_max_tokens tokens:
  //     the rows padded to the token bucket (padding rows: token 0 at position 0, KV slot -1, which
  //     rope_kv_write skips, in no sequence of cu_seqlens_q, and never a sample row; every kernel
  //     but attention works row by row and attention never reads them, so they touch no real row
  //     and no cache slot), the attention planned from the step's own lengths and widened to the
  //     bounds (StepAttentionTensors::for_replay), and keyed by the padded rows, the sequences,
  //     the sample rows, the width bucket and the plan's replay key. A replay then computes every
  //     real row as the eager step does, bit for bit: the same kernels, splits and tiles on the
  //     same rows, and GEMMs whose algorithm is that of the unpadded row count (the token buckets
  //     are the GEMM's tuning buckets). A key is captured the kMixedCaptureAfter-th time it comes
  //     (until then its steps run eagerly, padded).
  // At most kMaxDecodeGraphs decode and kMaxMixedGraphs mixed graphs are kept, the least recently
  // replayed of the kind dropped first (step_graphs.h says why).
  struct GraphKey {
    StepGraphKind kind = StepGraphKind::kDecode;
    int64_t rows = 0, batch = 0, samples = 0, width = 0;
    std::string attention;  // the step's attention plan's replay_key()
    bool operator<(const GraphKey& o) const {
      return std::tie(kind, rows, batch, samples, width, attention) <
             std::tie(o.kind, o.rows, o.batch, o.samples, o.width, o.attention);
    }
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int64_t last_used = 0;  // the step count of its last replay (mixed graphs' eviction)
  };
  std::map<GraphKey, Graph> graphs;
  std::map<GraphKey, int> sightings;  // mixed keys without a graph: times seen
  bool use_graphs = true;
  bool pdl = false;            // the runner's kernels with programmatic dependent launch
  bool pdl_attention = false;  // and the attention's, where pdl (DecodeKernelOptions)
  bool early_weights = false;  // the GEMV's first weights before its wait, silu with pdl, where pdl
  DecodeFusion fusion;         // small steps' fused kernels (model/decode_kernels.h)
  int64_t mixed_max_tokens = StepGraphOptions{}.mixed_max_tokens;
  int64_t graph_replays = 0, graph_captures = 0, mixed_replays = 0, mixed_captures = 0;
  int64_t steps = 0;

  void drop_graphs() {
    for (auto& [k, g] : graphs) cudaGraphExecDestroy(g.exec);
    graphs.clear();
  }

  // What a step's layers read: device index arrays and the step's attention, planned once.
  struct Step {
    int64_t T = 0, S = 0;  // rows (padded for a mixed graph) and sample rows
    const int32_t *ids = nullptr, *pos = nullptr, *slots = nullptr, *rows = nullptr;
    StepAttention attention;
  };

  // The calling thread's current device: a tensor-parallel runner calls its ranks from threads of
  // its own, and from one thread in turn.
  void use_device() const { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }

  void forward(const ForwardBatch& b) {
    use_device();
    check_batch(b);
    collect();
    ++steps;
    const int64_t B = b.batch, S = static_cast<int64_t>(b.sample_rows.size());
    StepGraphOptions go;
    go.graphs = use_graphs && !profiling;
    go.mixed_max_tokens = mixed_max_tokens;
    const StepGraphShape shape = step_graph_shape(b, go);
    const int64_t T = shape.rows, width = shape.width;  // T >= total_q: padded rows after them
    bool moved = ensure_tokens(T);
    moved |= ensure_samples(S);
    last_samples = S;

    // One staging copy of every index array, each at a 16-byte aligned offset. The token arrays
    // take T entries (padding rows: token 0, position 0, slot -1); the block table is written
    // `width` entries per row (padding repeats the row's first block).
    const std::vector<int32_t>* arrays[] = {&b.input_ids,    &b.positions, &b.slot_mapping,
                                            &b.cu_seqlens_q, &b.seqused_k, &b.block_table,
                                            &b.sample_rows};
    const size_t sizes[] = {
        size_t(T),          size_t(T),         size_t(T),           b.cu_seqlens_q.size(),
        b.seqused_k.size(), size_t(B * width), b.sample_rows.size()};
    size_t offsets[7], total = 0;
    for (int i = 0; i < 7; ++i) {
      offsets[i] = total;
      total += (sizes[i] + 3) / 4 * 4;
    }
    // Rare growth; cudaFree inside waits for the device, so no step still reads the old buffer.
    moved |= idx_mem.grow(std::max<size_t>(total, 1024) * 4 * 2, "index arrays");
    int32_t* host = static_cast<int32_t*>(stage(total * 4));
    for (int i = 0; i < 7; ++i)
      if (i != 5 && !arrays[i]->empty())
        std::memcpy(host + offsets[i], arrays[i]->data(), arrays[i]->size() * 4);
    for (int i = 0; i < 3; ++i)
      std::fill(host + offsets[i] + b.total_q, host + offsets[i] + T, i == 2 ? -1 : 0);
    for (int64_t r = 0; r < B && b.pages_per_seq > 0; ++r) {
      int32_t* row = host + offsets[5] + r * width;
      const int32_t* src = b.block_table.data() + r * b.pages_per_seq;
      std::memcpy(row, src, b.pages_per_seq * 4);
      for (int64_t j = b.pages_per_seq; j < width; ++j) row[j] = src[0];
    }
    int32_t* dev = static_cast<int32_t*>(idx_mem.get());
    mark(nullptr);
    check_cuda(cudaMemcpyAsync(dev, host, total * 4, cudaMemcpyHostToDevice, stream), "indices");
    check_cuda(cudaEventRecord(staged, stream), "event");

    Step st;
    st.T = T;
    st.S = S;
    st.ids = dev + offsets[0];
    st.pos = dev + offsets[1];
    st.slots = dev + offsets[2];
    st.rows = dev + offsets[6];
    const int32_t hq = q_heads(), hkv = kv_heads();
    const int32_t d = static_cast<int32_t>(cfg.head_dim);
    const Device gpu{DeviceType::kCUDA, device};
    StepAttentionTensors at;
    at.q = make_view(q, DType::kBFloat16, {T, hq, d}, gpu);
    at.out = make_view(attn, DType::kBFloat16, {T, hq, d}, gpu);
    at.kv_pool = make_view(kv_mem.get(), kv_fp8 ? DType::kFloat8E4M3 : DType::kBFloat16,
                           {num_blocks, block_size, hkv, d}, gpu);
    at.cu_seqlens_q = dev + offsets[3];
    at.seqused_k = dev + offsets[4];
    at.block_table = dev + offsets[5];
    at.table_width = width;
    // A graph replays its plan at any lengths its key's width holds: a decode graph's plan splits
    // for that bound (by length or not as the step's lengths say, which its key holds); a mixed
    // graph's is the step's own, widened to the bounds. Eager steps plan from their own lengths.
    at.kv_bound = shape.kind == StepGraphKind::kEager ? 0 : width * block_size;
    at.for_replay = shape.kind != StepGraphKind::kEager;
    at.q_bound = shape.kind == StepGraphKind::kMixed ? T : at.for_replay ? 1 : 0;
    at.num_splits = 0;  // the attention layer's split policy (attention/split_policy.h)
    at.programmatic_launch = pdl && pdl_attention;
    at.stream = stream;
    st.attention = StepAttention(cfg, b, at);
    // The plan depends only on the step's shapes, the same for every layer: one workspace a step.
    const size_t ws = st.attention.workspace_bytes();
    if (ws > attn_ws.bytes()) {
      check_cuda(cudaStreamSynchronize(stream), "grow");
      attn_ws.release();
      attn_ws.grow(ws, "attention workspace");
      moved = true;
    }
    st.attention.set_workspace(attn_ws.get(), attn_ws.bytes());
    if (moved) drop_graphs();

    if (shape.kind == StepGraphKind::kEager) return layers(st);
    GraphKey key;
    key.kind = shape.kind;
    key.rows = T;
    key.batch = B;
    key.samples = S;
    key.width = width;
    key.attention = st.attention.replay_key();
    auto it = graphs.find(key);
    if (it != graphs.end()) {
      check_cuda(cudaGraphLaunch(it->second.exec, stream), "graph launch");
      it->second.last_used = steps;
      ++graph_replays;
      if (shape.kind == StepGraphKind::kMixed) ++mixed_replays;
      return;
    }
    // A mixed key's first sightings run eagerly, padded (the same results as its graph's).
    if (shape.kind == StepGraphKind::kMixed) {
      if (sightings.size() > 4096) sightings.clear();
      if (++sightings[key] < kMixedCaptureAfter) return layers(st);
      sightings.erase(key);
    }
    // Run it eagerly (GEMM plans and kernel modules get loaded outside any capture), then capture
    // the same launches for the next steps.
    layers(st);
    capture(key, st);
  }

  void capture(const GraphKey& key, const Step& st) {
    const bool mixed = key.kind == StepGraphKind::kMixed;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
      try {
        layers(st);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "cuda runner: capture failed (%s)\n", ex.what());
      }
      e = cudaStreamEndCapture(stream, &graph);
    }
    if (e == cudaSuccess && graph) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e != cudaSuccess || !exec) {
      // Something in the step cannot be captured: run every step of its kind eagerly from now on.
      std::fprintf(stderr, "cuda runner: %s graphs off (%s)\n", mixed ? "mixed-step" : "decode",
                   cudaGetErrorString(e));
      cudaGetLastError();
      if (mixed)
        mixed_max_tokens = 0;
      else
        use_graphs = false;
      return;
    }
    // The bound on each kind's graphs: the least recently replayed of the kind goes.
    int held = 0;
    auto oldest = graphs.end();
    for (auto g = graphs.begin(); g != graphs.end(); ++g) {
      if (g->first.kind != key.kind) continue;
      ++held;
      if (oldest == graphs.end() || g->second.last_used < oldest->second.last_used) oldest = g;
    }
    if (held >= (mixed ? kMaxMixedGraphs : kMaxDecodeGraphs)) {
      cudaGraphExecDestroy(oldest->second.exec);
      graphs.erase(oldest);
    }
    if (mixed) ++mixed_captures;
    graphs.emplace(key, Graph{exec, steps});
    ++graph_captures;
  }

  // Tensor parallelism: the sum over ranks of a row-parallel product's partial sums (o, down),
  // in place, before it is added to the residual stream.
  void all_reduce(bf16* partial, int64_t rows) {
    if (!comm) return;
    comm->all_reduce_sum(partial, rows * cfg.hidden_size, DType::kBFloat16);
    mark("all_reduce");
  }

  // logits = the sample rows' normalized states (hs) times the LM head: this rank's vocabulary
  // block, all-gathered under tensor parallelism (every rank sends a block of vocab_block
  // columns a row, the last rank's padded, and keeps the columns each rank's vocabulary covers).
  void lm_head_logits(int64_t S) {
    const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
    if (!comm) {
      gemm->run(hs, lm_head, logits, true, S, V, H, stream);
      return mark("lm_head");
    }
    if (S == 0) return;  // on every rank alike: the same batch
    const int64_t block = part.vocab_block, n = tp_size();
    // A block shorter than the gather's (the last rank's) is made apart and copied into the
    // padded one (its padding is sent, never kept).
    const bool padded = part.vocab < block;
    if (part.vocab > 0)
      gemm->run(hs, lm_head, padded ? logits_gathered : logits_sent, true, S, part.vocab, H,
                stream);
    mark("lm_head");
    if (padded && part.vocab > 0)
      check_cuda(cudaMemcpy2DAsync(logits_sent, block * 4, logits_gathered, part.vocab * 4,
                                   part.vocab * 4, S, cudaMemcpyDeviceToDevice, stream),
                 "logits block");
    comm->all_gather(logits_sent, logits_gathered, S * block, DType::kFloat32);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t begin = std::min(V, r * block), count = std::min(V, begin + block) - begin;
      if (count > 0)
        check_cuda(cudaMemcpy2DAsync(logits + begin, V * 4, logits_gathered + r * S * block,
                                     block * 4, count * 4, S, cudaMemcpyDeviceToDevice, stream),
                   "logits gather");
    }
    mark("logits_gather");
  }

  void layers(const Step& st) {
    const int64_t T = st.T, H = cfg.hidden_size, I = ffn();
    const float eps = static_cast<float>(cfg.rms_norm_eps);
    const int32_t hkv = kv_heads();
    const int32_t d = static_cast<int32_t>(cfg.head_dim);
    const int64_t layer_kv_bytes = num_blocks * block_size * hkv * d * kv_elem_bytes();
    const float* k_scale_all = static_cast<const float*>(kv_scale_mem.get());

    // Steps of a few tokens may take the fused GEMV (model/decode_kernels.h); with the norm fused,
    // the o and down products add into x themselves and delta is unused.
    const DecodeFusion fuse = fusion.for_step(T, H);
    auto residual_product = [&](const bf16* in, const bf16* w, int64_t rows, int64_t k) {
      FusedGemvArgs g;
      g.x = in;
      g.w = w;
      g.y = x;
      g.add_to_y = true;
      g.m = rows;
      g.n = H;
      g.k = k;
      fused_gemv(g, stream, pdl);
    };
    embed_tokens(embed, st.ids, x, T, H, cfg.vocab_size, stream);
    mark("embedding");
    for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
      const LayerWeights& l = layers_w[li];
      char* k_cache = static_cast<char*>(kv_mem.get()) + 2 * li * layer_kv_bytes;
      char* v_cache = k_cache + layer_kv_bytes;
      // fp8: this layer's scales, K's then V's (allocate_kv uploaded them).
      const float* k_scale = kv_fp8 ? k_scale_all + li * hkv : nullptr;
      const float* v_scale = kv_fp8 ? k_scale_all + (cfg.num_hidden_layers + li) * hkv : nullptr;
      if (fuse.norm) {
        // x already holds the residual stream (the down product before added its output): the
        // norm is the product's prologue.
        FusedGemvArgs g;
        g.x = x;
        g.norm_weight = l.ln1;
        g.eps = eps;
        g.w = l.qkv;
        g.bias = l.qkv_bias;  // added before the one rounding, as cuBLASLt's epilogue does
        g.y = qkv;
        g.m = T;
        g.n = qkv_rows();
        g.k = H;
        fused_gemv(g, stream, pdl);
        mark("gemm_qkv");
      } else {
        add_rmsnorm(li == 0 ? nullptr : delta, x, l.ln1, h, nullptr, T, H, eps, stream, pdl);
        mark("rmsnorm");
      }
      // Qwen2's q/k/v bias goes in the GEMM's epilogue (one bf16 rounding of x W^T + b, as
      // Hugging Face's bf16 Linear); the RoPE kernel adds it only where cuBLASLt cannot.
      const bool bias_done = fuse.norm || (l.qkv_bias && gemm->run_bias(h, l.qkv, l.qkv_bias, qkv,
                                                                        T, qkv_rows(), H, stream));
      if (!bias_done) gemm->run(h, l.qkv, qkv, false, T, qkv_rows(), H, stream);
      if (!fuse.norm) mark("gemm_qkv");
      RopeKvArgs ra;
      ra.qkv = qkv;
      ra.bias = bias_done ? nullptr : l.qkv_bias;
      ra.positions = st.pos;
      ra.slot_mapping = st.slots;
      ra.inv_freq = inv_freq;
      ra.rope_scale = rope_scale;
      ra.q_out = q;
      if (kv_fp8) {
        ra.k_cache8 = reinterpret_cast<uint8_t*>(k_cache);
        ra.v_cache8 = reinterpret_cast<uint8_t*>(v_cache);
        ra.k_scale = k_scale;
        ra.v_scale = v_scale;
      } else {
        ra.k_cache = reinterpret_cast<bf16*>(k_cache);
        ra.v_cache = reinterpret_cast<bf16*>(v_cache);
      }
      ra.n_tokens = T;
      ra.heads = q_heads();
      ra.kv_heads = hkv;
      ra.head_dim = d;
      rope_kv_write(ra, stream, pdl);
      mark("rope_kv_write");
      st.attention.run(li, k_cache, v_cache, k_scale, v_scale);
      mark("attention");
      if (fuse.norm) {
        residual_product(attn, l.o, T, q_cols());  // x += attn o^T
        mark("gemm_o");
      } else {
        gemm->run(attn, l.o, delta, false, T, H, q_cols(), stream);
        mark("gemm_o");
        all_reduce(delta, T);
        add_rmsnorm(delta, x, l.ln2, h, nullptr, T, H, eps, stream, pdl);
        mark("rmsnorm");
      }
      if (fuse.any()) {
        // The gate/up product through the fused GEMV: normalized in its prologue (fuse.norm,
        // else from h), and with silu in its epilogue (fuse.silu, else into gu for silu_mul).
        FusedGemvArgs g;
        g.x = fuse.norm ? x : h;
        g.norm_weight = fuse.norm ? l.ln2 : nullptr;
        g.eps = eps;
        g.w = l.gate_up;
        g.silu = fuse.silu;
        g.y = fuse.silu ? act : gu;
        g.m = T;
        g.n = fuse.silu ? I : 2 * I;
        g.k = H;
        fused_gemv(g, stream, pdl);
      } else {
        gemm->run(h, l.gate_up, gu, false, T, 2 * I, H, stream);
      }
      mark("gemm_gate_up");
      if (!fuse.silu) {
        silu_mul(gu, act, T, I, stream, pdl && early_weights);
        mark("silu_mul");
      }
      if (fuse.norm) {
        residual_product(act, l.down, T, I);  // x += act down^T
      } else {
        gemm->run(act, l.down, delta, false, T, H, I, stream);
      }
      mark("gemm_down");
      if (!fuse.norm) all_reduce(delta, T);  // added by the next layer's norm (or the last one)
    }
    // The last residual add and norm for the sample rows only, gathered; then their logits.
    add_rmsnorm(fuse.norm ? nullptr : delta, x, final_norm, hs, st.rows, st.S, H, eps, stream, pdl);
    mark("rmsnorm");
    lm_head_logits(st.S);
  }
};

CudaRunner::CudaRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaRunner::~CudaRunner() = default;

std::unique_ptr<CudaRunner> CudaRunner::load(const std::string& dir, int device,
                                             Communicator* comm) {
  const Checkpoint ck = Checkpoint::open(dir);
  check_cuda_supports(ck.config());
  // The whole directory against the config, as the CPU runner checks it: load() reads only the
  // tensors the config names, so a checkpoint with more layers than config.json (or any other
  // tensor the model would not use) was served silently as a smaller model.
  check_weights(ck);
  auto impl = std::make_unique<Impl>();
  impl->set_model(ck.config(), comm);
  impl->init(device);
  impl->load(ck);
  return std::unique_ptr<CudaRunner>(new CudaRunner(std::move(impl)));
}

std::unique_ptr<CudaRunner> CudaRunner::random(const ModelConfig& config, uint64_t seed, int device,
                                               Communicator* comm) {
  config.validate();
  check_cuda_supports(config);
  auto impl = std::make_unique<Impl>();
  impl->set_model(config, comm);
  impl->init(device);
  impl->randomize(seed);
  return std::unique_ptr<CudaRunner>(new CudaRunner(std::move(impl)));
}

const ModelConfig& CudaRunner::config() const {
  return impl_->cfg;
}

void CudaRunner::allocate_kv(int64_t num_blocks, int32_t block_size) {
  if (num_blocks <= 0 || block_size <= 0)
    throw Error(ErrorKind::kInvalidArgument, "num_blocks",
                "the KV pool needs a positive number of blocks and block size");
  Impl& m = *impl_;
  m.use_device();
  check_cuda(cudaStreamSynchronize(m.stream), "allocate_kv");
  m.drop_graphs();
  m.kv_mem.release();
  m.kv_mem.grow(size_t(2) * m.cfg.num_hidden_layers * num_blocks * block_size * m.kv_heads() *
                    m.cfg.head_dim * m.kv_elem_bytes(),
                "KV pool");
  if (m.kv_fp8) {
    std::vector<float> scales(m.k_scales);
    scales.insert(scales.end(), m.v_scales.begin(), m.v_scales.end());
    m.kv_scale_mem.grow(scales.size() * sizeof(float), "KV cache scales");
    check_cuda(cudaMemcpy(m.kv_scale_mem.get(), scales.data(), scales.size() * sizeof(float),
                          cudaMemcpyHostToDevice),
               "KV cache scales");
  }
  m.num_blocks = num_blocks;
  m.block_size = block_size;
}

void CudaRunner::set_kv_cache(const KvCacheConfig& kv) {
  Impl& m = *impl_;
  // Its own KV heads' scales (the tensor-parallel runner hands each rank those).
  const size_t pairs = static_cast<size_t>(m.cfg.num_hidden_layers * m.kv_heads());
  check_kv_cache_config(kv, pairs);
  refuse_cuda_fp8_kv_cache_if_off(kv.dtype, std::getenv("FLASHSERVE_CUDA_FP8_KV"));
  m.use_device();
  check_cuda(cudaStreamSynchronize(m.stream), "set_kv_cache");
  // A pool of the old element size must not be read as the new one: dropped, with the graphs
  // that captured its pointers (allocate_kv again before the next forward).
  m.drop_graphs();
  m.kv_mem.release();
  m.num_blocks = 0;
  m.kv_fp8 = kv.dtype == KvCacheDtype::kFp8E4M3;
  m.k_scales = kv.k_scales.empty() ? std::vector<float>(pairs, 1.0f) : kv.k_scales;
  m.v_scales = kv.v_scales.empty() ? std::vector<float>(pairs, 1.0f) : kv.v_scales;
}

void CudaRunner::forward(const ForwardBatch& batch) {
  impl_->forward(batch);
}

void CudaRunner::prepare(int64_t max_tokens, int64_t max_rows) {
  Impl& m = *impl_;
  if (max_tokens <= 0 || max_rows <= 0) return;
  m.use_device();
  // A mixed step of max_tokens runs its graph at its token bucket's rows (model/step_graphs.h).
  const int64_t rows = max_tokens <= m.mixed_max_tokens ? token_bucket(max_tokens) : max_tokens;
  bool moved = m.ensure_tokens(rows);
  moved |= m.ensure_samples(max_rows);
  if (moved) m.drop_graphs();  // as forward() does: graphs hold the old buffers' addresses
  // Every layer has the same shapes: layer 0's weights stand for all (zeros in, results dropped).
  const int64_t H = m.cfg.hidden_size, I = m.ffn();
  check_cuda(cudaMemsetAsync(m.act_mem.get(), 0, m.act_mem.bytes(), m.stream), "prepare");
  check_cuda(cudaMemsetAsync(m.hs, 0, size_t(max_rows) * H * 2, m.stream), "prepare");
  const LayerWeights& l = m.layers_w[0];
  m.gemm->warm(m.h, l.qkv, l.qkv_bias, m.qkv, false, max_tokens, m.qkv_rows(), H, m.stream);
  m.gemm->warm(m.attn, l.o, nullptr, m.delta, false, max_tokens, H, m.q_cols(), m.stream);
  m.gemm->warm(m.h, l.gate_up, nullptr, m.gu, false, max_tokens, 2 * I, H, m.stream);
  m.gemm->warm(m.act, l.down, nullptr, m.delta, false, max_tokens, H, I, m.stream);
  if (!m.comm)
    m.gemm->warm(m.hs, m.lm_head, nullptr, m.logits, true, max_rows, m.cfg.vocab_size, H, m.stream);
  else if (m.part.vocab > 0)  // this rank's block (lm_head_logits)
    m.gemm->warm(m.hs, m.lm_head, nullptr, m.logits_sent, true, max_rows, m.part.vocab, H,
                 m.stream);
  check_cuda(cudaStreamSynchronize(m.stream), "prepare");
}

std::vector<float> CudaRunner::logits() const {
  Impl& m = *impl_;
  m.use_device();
  std::vector<float> out(static_cast<size_t>(m.last_samples * m.cfg.vocab_size));
  if (!out.empty())
    check_cuda(
        cudaMemcpyAsync(out.data(), m.logits, out.size() * 4, cudaMemcpyDeviceToHost, m.stream),
        "logits");
  check_cuda(cudaStreamSynchronize(m.stream), "logits");
  return out;
}

// One copy per row asked for, from the logits buffer the last forward left (and sample() read):
// nothing crosses to the host for requests that did not ask for logprobs.
std::vector<float> CudaRunner::logits_rows(const std::vector<int32_t>& rows) const {
  Impl& m = *impl_;
  m.use_device();
  const int64_t V = m.cfg.vocab_size;
  std::vector<float> out(rows.size() * static_cast<size_t>(V));
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= m.last_samples)
      throw Error(ErrorKind::kInvalidArgument, "rows",
                  std::to_string(rows[i]) + " is not a sample row of the last forward (" +
                      std::to_string(m.last_samples) + ")");
    check_cuda(cudaMemcpyAsync(out.data() + i * V, m.logits + int64_t{rows[i]} * V, V * 4,
                               cudaMemcpyDeviceToHost, m.stream),
               "logits rows");
  }
  check_cuda(cudaStreamSynchronize(m.stream), "logits rows");
  return out;
}

std::vector<int32_t> CudaRunner::sample(const ForwardBatch& batch,
                                        const std::vector<SamplingParams>& params,
                                        const std::vector<LogitsAdjust>& adjust) {
  Impl& m = *impl_;
  m.use_device();
  const int64_t S = static_cast<int64_t>(batch.sample_rows.size());
  if (S != m.last_samples || static_cast<int64_t>(params.size()) != S)
    throw Error(ErrorKind::kInvalidArgument, "params",
                "one SamplingParams per sample row of the last forward (" +
                    std::to_string(m.last_samples) + "), got " + std::to_string(params.size()));
  if (!adjust.empty() && static_cast<int64_t>(adjust.size()) != S)
    throw Error(ErrorKind::kInvalidArgument, "adjust",
                "one LogitsAdjust per sample row (" + std::to_string(S) + "), got " +
                    std::to_string(adjust.size()));
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  if (S == 0) return tokens;
  const int64_t V = m.cfg.vocab_size, words = (V + 31) / 32;
  // One staging of everything the step's sampling reads: the rows' parameters, then (when any
  // row has adjustments) their token lists' offsets, the lists, and the masks.
  int64_t entries = 0;
  bool masks = false;
  for (const LogitsAdjust& a : adjust) {
    entries += static_cast<int64_t>(a.tokens.size());
    masks |= !a.allowed.empty();
  }
  const size_t par_b = align256(S * sizeof(RowSampling)), off_b = align256((S + 1) * 8);
  const size_t tok_b = align256(std::max<int64_t>(entries, 1) * sizeof(TokenAdjust));
  const size_t mask_b = masks ? align256(S * words * 4) : 0;
  const size_t adj_b = adjust.empty() ? 0 : off_b + tok_b + mask_b;
  char* staged = static_cast<char*>(m.stage(par_b + adj_b));
  auto* host = reinterpret_cast<RowSampling*>(staged);
  for (int64_t i = 0; i < S; ++i) {
    params[i].validate();
    host[i].temperature = params[i].temperature;
    host[i].top_k = params[i].top_k;
    host[i].top_p = params[i].top_p;
    host[i].min_p = params[i].min_p;
    host[i].seed = params[i].seed;
    host[i].position = int64_t{batch.positions[batch.sample_rows[i]]} + 1;
  }
  check_cuda(cudaMemcpyAsync(m.params_dev, host, S * sizeof(RowSampling), cudaMemcpyHostToDevice,
                             m.stream),
             "sampling params");
  const float* logits = m.logits;
  if (!adjust.empty()) {
    char* h = staged + par_b;
    auto* offsets = reinterpret_cast<int64_t*>(h);
    auto* list = reinterpret_cast<TokenAdjust*>(h + off_b);
    auto* allowed = reinterpret_cast<uint32_t*>(h + off_b + tok_b);
    offsets[0] = 0;
    for (int64_t i = 0; i < S; ++i) {
      const LogitsAdjust& a = adjust[i];
      std::copy(a.tokens.begin(), a.tokens.end(), list + offsets[i]);
      offsets[i + 1] = offsets[i] + static_cast<int64_t>(a.tokens.size());
      if (!masks) continue;
      if (a.allowed.empty())
        std::fill_n(allowed + i * words, words, ~0u);
      else
        std::copy_n(a.allowed.begin(), words, allowed + i * words);
    }
    // The adjusted copy of the logits and the lists, grown to the largest step seen.
    const size_t copy_b = align256(S * V * 4);
    if (copy_b + adj_b > m.adjust_mem.bytes())
      m.adjust_mem.grow(std::max(copy_b + adj_b, 2 * m.adjust_mem.bytes()), "logits adjustments");
    char* d = static_cast<char*>(m.adjust_mem.get());
    check_cuda(cudaMemcpyAsync(d + copy_b, h, adj_b, cudaMemcpyHostToDevice, m.stream),
               "logits adjustments");
    DeviceAdjust da;
    da.offsets = reinterpret_cast<const int64_t*>(d + copy_b);
    da.tokens = reinterpret_cast<const TokenAdjust*>(d + copy_b + off_b);
    da.allowed = masks ? reinterpret_cast<const uint32_t*>(d + copy_b + off_b + tok_b) : nullptr;
    adjust_logits(m.logits, reinterpret_cast<float*>(d), da, S, V, m.stream);
    logits = reinterpret_cast<const float*>(d);
  }
  check_cuda(cudaEventRecord(m.staged, m.stream), "event");
  sample_tokens(logits, m.params_dev, m.tokens_dev, S, V, m.stream);
  m.mark("sample");
  check_cuda(cudaMemcpyAsync(tokens.data(), m.tokens_dev, S * 4, cudaMemcpyDeviceToHost, m.stream),
             "tokens");
  check_cuda(cudaStreamSynchronize(m.stream), "sample");
  return tokens;
}

void* CudaRunner::stream() const {
  return impl_->stream;
}
void CudaRunner::synchronize() const {
  impl_->use_device();
  check_cuda(cudaStreamSynchronize(impl_->stream), "synchronize");
}

int64_t CudaRunner::weight_bytes() const {
  const Impl& m = *impl_;
  const ModelConfig& c = m.cfg;
  const int64_t layer = c.hidden_size * (m.qkv_rows() + m.q_cols() + 3 * m.ffn());
  return 2 * (c.num_hidden_layers * layer + m.part.vocab * c.hidden_size);
}

void CudaRunner::set_gemv_rows(int64_t rows) {
  impl_->gemm->set_gemv_rows(rows);
  impl_->drop_graphs();  // graphs hold the launches of the other path
}

void CudaRunner::set_attention_pdl(bool on) {
  impl_->pdl_attention = on;
  impl_->drop_graphs();  // graphs hold the launches of the other path
}

void CudaRunner::set_early_weights(bool on) {
  impl_->early_weights = on;
  impl_->gemm->set_early_weights(impl_->pdl && on);
  impl_->drop_graphs();  // graphs hold the launches of the other path
}

void CudaRunner::set_decode_fusion(bool norm, bool silu) {
  const DecodeFusion before = impl_->fusion;
  impl_->fusion.norm = norm;
  impl_->fusion.silu = silu;
  try {
    impl_->refuse_fused_norm("decode_fusion");
  } catch (...) {
    impl_->fusion = before;
    throw;
  }
  impl_->drop_graphs();  // graphs hold the launches of the other path
}

void CudaRunner::set_cuda_graphs(bool on) {
  if (on && impl_->comm && !impl_->comm->capturable())
    throw Error(ErrorKind::kUnsupported, "cuda_graphs",
                "this rank's communicator waits on the host: its steps cannot be captured");
  impl_->use_graphs = on;
  if (!on) impl_->drop_graphs();
}

std::pair<int64_t, int64_t> CudaRunner::graph_counts() const {
  return {impl_->graph_captures, impl_->graph_replays};
}

void CudaRunner::set_mixed_graph_tokens(int64_t max_tokens) {
  if (max_tokens > 0 && impl_->comm && !impl_->comm->capturable())
    throw Error(ErrorKind::kUnsupported, "mixed_graph_tokens",
                "this rank's communicator waits on the host: its steps cannot be captured");
  impl_->mixed_max_tokens = std::max<int64_t>(0, max_tokens);
}

std::pair<int64_t, int64_t> CudaRunner::mixed_graph_counts() const {
  return {impl_->mixed_captures, impl_->mixed_replays};
}

std::pair<const void*, size_t> CudaRunner::kv_pool() const {
  return {impl_->kv_mem.get(), impl_->kv_mem.bytes()};
}

void CudaRunner::set_profiling(bool on) {
  impl_->collect();
  impl_->profiling = on;
}

std::map<std::string, double> CudaRunner::profile() {
  impl_->collect();
  auto t = std::move(impl_->totals);
  impl_->totals.clear();
  return t;
}

}  // namespace flashserve::model::cuda

namespace flashserve::model {

namespace {

// GPUs first .. first + size - 1.
std::vector<int> rank_devices(int first, int size) {
  std::vector<int> devices;
  for (int r = 0; r < size; ++r) devices.push_back(first + r);
  return devices;
}

// Rank r on device first + r, NCCL between them, each rank made by make_rank(comm, device). The
// devices are checked before this reads a model (check_nccl_devices), the split here, both
// refused by name before any rank loads.
template <class MakeRank>
std::unique_ptr<ModelRunner> cuda_ranks(const ModelConfig& config, int first, int size,
                                        MakeRank make_rank) {
  check_tensor_parallel(config, size);
  const std::vector<int> devices = rank_devices(first, size);
  auto group = make_nccl_group(devices);
  std::vector<std::unique_ptr<ModelRunner>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(make_rank(&group->rank(r), devices[r]));
  return make_tensor_parallel_runner(std::move(group), std::move(ranks));
}

}  // namespace

std::unique_ptr<ModelRunner> make_cuda_runner(const std::string& dir, int device,
                                              int tensor_parallel_size) {
  if (tensor_parallel_size == 1) return cuda::CudaRunner::load(dir, device);
  check_nccl_devices(rank_devices(device, tensor_parallel_size));  // before the model is read
  return cuda_ranks(
      Checkpoint::open(dir).config(), device, tensor_parallel_size,
      [&](Communicator* comm, int d) { return cuda::CudaRunner::load(dir, d, comm); });
}

std::unique_ptr<ModelRunner> make_random_cuda_runner(const ModelConfig& config, uint64_t seed,
                                                     int device, int tensor_parallel_size) {
  if (tensor_parallel_size == 1) return cuda::CudaRunner::random(config, seed, device);
  check_nccl_devices(rank_devices(device, tensor_parallel_size));
  return cuda_ranks(config, device, tensor_parallel_size, [&](Communicator* comm, int d) {
    return cuda::CudaRunner::random(config, seed, d, comm);
  });
}

}  // namespace flashserve::model
