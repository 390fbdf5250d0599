// bench_serve_attn: attention as a serving step runs it (issue 15). Every row is one step's batch
// (prefill chunks over their cached context, single-token decodes, or both at once), with K/V
// contiguous (varlen) or in a paged cache (pages in shuffled order, as a block manager hands them
// out), run the way the engine runs it: plan_attention once from the host-side lengths, then
// run_attention per layer, --calls calls captured back to back in one CUDA graph. 32 query heads
// over 8 KV heads, head dim 128 (--head-dim 64/256), bf16, causal (bottom-right), automatic
// split-KV.
//
// Decodes report TB/s of K and V read (against the device-to-device copy bandwidth measured in the
// same run), prefills TFLOP/s with 4 * h_q * d FLOPs per visible (query, key) pair (the exact
// count under the causal mask). A mixed row is set beside the sum of its parts (the same rows
// launched alone). The column "fwd" times attention_forward (no host lengths: the plan only knows
// max_seqlen_q/k) in the same graph form. Each figure is the median over --reps graph launches.
// --kv-fp8 adds a table of every row on paged 16 and 256 with the bf16 pool beside the same row
// on an e4m3 pool (the fp8 KV cache, issue 23: sm80's fp8 KV kernels, one descale per KV head),
// decode rows in TB/s of the bytes each pool holds (fp8 reads half); with --decode-splits also
// the decode rows at those split counts, bf16 beside e4m3. --decode-rows NxKEYS,... replaces the
// decode rows of the forced-split tables (a split policy's regimes between the fixed rows).
// --decode-spread adds decode rows whose sequences differ in length (spread uniformly over 0.1-1.9x
// the mean, or as an exponential distribution's quantiles: a server's mix of young and old
// requests) beside the same decodes at equal lengths, same keys in all (issue 21: the cost model
// prices decode attention at the batch's mean length, and a serving run's decode-only steps take
// 4-11% more than it says), each split evenly and by length (FLASHSERVE_DECODE_BALANCE), planned
// from the lengths and as a decode graph plans it. The calls after a graph's first reuse its
// step state (AttentionRunOptions::reuse_step_state: the by-length item map), as the engine's
// layers after the first do; --rebuild-map makes every call rebuild it (the engine before
// session 35).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench_common.h"
#include "flashserve/attention.h"

namespace {

constexpr int kHq = 32, kHkv = 8;
int g_head_dim = 128;        // --head-dim
bool g_rebuild_map = false;  // --rebuild-map
// Tokens of the K and V pools: the largest step's keys and some spare, or --pool-tokens (more: the
// pages spread over a pool as large as a server's per-layer pool, e.g. 914304 tokens for
// mistral-7b's 57144 blocks of 16 on the H200, where a fresh small pool keeps them close).
constexpr int64_t kMinPoolTokens = 64 * 4096 + 4096;
int64_t g_pool_tokens = kMinPoolTokens;

// dst = src, 16 bytes per thread and step: the copy bandwidth SM loads and stores reach.
__global__ void copy_kernel(uint4* dst, const uint4* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
}

// One sequence of a step: new queries over cached keys (kv_len = cached + q_len).
struct Seq {
  int q_len, cached;
  int kv_len() const { return cached + q_len; }
};

struct Row {
  std::string name;
  std::vector<Seq> seqs;
  std::vector<std::string> parts;  // rows whose sum this one is set beside
};

std::vector<Seq> repeat(int n, Seq s) {
  return std::vector<Seq>(n, s);
}

std::vector<Row> rows() {
  std::vector<Row> r;
  r.push_back({"64 decodes x 2k", repeat(64, {1, 2047}), {}});
  r.push_back({"64 decodes x 4k", repeat(64, {1, 4095}), {}});
  r.push_back({"8 decodes x 32k", repeat(8, {1, 32767}), {}});
  // "A chunk over 4k": 4096 keys in all, the chunk's own 512 included (the issue's FLOP count).
  r.push_back({"chunk 512 over 4k", {{512, 3584}}, {}});
  r.push_back(
      {"4 chunks 512 over 1k/2k/4k/8k", {{512, 512}, {512, 1536}, {512, 3584}, {512, 7680}}, {}});
  Row mixed{"chunk 512 over 4k + 64 decodes x 2k",
            {{512, 3584}},
            {"chunk 512 over 4k", "64 decodes x 2k"}};
  for (const Seq& s : repeat(64, {1, 2047})) mixed.seqs.push_back(s);
  r.push_back(mixed);
  r.push_back({"2 fresh prefills of 2048", repeat(2, {2048, 0}), {}});
  return r;
}

// --decode-rows "32x4096,128x2048": decode rows (sequences x keys) for the forced-split tables in
// place of rows()'s, for a split policy's regimes between them; every row fits the pool.
std::vector<Row> parse_decode_rows(const char* s) {
  std::vector<Row> r;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    const long keys = *end == 'x' ? std::strtol(end + 1, &end, 10) : 0;
    if (n < 1 || keys < 2 || (*end && *end != ',') || n * keys > kMinPoolTokens - 4096) {
      std::fprintf(stderr, "--decode-rows: \"%s\": want NxKEYS[,NxKEYS...] within %lld keys\n", s,
                   static_cast<long long>(kMinPoolTokens - 4096));
      std::exit(2);
    }
    r.push_back({std::to_string(n) + " decodes x " + std::to_string(keys),
                 repeat(static_cast<int>(n), {1, static_cast<int>(keys - 1)}),
                 {}});
    p = *end ? end + 1 : end;
  }
  return r;
}

