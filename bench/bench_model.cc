// bench_model: the CUDA model runner at a real model's shape with random weights generated in
// device memory (writing and reading 14.5 GB of mistral-7b checkpoint would cost more device time
// than the whole benchmark). Prints, from one run on one GPU:
//   * the device-to-device copy bandwidth (bytes read + written per second) and, from it, the
//     weight-read floor of a decode step (the bf16 weights a step reads, once) and the floor of a
//     batch-32 step (weights + the batch's K/V);
//   * decode steps at batch 1 and 32 with a 1k context, wall-clock per step as the engine sees it
//     (forward + greedy sample + the token ids back on the host), against those floors;
//   * prefill of one 4096-token prompt (forward + sample), TFLOP/s counting 2 * parameters *
//     tokens + causal attention (the count shared/anchors/h200-transformers.md uses);
//   * the per-stage breakdown of each (CUDA events around every stage of every layer).
// With --mixed, only mixed steps (issue 21): at a token budget, D decodes over `context` keys
// each plus one chunk of budget - D tokens after `context` cached keys, wall clock per step
// (forward + sample) replayed from the mixed-step CUDA graphs and run eagerly, D from 0 to 256.
//
//   bench_model [--shape mistral-7b] [--context 1024] [--prefill 4096] [--steps 30] [--quick]
//   bench_model --mixed [--budget 512] [--decodes 0,1,16,64,128,256] [--context 1024]
// With --fuse-ab, only small decode steps (issue 21) with and without the fused decode kernels
// (model/decode_kernels.h DecodeFusion: FLASHSERVE_FUSE_NORM, FLASHSERVE_FUSE_SILU), in one
// process: the default, cuBLASLt unfused, the GEMV for one row and for up to 4 (the same sums as
// the fused kernels), silu fused, norm fused, both, and the decode attention's splits merged in
// a thread-block cluster (FLASHSERVE_DECODE_CLUSTER), and the attention's kernels launched
// programmatically or not, the default's other way (FLASHSERVE_PDL_ATTENTION,
// CudaRunner::set_attention_pdl), the GEMV's first weights before its wait and silu launched
// programmatically (FLASHSERVE_EARLY_WEIGHTS, CudaRunner::set_early_weights), alone and with
// the attention's PDL; the modes alternate within each round
// (the order rotated), every timing from the same `context` keys, graphs on; medians over the
// rounds.
//   bench_model --fuse-ab [--batches 1,4] [--rounds 7] [--steps 30] [--context 1024]
// With --tensor-parallel-size N (issue 26; N GPUs), only the scaling: decode steps at batch 1 and
// 32 and one prefill, wall clock per step, on GPU 0 alone and split over GPUs 0 .. N-1
// (make_random_cuda_runner's ranks, NCCL between them), the speed-up and the scaling efficiency
// (speed-up / N); a shape that does not fit one GPU gets the split's times alone.
//   bench_model --shape llama-3-8b --tensor-parallel-size 2 [--context 1024] [--prefill 4096]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_args.h"
#include "flashserve/attention.h"
#include "flashserve/error.h"
#include "model/cuda/cuda_runner.h"
#include "model/decode_kernels.h"
#include "model/forward_batch.h"
#include "model/presets.h"
#include "model/runner.h"
#include "model/step_graphs.h"

namespace fm = flashserve::model;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int32_t kBlock = 16;
int32_t block = kBlock;  // the KV page size of the current runs

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double copy_bandwidth() {
  const size_t bytes = size_t{4} << 30;
  void *a, *b;
  check(cudaMalloc(&a, bytes), "malloc");
  check(cudaMalloc(&b, bytes), "malloc");
  cudaMemset(a, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  const int reps = 10;
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  check(cudaEventSynchronize(e1), "copy");
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * reps / (ms * 1e-3);
}

struct Seqs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> len;  // tokens in the cache
  int64_t blocks_per_seq = 0;
  // `batch` sequences of max_len fixed pseudo-random tokens, none in the cache yet.
  void reset(int64_t batch, int64_t max_len, int64_t vocab) {
    tokens.assign(batch, std::vector<int32_t>(max_len));
    len.assign(batch, 0);
    for (int64_t j = 0; j < batch; ++j)
      for (int64_t t = 0; t < max_len; ++t)
        tokens[j][t] = static_cast<int32_t>((j * 7919 + t * 104729) % vocab);
  }
  std::vector<int32_t> blocks(int64_t i, int64_t kv) const {
    std::vector<int32_t> b;
    for (int64_t j = 0; j < (kv + block - 1) / block; ++j)
      b.push_back(static_cast<int32_t>(i * blocks_per_seq + j));
    return b;
  }
};

// Prefills every sequence's first `context` tokens, `per_step` sequences per forward.
void prefill_all(fm::ModelRunner& r, Seqs& s, int64_t context, int64_t per_step) {
  for (size_t i = 0; i < s.tokens.size(); i += per_step) {
    fm::ForwardBatchBuilder bb(block);
    for (size_t j = i; j < std::min(s.tokens.size(), i + per_step); ++j) {
      bb.add(s.tokens[j].data(), 0, context, s.blocks(j, context), true);
      s.len[j] = context;
    }
    r.forward(std::move(bb).build());
  }
  (void)r.logits();  // waits for the last forward
}

fm::ForwardBatch decode_batch(Seqs& s) {
  fm::ForwardBatchBuilder bb(block);
  for (size_t j = 0; j < s.tokens.size(); ++j)
    bb.add(s.tokens[j].data() + s.len[j], s.len[j], 1, s.blocks(j, s.len[j] + 1), true);
  return std::move(bb).build();
}

void print_profile(const char* what, const std::map<std::string, double>& p, int steps) {
  double total = 0;
  for (const auto& [k, v] : p) total += v;
  std::printf("\n%s, per step (CUDA events around each stage; %.3f ms in all):\n", what,
              total / steps);
  std::printf("| stage | ms | share |\n|---|---|---|\n");
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [k, v] : p) rows.emplace_back(v, k);
  std::sort(rows.rbegin(), rows.rend());
  for (const auto& [v, k] : rows)
    std::printf("| %s | %.3f | %.1f%% |\n", k.c_str(), v / steps, 100 * v / total);
}

// Times `steps` decode steps (after 3 warm-ups); returns ms per step (wall clock).
double time_decode(fm::ModelRunner& r, Seqs& s, int steps) {
  auto step = [&] {
    const fm::ForwardBatch b = decode_batch(s);
    r.forward(b);
    const auto tok = r.sample(b, std::vector<fm::SamplingParams>(b.sample_rows.size()));
    for (size_t j = 0; j < s.tokens.size(); ++j) ++s.len[j];
    (void)tok;
  };
  for (int i = 0; i < 3; ++i) step();
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
}