// `n` decodes whose keys total n x mean: equal, "uniform" (0.1-1.9x the mean, evenly spaced) or
// "exponential" (the distribution's quantiles (i + 0.5) / n, at least 16 keys), the remainder of
// the rounding on the longest, in a shuffled order (a batch's order is its admission's).
Row spread_row(int n, int mean, const std::string& kind) {
  std::vector<int> keys(n, mean);
  for (int i = 0; i < n && kind != "equal"; ++i) {
    const double u = (i + 0.5) / n;
    const double f = kind == "uniform" ? 0.1 + 1.8 * u : -std::log(1.0 - u);
    keys[i] = std::max(16, static_cast<int>(std::lround(mean * f)));
  }
  const int64_t total = std::accumulate(keys.begin(), keys.end(), int64_t{0});
  int& longest = *std::max_element(keys.begin(), keys.end());
  longest = static_cast<int>(longest + int64_t{n} * mean - total);
  std::mt19937 rng(11);
  std::shuffle(keys.begin(), keys.end(), rng);
  Row r{std::to_string(n) + " decodes, mean " + std::to_string(mean) + ", " + kind, {}, {}};
  for (int k : keys) r.seqs.push_back({1, k - 1});
  return r;
}

bool all_decode(const Row& r) {
  return std::all_of(r.seqs.begin(), r.seqs.end(), [](const Seq& s) { return s.q_len == 1; });
}

double kv_bytes(const Row& r) {
  double keys = 0;
  for (const Seq& s : r.seqs) keys += s.kv_len();
  return 2.0 * keys * kHkv * g_head_dim * 2;  // K and V, bf16
}

double flops(const Row& r) {  // visible (query, key) pairs under the bottom-right causal mask
  double pairs = 0;
  for (const Seq& s : r.seqs)
    pairs += double(s.q_len) * s.cached + double(s.q_len) * (s.q_len + 1) / 2;
  return 4.0 * kHq * g_head_dim * pairs;
}

// x[i] = e4m3 of a normal-ish value (|x| < 4: no saturation, no NaN codes).
__global__ void fill_e4m3(uint8_t* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = (static_cast<float>(h & 0xffffu) / 65536.0f - 0.5f) * 4.0f;
    x[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
  }
}