// The decode attention call alone at the model's shape: host time per attention_forward (calls
// enqueued back to back, no synchronization) and GPU time per call (events around 100 calls), for
// page sizes 16 and 256 and automatic vs no split, so that a slow step shows whether the time is
// the call or the kernel.
void attention_diag(const fm::ModelConfig& cfg, int64_t context, bool quick) {
  std::printf("\nattention alone (decode, %lld context, d %lld, %lld/%lld heads):\n",
              static_cast<long long>(context), static_cast<long long>(cfg.head_dim),
              static_cast<long long>(cfg.num_attention_heads),
              static_cast<long long>(cfg.num_key_value_heads));
  std::printf(
      "| batch | page | splits | host us/call | GPU us/call | K/V TB/s "
      "|\n|---|---|---|---|---|---|\n");
  const int64_t hq = cfg.num_attention_heads, hkv = cfg.num_key_value_heads, d = cfg.head_dim;
  const flashserve::Device gpu{flashserve::DeviceType::kCUDA, 0};
  for (int64_t batch : {int64_t{1}, int64_t{32}})
    for (int64_t page : {int64_t{16}, int64_t{256}})
      for (int splits : {0, 1, 4, 16}) {
        if (quick && page != 16) continue;
        const int64_t pages = (context + page - 1) / page, blocks = batch * pages;
        void *q, *o, *k, *v, *idx, *ws = nullptr;
        check(cudaMalloc(&q, batch * hq * d * 2), "q");
        check(cudaMalloc(&o, batch * hq * d * 2), "o");
        check(cudaMalloc(&k, blocks * page * hkv * d * 2), "k");
        check(cudaMalloc(&v, blocks * page * hkv * d * 2), "v");
        cudaMemset(q, 0, batch * hq * d * 2);
        cudaMemset(k, 0, blocks * page * hkv * d * 2);
        cudaMemset(v, 0, blocks * page * hkv * d * 2);
        std::vector<int32_t> h(batch + 1 + batch + blocks);
        for (int64_t b = 0; b <= batch; ++b) h[b] = static_cast<int32_t>(b);
        for (int64_t b = 0; b < batch; ++b) h[batch + 1 + b] = static_cast<int32_t>(context);
        for (int64_t i = 0; i < blocks; ++i) h[2 * batch + 1 + i] = static_cast<int32_t>(i);
        check(cudaMalloc(&idx, h.size() * 4), "idx");
        cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
        int32_t* ip = static_cast<int32_t*>(idx);
        flashserve::AttentionParams ap;
        ap.q = flashserve::make_view(q, flashserve::DType::kBFloat16, {batch, hq, d}, gpu);
        ap.out = flashserve::make_view(o, flashserve::DType::kBFloat16, {batch, hq, d}, gpu);
        ap.k = flashserve::make_view(k, flashserve::DType::kBFloat16, {blocks, page, hkv, d}, gpu);
        ap.v = flashserve::make_view(v, flashserve::DType::kBFloat16, {blocks, page, hkv, d}, gpu);
        ap.cu_seqlens_q = flashserve::make_view(ip, flashserve::DType::kInt32, {batch + 1}, gpu);
        ap.seqused_k =
            flashserve::make_view(ip + batch + 1, flashserve::DType::kInt32, {batch}, gpu);
        ap.block_table = flashserve::make_view(ip + 2 * batch + 1, flashserve::DType::kInt32,
                                               {batch, pages}, gpu);
        ap.max_seqlen_q = 1;
        ap.max_seqlen_k = context;
        ap.causal = true;
        ap.num_splits = splits;
        const size_t wsb = flashserve::attention_workspace_size(ap);
        if (wsb) check(cudaMalloc(&ws, wsb), "ws");
        ap.workspace = ws;
        ap.workspace_bytes = wsb;
        for (int i = 0; i < 5; ++i) flashserve::attention_forward(ap);
        check(cudaDeviceSynchronize(), "warm");
        const int n = 100;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0);
        const auto t0 = Clock::now();
        for (int i = 0; i < n; ++i) flashserve::attention_forward(ap);
        const double host_us =
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
        cudaEventRecord(e1);
        check(cudaEventSynchronize(e1), "diag");
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        const double gpu_us = ms * 1e3 / n;
        const double bytes = 2.0 * batch * context * hkv * d * 2;
        std::printf("| %lld | %lld | %s | %.1f | %.1f | %.2f |\n", static_cast<long long>(batch),
                    static_cast<long long>(page), splits ? std::to_string(splits).c_str() : "auto",
                    host_us, gpu_us, bytes / (gpu_us * 1e-6) / 1e12);
        for (void* p : {q, o, k, v, idx, ws}) cudaFree(p);
      }
}

// Mixed steps at a token budget: D decodes (each over `context` cached keys and growing) and one
// chunk of budget - D tokens after `context` cached keys, the chunk re-run over the same positions
// every step so that every step has one shape (the Sarathi step under load, minus the prompt's
// progress). The cache is zeros (no prefill: its values do not change the time). Wall clock per
// step, forward + greedy sample, graphs (mixed-step graphs) against eager, in one run.
void time_mixed(const fm::ModelConfig& cfg, int64_t budget, int64_t context,
                const std::vector<int64_t>& decode_counts, int steps) {
  const int64_t most = *std::max_element(decode_counts.begin(), decode_counts.end());
  auto runner = fm::cuda::CudaRunner::random(cfg, 1, 0);
  block = kBlock;
  const int64_t decode_blocks = (context + 3 * (steps + 3) + 16 + block - 1) / block;
  const int64_t chunk_blocks = (context + budget + block - 1) / block;
  const int64_t pool = (most + 1) * std::max(decode_blocks, chunk_blocks);
  runner->allocate_kv(pool, block);
  const auto [kv, kv_bytes] = runner->kv_pool();
  check(cudaMemset(const_cast<void*>(kv), 0, kv_bytes), "zero the cache");
  runner->prepare(budget, std::max<int64_t>(most, 1));
  std::printf(
      "\nmixed steps at budget %lld: D decodes over %lld keys + one chunk of %lld - D tokens "
      "after %lld keys; ms per step (forward + sample), page %d\n",
      static_cast<long long>(budget), static_cast<long long>(context),
      static_cast<long long>(budget), static_cast<long long>(context), block);
  std::printf(
      "| decodes | tokens | graph ms | eager ms | eager / graph | graphs captured / replayed "
      "|\n|---|---|---|---|---|---|\n");
  std::vector<int32_t> tokens(std::max(decode_blocks, chunk_blocks) * block);
  for (size_t t = 0; t < tokens.size(); ++t)
    tokens[t] = static_cast<int32_t>((t * 104729) % cfg.vocab_size);
  const int64_t per_seq = std::max(decode_blocks, chunk_blocks);
  auto blocks = [&](int64_t seq, int64_t n) {
    std::vector<int32_t> b;
    for (int64_t j = 0; j < n; ++j) b.push_back(static_cast<int32_t>(seq * per_seq + j));
    return b;
  };
  for (int64_t d : decode_counts) {
    if (d >= budget) continue;
    std::vector<int64_t> len(d, context);
    auto step = [&] {
      fm::ForwardBatchBuilder bb(block);
      for (int64_t j = 0; j < d; ++j)
        bb.add(tokens.data() + len[j], len[j], 1, blocks(j, (len[j] + block) / block), true);
      bb.add(tokens.data() + context, context, budget - d, blocks(d, chunk_blocks), false);
      const fm::ForwardBatch b = std::move(bb).build();
      runner->forward(b);
      runner->sample(b, std::vector<fm::SamplingParams>(b.sample_rows.size()));
      for (auto& l : len) ++l;
    };
    double ms[2];
    const auto before = runner->mixed_graph_counts();
    for (int graphs = 1; graphs >= 0; --graphs) {
      runner->set_cuda_graphs(graphs == 1);
      runner->set_mixed_graph_tokens(graphs == 1 ? fm::kMixedGraphMaxTokens : 0);
      for (int i = 0; i < 3; ++i) step();
      const auto t0 = Clock::now();
      for (int i = 0; i < steps; ++i) step();
      ms[graphs] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
    }
    const auto after = runner->mixed_graph_counts();
    std::printf("| %lld | %lld | %.3f | %.3f | %.2f | %lld / %lld |\n", static_cast<long long>(d),
                static_cast<long long>(budget), ms[1], ms[0], ms[0] / ms[1],
                static_cast<long long>(after.first - before.first),
                static_cast<long long>(after.second - before.second));
    std::fflush(stdout);
  }
}