struct Buffers {
  uint16_t *q, *out, *k, *v;
  uint8_t *k8 = nullptr, *v8 = nullptr;  // --kv-fp8: e4m3 pools
  float* descale = nullptr;              // [h_kv]: one per KV head, zero batch stride
  int32_t *cu_q, *cu_k, *used, *table;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// The device views and host lengths of one row in one layout (page 0: contiguous varlen K/V).
struct Step {
  flashserve::AttentionParams params;
  std::vector<int32_t> cu_q, kv_lens;
};

flashserve::TensorView dview(void* p, flashserve::DType dt, std::initializer_list<int64_t> s) {
  return flashserve::make_view(p, dt, s, {flashserve::DeviceType::kCUDA, 0});
}

// Pages are handed out shuffled over the whole pool (a long-running server's free list), or, with
// `in_order`, each sequence's pages one after another (a fresh pool).
Step make_step(const Row& row, int page, Buffers& b, std::mt19937& rng, bool in_order = false,
               int num_splits = 0) {
  using flashserve::DType;
  Step st;
  const int n = static_cast<int>(row.seqs.size());
  std::vector<int32_t> cu_k{0}, table;
  st.cu_q.push_back(0);
  int max_q = 0, max_kv = 0, pages_per_seq = 0;
  for (const Seq& s : row.seqs) {
    st.cu_q.push_back(st.cu_q.back() + s.q_len);
    cu_k.push_back(cu_k.back() + s.kv_len());
    st.kv_lens.push_back(s.kv_len());
    max_q = std::max(max_q, s.q_len);
    max_kv = std::max(max_kv, s.kv_len());
  }
  flashserve::AttentionParams& p = st.params;
  const int64_t total_q = st.cu_q.back();
  p.q = dview(b.q, DType::kBFloat16, {total_q, kHq, g_head_dim});
  p.out = dview(b.out, DType::kBFloat16, {total_q, kHq, g_head_dim});
  p.cu_seqlens_q = dview(b.cu_q, DType::kInt32, {n + 1});
  CUDA_OK(cudaMemcpy(b.cu_q, st.cu_q.data(), 4 * (n + 1), cudaMemcpyHostToDevice));
  p.max_seqlen_q = max_q;
  p.max_seqlen_k = max_kv;
  p.causal = true;
  p.num_splits = num_splits;
  if (page == 0) {
    p.k = dview(b.k, DType::kBFloat16, {cu_k.back(), kHkv, g_head_dim});
    p.v = dview(b.v, DType::kBFloat16, {cu_k.back(), kHkv, g_head_dim});
    p.cu_seqlens_k = dview(b.cu_k, DType::kInt32, {n + 1});
    CUDA_OK(cudaMemcpy(b.cu_k, cu_k.data(), 4 * (n + 1), cudaMemcpyHostToDevice));
  } else {
    const int64_t num_pages = g_pool_tokens / page;
    std::vector<int32_t> free_pages(num_pages);
    std::iota(free_pages.begin(), free_pages.end(), 0);
    if (!in_order) std::shuffle(free_pages.begin(), free_pages.end(), rng);
    pages_per_seq = (max_kv + page - 1) / page;
    table.assign(size_t(n) * pages_per_seq, 0);
    size_t next = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < (row.seqs[i].kv_len() + page - 1) / page; ++j)
        table[size_t(i) * pages_per_seq + j] = free_pages.at(next++);
    p.k = dview(b.k, DType::kBFloat16, {num_pages, page, kHkv, g_head_dim});
    p.v = dview(b.v, DType::kBFloat16, {num_pages, page, kHkv, g_head_dim});
    p.block_table = dview(b.table, DType::kInt32, {n, pages_per_seq});
    CUDA_OK(cudaMemcpy(b.table, table.data(), 4 * table.size(), cudaMemcpyHostToDevice));
    p.seqused_k = dview(b.used, DType::kInt32, {n});
    CUDA_OK(cudaMemcpy(b.used, st.kv_lens.data(), 4 * n, cudaMemcpyHostToDevice));
  }
  return st;
}

// A paged step read from the e4m3 pools instead (--kv-fp8): the same pages and lengths, K and V
// codes, one descale per KV head for every sequence (zero batch stride).
void use_e4m3_pools(Step& st, const Buffers& b) {
  using flashserve::DType;
  st.params.k.data = b.k8;
  st.params.v.data = b.v8;
  st.params.k.dtype = st.params.v.dtype = DType::kFloat8E4M3;
  const int64_t n = st.params.seqused_k.shape[0];
  for (flashserve::TensorView* d : {&st.params.k_descale, &st.params.v_descale}) {
    *d = dview(b.descale, DType::kFloat32, {n, kHkv});
    d->stride[0] = 0;
  }
}

// Median microseconds per call of `calls` calls of fn(stream, call) captured in one graph (call
// 0 the graph's first; a call outside the graph first is call 0 too).
template <class Fn>
double graph_us(Fn&& fn, int calls, int reps) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fn(stream, 0);  // outside the capture: first-call attributes, errors
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) fn(stream, i);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CUDA_OK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  std::vector<float> ms(reps);
  for (int r = 0; r < reps; ++r) {
    CUDA_OK(cudaEventRecord(start, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaEventRecord(stop, stream));
    CUDA_OK(cudaEventSynchronize(stop));
    CUDA_OK(cudaEventElapsedTime(&ms[r], start, stop));
  }
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  return 1000.0 * ms[reps / 2] / calls;
}