// The --fuse-ab mode (see the header).
void fuse_ab(const fm::ModelConfig& cfg, int64_t context, const std::vector<int>& batches,
             int rounds, int steps) {
  const double bw = copy_bandwidth();
  auto runner = fm::cuda::CudaRunner::random(cfg, 1, 0);
  const double wbytes = static_cast<double>(runner->weight_bytes());
  const double kv_per_token = 2.0 * cfg.num_hidden_layers * cfg.kv_size() * 2;
  std::printf("device copy bandwidth %.2f TB/s; weight-read floor %.3f ms\n", bw / 1e12,
              wbytes / bw * 1e3);
  struct Mode {
    int64_t gemv_rows;  // products of at most this many rows through the GEMV
    bool norm, silu, cluster, pdl_attention, early;
    const char* name;
  };
  constexpr int64_t kAll = fm::kGemvMaxProductRows, kDefault = fm::kGemvRowsByDefault;
  constexpr bool kPdlAttn = fm::kPdlAttentionByDefault, kEarly = fm::kEarlyWeightsByDefault;
  const std::vector<Mode> modes = {
      {kDefault, false, false, false, kPdlAttn, kEarly, "default"},
      {0, false, false, false, kPdlAttn, kEarly, "cuBLASLt, unfused"},
      {1, false, false, false, kPdlAttn, kEarly, "GEMV for 1 row, unfused"},
      {kAll, false, false, false, kPdlAttn, kEarly, "GEMV for <= 4 rows, unfused"},
      {kAll, false, true, false, kPdlAttn, kEarly, "fused silu"},
      {kAll, true, false, false, kPdlAttn, kEarly, "fused norm"},
      {kAll, true, true, false, kPdlAttn, kEarly, "fused norm + silu"},
      {kDefault, false, false, true, kPdlAttn, kEarly, "default + cluster combine"},
      {kDefault, false, false, false, !kPdlAttn, kEarly,
       kPdlAttn ? "default, attention PDL off" : "default + attention PDL"},
      {kDefault, false, false, false, kPdlAttn, !kEarly,
       kEarly ? "default, early weights off" : "default + early weights"},
      {kDefault, false, false, false, true, true, "default + early weights + attention PDL"}};
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  const int64_t max_len = context + 3 + steps + 16;
  Seqs s;
  s.blocks_per_seq = (max_len + block - 1) / block;
  runner->allocate_kv(max_batch * s.blocks_per_seq, block);
  runner->set_cuda_graphs(true);
  std::printf(
      "\n| decode step, %lld keys, page %d, CUDA graph | batch | median ms | min ms | floor ms "
      "| median / floor | vs default |\n|---|---|---|---|---|---|---|\n",
      static_cast<long long>(context), block);
  for (int64_t batch : batches) {
    s.reset(batch, max_len, cfg.vocab_size);
    prefill_all(*runner, s, context, 4);
    std::vector<std::vector<double>> ms(modes.size());
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < modes.size(); ++i) {
        const size_t at = (i + r) % modes.size();
        const Mode& m = modes[at];
        // Read by each step's attention plan; the graphs captured under the other value are
        // dropped by the setters below.
        setenv("FLASHSERVE_DECODE_CLUSTER", m.cluster ? "1" : "0", 1);
        runner->set_gemv_rows(m.gemv_rows);
        runner->set_decode_fusion(m.norm, m.silu);
        runner->set_attention_pdl(m.pdl_attention);
        runner->set_early_weights(m.early);
        s.len.assign(batch, context);  // the same keys every timing: the steps rewrite them
        ms[at].push_back(time_decode(*runner, s, steps));
      }
    const double floor_ms =
        (wbytes + (batch > 1 ? batch * context * kv_per_token : 0.0)) / bw * 1e3;
    double base = 0;
    for (size_t i = 0; i < modes.size(); ++i) {
      std::vector<double>& v = ms[i];
      std::sort(v.begin(), v.end());
      const double med = v[v.size() / 2];
      if (i == 0) base = med;
      std::printf("| %s | %lld | %.3f | %.3f | %.3f | %.3f | %+.1f%% |\n", modes[i].name,
                  static_cast<long long>(batch), med, v.front(), floor_ms, med / floor_ms,
                  100.0 * (med / base - 1.0));
      std::fflush(stdout);
    }
  }
  runner->set_gemv_rows(fm::kGemvRowsByDefault);
  runner->set_decode_fusion(false, false);
  runner->set_attention_pdl(fm::kPdlAttentionByDefault);
  runner->set_early_weights(fm::kEarlyWeightsByDefault);
  unsetenv("FLASHSERVE_DECODE_CLUSTER");
}