void ensure_workspace(Buffers& b, size_t bytes) {
  if (bytes <= b.workspace_bytes) return;
  CUDA_OK(cudaFree(b.workspace));
  CUDA_OK(cudaMalloc(&b.workspace, bytes));
  b.workspace_bytes = bytes;
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 20, reps = 15;
  std::string out_path;
  std::vector<int> decode_splits;
  std::vector<Row> split_rows;
  bool kv_fp8 = false, decode_spread = false, main_table = true;
  std::vector<std::pair<int, int>> spread = {{16, 2048}, {64, 1024}, {64, 2048}, {112, 2048}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--calls" && i + 1 < argc)
      calls = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (a == "--md" && i + 1 < argc)
      out_path = argv[++i];
    else if (a == "--head-dim" && i + 1 < argc)
      g_head_dim = std::atoi(argv[++i]);
    else if (a == "--kv-fp8")
      kv_fp8 = true;
    else if (a == "--decode-spread")
      decode_spread = true;
    else if (a == "--no-main")
      main_table = false;
    else if (a == "--rebuild-map")
      g_rebuild_map = true;
    else if (a == "--spread" && i + 1 < argc) {  // N:MEAN,...: the spread rows' shapes
      spread.clear();
      for (const char* q = argv[++i]; *q;) {
        char* end = nullptr;
        const long n = std::strtol(q, &end, 10),
                   mean = *end == ':' ? std::strtol(end + 1, &end, 10) : 0;
        if (n < 1 || mean < 16 || (*end && *end != ',')) {
          std::fprintf(stderr, "--spread: want N:MEAN[,N:MEAN...], got \"%s\"\n", argv[i]);
          return 2;
        }
        spread.emplace_back(static_cast<int>(n), static_cast<int>(mean));
        q = *end ? end + 1 : end;
      }
    } else if (a == "--pool-tokens" && i + 1 < argc)
      g_pool_tokens = std::max<int64_t>(kMinPoolTokens, std::atoll(argv[++i]));
    else if (a == "--decode-splits" && i + 1 < argc) {
      for (int n : parse_int_list(argv[++i])) decode_splits.push_back(n);
    } else if (a == "--decode-rows" && i + 1 < argc) {
      split_rows = parse_decode_rows(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: bench_serve_attn [--calls 20] [--reps 15] [--md FILE] [--head-dim 128] "
                   "[--decode-splits 2,4,8] [--decode-rows 32x4096,...] [--kv-fp8] "
                   "[--decode-spread] [--spread N:MEAN,...] [--no-main] [--pool-tokens N] "
                   "[--rebuild-map]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (split_rows.empty())
    for (const Row& row : rows())
      if (all_decode(row)) split_rows.push_back(row);
  cudaDeviceProp prop{};
  if (!cuda_device_or_skip("bench_serve_attn", &prop)) return 0;

  Buffers b;
  const int64_t kv_elems = g_pool_tokens * kHkv * g_head_dim,
                q_elems = int64_t{4096} * kHq * g_head_dim;
  CUDA_OK(cudaMalloc(&b.q, 2 * q_elems));
  CUDA_OK(cudaMalloc(&b.out, 2 * q_elems));
  CUDA_OK(cudaMalloc(&b.k, 2 * kv_elems));
  CUDA_OK(cudaMalloc(&b.v, 2 * kv_elems));
  CUDA_OK(cudaMalloc(&b.cu_q, 4 * 1024));
  CUDA_OK(cudaMalloc(&b.cu_k, 4 * 1024));
  CUDA_OK(cudaMalloc(&b.used, 4 * 1024));
  CUDA_OK(cudaMalloc(&b.table, 4 * (g_pool_tokens + 1024)));
  fill_random<<<1024, 256>>>(b.q, q_elems, 1u);
  fill_random<<<1024, 256>>>(b.k, kv_elems, 2u);
  fill_random<<<1024, 256>>>(b.v, kv_elems, 3u);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());

  // Copy bandwidth in the same run: read + write bytes per second of one K-pool-sized copy by a
  // kernel (a graph's memcpy node runs on a copy engine, well below what SMs reach).
  const double copy_us = graph_us(
      [&](cudaStream_t s, int) {
        copy_kernel<<<prop.multiProcessorCount * 8, 512, 0, s>>>(
            reinterpret_cast<uint4*>(b.v), reinterpret_cast<const uint4*>(b.k), 2 * kv_elems / 16);
      },
      5, reps);
  const double copy_tbs = 2.0 * 2 * kv_elems / (copy_us * 1e-6) / 1e12;
  fill_random<<<1024, 256>>>(b.v, kv_elems, 3u);
  CUDA_OK(cudaDeviceSynchronize());

  std::string md;
  char line[1024];
  auto emit = [&](const char* s) {
    std::printf("%s", s);
    md += s;
  };
  std::snprintf(
      line, sizeof line,
      "bench_serve_attn on %s (%d SMs): bf16, %d/%d heads, d%d, causal, automatic "
      "splits; plan once, %d run_attention calls per CUDA graph (%s), median of %d; pools "
      "of %lld tokens; device copy %.2f TB/s (read + write)\n\n",
      prop.name, prop.multiProcessorCount, kHq, kHkv, g_head_dim, calls,
      g_rebuild_map ? "each rebuilds its step state" : "the first's step state reused", reps,
      static_cast<long long>(g_pool_tokens), copy_tbs);
  emit(line);
  emit(
      "| batch | contiguous (varlen) | paged 16 | paged 256 | paged 16 / contiguous | "
      "paged 16, pages in order | paged 16, attention_forward | plan (paged 16) |\n"
      "|---|---|---|---|---|---|---|---|\n");

  // Layouts: page 0 is contiguous varlen K/V; a negative page size is that page size with the
  // pages in order.
  const int layouts[] = {0, 16, 256, -16};
  // Microseconds a call of `plan` over `params` (given the shared workspace) takes.
  auto time_plan = [&](const flashserve::AttentionPlan& plan, flashserve::AttentionParams& params) {
    ensure_workspace(b, plan.workspace_bytes());
    params.workspace = b.workspace;
    params.workspace_bytes = b.workspace_bytes;
    return graph_us(
        [&](cudaStream_t s, int call) {
          params.stream = s;
          flashserve::AttentionRunOptions options;
          options.reuse_step_state = call > 0 && !g_rebuild_map;
          flashserve::run_attention(plan, params, options);
        },
        calls, reps);
  };
  auto time_step = [&](Step& st) {
    flashserve::AttentionLengths lens{st.cu_q.data(), st.kv_lens.data()};
    const flashserve::AttentionPlan plan = flashserve::plan_attention(st.params, lens);
    return std::pair{time_plan(plan, st.params), plan.summary()};
  };
  std::mt19937 rng(7);
  std::map<std::string, std::map<int, double>> us;  // row -> layout -> us
  for (const Row& row : main_table ? rows() : std::vector<Row>{}) {
    const bool decode = all_decode(row);
    auto figure = [&](double t) {
      char f[64];
      if (decode)
        std::snprintf(f, sizeof f, "%.1f us (%.2f TB/s)", t, kv_bytes(row) / (t * 1e-6) / 1e12);
      else
        std::snprintf(f, sizeof f, "%.1f us (%.0f TFLOP/s)", t, flops(row) / (t * 1e-6) / 1e12);
      return std::string(f);
    };
    std::map<int, std::string> cells;
    std::string plan_summary;
    double fwd_us = 0;
    for (int layout : layouts) {
      Step st = make_step(row, std::abs(layout), b, rng, layout < 0);
      const auto [t, summary] = time_step(st);
      us[row.name][layout] = t;
      cells[layout] = figure(t);
      if (layout == 16) {
        plan_summary = summary;
        // The public one-call form: attention_forward plans from max_seqlen_q/k alone.
        flashserve::AttentionParams fp = st.params;
        fp.workspace_bytes = flashserve::attention_workspace_size(fp);
        ensure_workspace(b, fp.workspace_bytes);
        fp.workspace = b.workspace;
        fwd_us = graph_us(
            [&](cudaStream_t s, int) {
              fp.stream = s;
              flashserve::attention_forward(fp);
            },
            calls, reps);
      }
    }
    std::snprintf(line, sizeof line, "| %s | %s | %s | %s | %.2f | %s (%.2f) | %s | %s |\n",
                  row.name.c_str(), cells[0].c_str(), cells[16].c_str(), cells[256].c_str(),
                  us[row.name][16] / us[row.name][0], cells[-16].c_str(),
                  us[row.name][-16] / us[row.name][0], figure(fwd_us).c_str(),
                  plan_summary.c_str());
    emit(line);
    if (!row.parts.empty()) {
      for (int layout : layouts) {
        double sum = 0;
        for (const std::string& part : row.parts) sum += us.at(part).at(layout);
        std::snprintf(line, sizeof line,
                      "|  ↳ sum of parts, %s | %.1f us | mixed / sum %.3f ||||||\n",
                      layout == 0    ? "contiguous"
                      : layout == 16 ? "paged 16"
                      : layout < 0   ? "paged 16 in order"
                                     : "paged 256",
                      sum, us[row.name][layout] / sum);
        emit(line);
      }
    }
  }

  // Decodes of unequal lengths beside equal ones with the same keys, paged 16 with the pages
  // shuffled (as the engine's pool), automatic splits: even (FLASHSERVE_DECODE_BALANCE=0) and by
  // length (=1), each planned from the step's lengths and as a decode graph plans it (no lengths,
  // the longest rounded up to a power of two: model/cuda_runner's kv_bound); and the default
  // (unset: by length where the lengths are unequal, split_policy.h decodes_unequal) from the
  // step's lengths.
  if (decode_spread) {
    emit(
        "\n| decodes | mean keys | lengths | even | by length | even, graph plan | by length, "
        "graph plan | / equal even (even; by length; graph even; graph by length) | default | "
        "plans (even; by length) |\n|---|---|---|---|---|---|---|---|---|---|\n");
    auto time_bound = [&](Step& st) {
      flashserve::AttentionParams p = st.params;
      int bound = 1;
      while (bound < p.max_seqlen_k) bound *= 2;
      p.max_seqlen_k = bound;
      return time_plan(flashserve::plan_attention(p), p);
    };
    for (const auto [n, mean] : spread) {
      const double bytes = kv_bytes(spread_row(n, mean, "equal"));
      auto cell = [&](double x) {
        char f[64];
        std::snprintf(f, sizeof f, "%.1f us (%.2f TB/s)", x, bytes / (x * 1e-6) / 1e12);
        return std::string(f);
      };
      double equal_even = 0;
      for (const char* kind : {"equal", "uniform", "exponential"}) {
        Step st = make_step(spread_row(n, mean, kind), 16, b, rng);
        double t[4];
        std::string plans[2];
        for (int balanced = 0; balanced < 2; ++balanced) {
          setenv("FLASHSERVE_DECODE_BALANCE", balanced ? "1" : "0", 1);
          std::tie(t[balanced], plans[balanced]) = time_step(st);
          t[2 + balanced] = time_bound(st);
        }
        unsetenv("FLASHSERVE_DECODE_BALANCE");
        const auto [t_default, plan_default] = time_step(st);
        const bool default_by_length = plan_default.find("by length") != std::string::npos;
        if (std::string(kind) == "equal") equal_even = t[0];
        std::snprintf(line, sizeof line,
                      "| %d | %d | %s | %s | %s | %s | %s | %.3f; %.3f; %.3f; %.3f | %s, %s | %s; "
                      "%s |\n",
                      n, mean, kind, cell(t[0]).c_str(), cell(t[1]).c_str(), cell(t[2]).c_str(),
                      cell(t[3]).c_str(), t[0] / equal_even, t[1] / equal_even, t[2] / equal_even,
                      t[3] / equal_even, cell(t_default).c_str(),
                      default_by_length ? "by length" : "even", plans[0].c_str(), plans[1].c_str());
        emit(line);
      }
    }
  }

  // Decode rows with forced split counts, beside the automatic ones above.
  if (!decode_splits.empty()) {
    emit(
        "\n| decode batch | splits | contiguous | paged 16 | paged 16, pages in order |\n"
        "|---|---|---|---|---|\n");
    for (const Row& row : split_rows) {
      for (int splits : decode_splits) {
        std::string cells[3];
        int column = 0;
        for (int layout : {0, 16, -16}) {
          Step st = make_step(row, std::abs(layout), b, rng, layout < 0, splits);
          const double t = time_step(st).first;
          char f[64];
          std::snprintf(f, sizeof f, "%.1f us (%.2f TB/s)", t, kv_bytes(row) / (t * 1e-6) / 1e12);
          cells[column++] = f;
        }
        std::snprintf(line, sizeof line, "| %s | %d | %s | %s | %s |\n", row.name.c_str(), splits,
                      cells[0].c_str(), cells[1].c_str(), cells[2].c_str());
        emit(line);
      }
    }
  }
  // The fp8 KV cache beside bf16: the same rows on e4m3 pools (FLASHSERVE_CUDA_FP8_KV turned on
  // here: the benchmark asks for the kernels by flag).
  if (kv_fp8) {
    setenv("FLASHSERVE_CUDA_FP8_KV", "1", 1);
    CUDA_OK(cudaMalloc(&b.k8, kv_elems));
    CUDA_OK(cudaMalloc(&b.v8, kv_elems));
    CUDA_OK(cudaMalloc(&b.descale, 4 * kHkv));
    fill_e4m3<<<1024, 256>>>(b.k8, kv_elems, 4u);
    fill_e4m3<<<1024, 256>>>(b.v8, kv_elems, 5u);
    const std::vector<float> ds(kHkv, 0.5f);
    CUDA_OK(cudaMemcpy(b.descale, ds.data(), 4 * kHkv, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    emit(
        "\n| fp8 KV cache: batch | bf16 paged 16 | e4m3 paged 16 | e4m3 / bf16 | bf16 paged 256 | "
        "e4m3 paged 256 | e4m3 / bf16 | plan (e4m3, paged 16) |\n"
        "|---|---|---|---|---|---|---|---|\n");
    for (const Row& row : rows()) {
      const bool decode = all_decode(row);
      auto figure = [&](double t, double bytes_per_elem) {
        char f[64];
        if (decode)
          std::snprintf(f, sizeof f, "%.1f us (%.2f TB/s)", t,
                        kv_bytes(row) / 2 * bytes_per_elem / (t * 1e-6) / 1e12);
        else
          std::snprintf(f, sizeof f, "%.1f us (%.0f TFLOP/s)", t, flops(row) / (t * 1e-6) / 1e12);
        return std::string(f);
      };
      std::string cells[4], plan_summary;
      double t[4] = {};
      int column = 0;
      for (int page : {16, 256})
        for (bool e4m3 : {false, true}) {
          Step st = make_step(row, page, b, rng);
          if (e4m3) use_e4m3_pools(st, b);
          const auto [us_, summary] = time_step(st);
          t[column] = us_;
          cells[column++] = figure(us_, e4m3 ? 1 : 2);
          if (e4m3 && page == 16) plan_summary = summary;
        }
      std::snprintf(line, sizeof line, "| %s | %s | %s | %.2f | %s | %s | %.2f | %s |\n",
                    row.name.c_str(), cells[0].c_str(), cells[1].c_str(), t[1] / t[0],
                    cells[2].c_str(), cells[3].c_str(), t[3] / t[2], plan_summary.c_str());
      emit(line);
    }
    // With --decode-splits: the decode rows at forced split counts, bf16 beside e4m3 (paged 16),
    // for the fp8 decode tiles' split choice (the plan gives them bf16's splits; the register
    // path's blocks fit six an SM where bf16's fit three: docs/kernel-notes.md).
    if (!decode_splits.empty()) {
      emit(
          "\n| fp8 KV decode batch | splits | bf16 paged 16 | e4m3 paged 16 | e4m3 / bf16 |\n"
          "|---|---|---|---|---|\n");
      for (const Row& row : split_rows) {
        for (int splits : decode_splits) {
          double t[2] = {};
          for (bool e4m3 : {false, true}) {
            Step st = make_step(row, 16, b, rng, false, splits);
            if (e4m3) use_e4m3_pools(st, b);
            t[e4m3] = time_step(st).first;
          }
          std::snprintf(line, sizeof line,
                        "| %s | %d | %.1f us (%.2f TB/s) | %.1f us (%.2f TB/s) | %.2f |\n",
                        row.name.c_str(), splits, t[0], kv_bytes(row) / (t[0] * 1e-6) / 1e12, t[1],
                        kv_bytes(row) / 2 / (t[1] * 1e-6) / 1e12, t[1] / t[0]);
          emit(line);
        }
      }
    }
  }
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f) {
      std::fputs(md.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