// Wall clock of one `prefill`-token prompt (forward + sample), ms, the mean of `reps` after
// `warmups`.
double time_prefill(fm::ModelRunner& r, const Seqs& s, int64_t prefill, int64_t vocab,
                    int warmups = 3, int reps = 10) {
  std::vector<int32_t> prompt(prefill);
  for (int64_t t = 0; t < prefill; ++t) prompt[t] = static_cast<int32_t>((t * 31337) % vocab);
  auto one = [&] {
    fm::ForwardBatchBuilder bb(block);
    bb.add(prompt.data(), 0, prefill, s.blocks(0, prefill), true);
    const fm::ForwardBatch b = std::move(bb).build();
    r.forward(b);
    r.sample(b, {fm::SamplingParams{}});
  };
  for (int i = 0; i < warmups; ++i) one();
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) one();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / reps;
}

// The --tensor-parallel-size mode (see the header).
void tp_scaling(const fm::ModelConfig& cfg, int ranks, int64_t context, int64_t prefill,
                int steps) {
  const int64_t max_batch = 32, max_len = std::max(context + 3 + steps + 16, prefill);
  Seqs s;
  block = kBlock;
  s.blocks_per_seq = (max_len + block - 1) / block;
  struct Times {
    double decode1 = 0, decode32 = 0, prefill = 0;
  };
  auto measure = [&](int size) -> std::optional<Times> {
    std::unique_ptr<fm::ModelRunner> r;
    try {
      r = fm::make_random_cuda_runner(cfg, 1, 0, size);
      r->allocate_kv(max_batch * s.blocks_per_seq, block);
      r->prepare(std::max<int64_t>(prefill, 4 * context), max_batch);
    } catch (const flashserve::Error& e) {
      std::printf("| %d GPU%s | does not run: %s |\n", size, size > 1 ? "s" : "", e.what());
      return std::nullopt;
    }
    Times t;
    for (int64_t batch : {int64_t{1}, max_batch}) {
      s.reset(batch, max_len, cfg.vocab_size);
      prefill_all(*r, s, context, 4);
      (batch == 1 ? t.decode1 : t.decode32) = time_decode(*r, s, steps);
    }
    t.prefill = time_prefill(*r, s, prefill, cfg.vocab_size);
    return t;
  };
  std::printf(
      "\n| GPUs | decode batch 1, %lld keys, ms | decode batch 32, ms | prefill %lld tokens, ms "
      "|\n|---|---|---|---|\n",
      static_cast<long long>(context), static_cast<long long>(prefill));
  std::optional<Times> t[2];
  for (int i = 0; i < 2; ++i) {
    t[i] = measure(i == 0 ? 1 : ranks);
    if (t[i])
      std::printf("| %d | %.3f | %.3f | %.2f |\n", i == 0 ? 1 : ranks, t[i]->decode1,
                  t[i]->decode32, t[i]->prefill);
    std::fflush(stdout);
  }
  if (!t[0] || !t[1]) return;
  auto row = [&](const char* what, double one, double split) {
    std::printf("| %s | %.2fx | %.0f%% |\n", what, one / split, 100.0 * one / split / ranks);
  };
  std::printf("\n| work | speed-up at %d GPUs | scaling efficiency |\n|---|---|---|\n", ranks);
  row("decode batch 1", t[0]->decode1, t[1]->decode1);
  row("decode batch 32", t[0]->decode32, t[1]->decode32);
  row("prefill", t[0]->prefill, t[1]->prefill);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string shape = arg(argc, argv, "--shape", "mistral-7b");
  const int64_t context = std::atoll(arg(argc, argv, "--context", "1024").c_str());
  const int64_t prefill = std::atoll(arg(argc, argv, "--prefill", "4096").c_str());
  const int steps = std::atoi(arg(argc, argv, "--steps", "30").c_str());
  // --quick: page 16 only and the attention diagnostics at page 16 (a short device call).
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick |= std::strcmp(argv[i], "--quick") == 0;
  const char* commit = std::getenv("COMMIT");

  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  fm::ModelConfig cfg = fm::preset_config(shape);
  // The prompts here are at most 4096 tokens: Mistral's 4096-token window never cuts, and
  // transformers' comparison runs without it too (its fastest SDPA path).
  cfg.sliding_window = 0;
  const int64_t params =
      cfg.hidden_size * cfg.vocab_size * (cfg.tie_word_embeddings ? 1 : 2) +
      cfg.num_hidden_layers * (cfg.hidden_size * (cfg.q_size() + 2 * cfg.kv_size() + cfg.q_size()) +
                               3 * cfg.hidden_size * cfg.intermediate_size + 2 * cfg.hidden_size) +
      cfg.hidden_size;
  std::printf("# bench_model: %s (random bf16 weights on the device), %s, commit %s\n",
              shape.c_str(), prop.name, commit ? commit : "unknown");

  bool mixed = false;
  for (int i = 1; i < argc; ++i) mixed |= std::strcmp(argv[i], "--mixed") == 0;
  if (mixed) {
    const int64_t budget = std::atoll(arg(argc, argv, "--budget", "512").c_str());
    std::vector<int64_t> counts;
    std::string list = arg(argc, argv, "--decodes", "0,1,16,64,128,256");
    for (size_t p = 0; p < list.size();) {
      const size_t comma = std::min(list.find(',', p), list.size());
      counts.push_back(std::atoll(list.substr(p, comma - p).c_str()));
      p = comma + 1;
    }
    time_mixed(cfg, budget, context, counts, steps);
    return 0;
  }

  if (const int ranks = std::atoi(arg(argc, argv, "--tensor-parallel-size", "1").c_str());
      ranks > 1) {
    tp_scaling(cfg, ranks, context, prefill, steps);
    return 0;
  }

  bool ab = false;
  for (int i = 1; i < argc; ++i) ab |= std::strcmp(argv[i], "--fuse-ab") == 0;
  if (ab) {
    const std::vector<int> batches = parse_int_list(arg(argc, argv, "--batches", "1,4").c_str());
    const int rounds = std::atoi(arg(argc, argv, "--rounds", "7").c_str());
    fuse_ab(cfg, context, batches, rounds, steps);
    return 0;
  }

  const double bw = copy_bandwidth();
  auto t_load = Clock::now();
  auto runner = fm::cuda::CudaRunner::random(cfg, 1, 0);
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  const double wbytes = static_cast<double>(runner->weight_bytes());
  const double kv_per_token = 2.0 * cfg.num_hidden_layers * cfg.kv_size() * 2;
  std::printf("parameters %.3f B; weights read per step %.2f GB; random init %.1f s\n",
              params / 1e9, wbytes / 1e9, load_s);
  std::printf("device copy bandwidth %.2f TB/s (read + written); weight-read floor %.3f ms\n",
              bw / 1e12, wbytes / bw * 1e3);

  const int64_t max_batch = 32, max_len = std::max(context + 8 * (steps + 3) + 16, prefill);
  Seqs s;
  std::printf("\n| work | ours | floor | ours / floor |\n|---|---|---|---|\n");
  std::map<std::string, std::map<std::string, double>> profiles;
  struct Mode {
    bool graphs;
    int64_t gemv_rows;  // products of at most this many rows through the GEMV
    const char* name;
  };
  for (int32_t page : {kBlock, 256}) {
    if (quick && page != kBlock) continue;
    block = page;
    s.blocks_per_seq = (max_len + block - 1) / block;
    runner->allocate_kv(max_batch * s.blocks_per_seq, block);
    for (int64_t batch : {int64_t{1}, max_batch}) {
      s.reset(batch, max_len, cfg.vocab_size);
      prefill_all(*runner, s, context, 4);
      const int64_t kDefault = fm::kGemvRowsByDefault;
      std::vector<Mode> modes = {{true, kDefault, "CUDA graph"}, {false, kDefault, "eager"}};
      if (batch <= fm::kGemvMaxProductRows) {
        modes.push_back({true, 0, "CUDA graph, cuBLASLt"});
        modes.push_back({true, fm::kGemvMaxProductRows, "CUDA graph, GEMV kernel"});
      }
      for (const Mode& m : modes) {
        runner->set_cuda_graphs(m.graphs);
        runner->set_gemv_rows(m.gemv_rows);
        const double ms = time_decode(*runner, s, steps);
        const double kv_bytes = batch * (s.len[0] - steps / 2) * kv_per_token;
        const double floor_ms = (wbytes + kv_bytes) / bw * 1e3;
        std::printf(
            "| decode step, batch %lld, %lld context, page %d, %s | %.3f ms | %.3f ms "
            "(weights%s) | %.2f |\n",
            static_cast<long long>(batch), static_cast<long long>(context), page, m.name, ms,
            floor_ms, batch > 1 ? " + K/V" : "", ms / floor_ms);
        std::fflush(stdout);
      }
      runner->set_gemv_rows(fm::kGemvRowsByDefault);
      if (page == kBlock) {
        runner->set_profiling(true);
        time_decode(*runner, s, 5);
        runner->set_profiling(false);
        profiles["decode batch " + std::to_string(batch)] = runner->profile();
      }
    }
  }
  runner->set_cuda_graphs(true);
  const auto [captures, replays] = runner->graph_counts();
  const auto [mixed_captures, mixed_replays] = runner->mixed_graph_counts();
  std::printf(
      "(graphs: %lld captured, %lld replays; of them mixed steps (the prefills): %lld, %lld)\n",
      static_cast<long long>(captures), static_cast<long long>(replays),
      static_cast<long long>(mixed_captures), static_cast<long long>(mixed_replays));
  block = kBlock;
  s.blocks_per_seq = (max_len + block - 1) / block;
  runner->allocate_kv(max_batch * s.blocks_per_seq, block);
  {
    const double ms = time_prefill(*runner, s, prefill, cfg.vocab_size);
    const double flops = 2.0 * params * prefill + 2.0 * cfg.num_hidden_layers *
                                                      cfg.num_attention_heads * double(prefill) *
                                                      prefill * cfg.head_dim;
    std::printf(
        "| prefill %lld tokens | %.2f ms = %.0f TFLOP/s | transformers 120 ms (anchor) | |\n",
        static_cast<long long>(prefill), ms, flops / (ms * 1e-3) / 1e12);
    runner->set_profiling(true);
    time_prefill(*runner, s, prefill, cfg.vocab_size, 0, 2);
    runner->set_profiling(false);
    profiles["prefill " + std::to_string(prefill)] = runner->profile();
  }
  for (const auto& [name, p] : profiles)
    print_profile(name.c_str(), p, name[0] == 'd' ? 8 : 2);  // decode: 3 warm-ups + 5
  runner.reset();
  attention_diag(cfg, context, quick);
  return 0;
}
