// sm90_trace: where the sm90 forward kernel's time goes, from its own timeline (sm90/trace.h: a
// tuning tile with kTrace records clock64 at each phase of each step, per consumer warpgroup and
// for the producer). A tuning tool, built only with -DFLASHSERVE_TUNING=ON.
//
// Per shape (the FA3 grid's: bf16, batch x L = 16384 tokens, heads x d = 2048): the traced launch
// follows three untraced ones; the table gives each phase's mean cycles per step or per tile over
// every consumer warpgroup of every CTA, and its share of the consumers' time. "ideal" is one
// warpgroup's QK^T + PV alone on the tensor cores (4096 dense FLOP per clock per SM).
// Usage: sm90_trace [variant:L:causal ...], variants d64-192x128, d64-128x128, d128-128x128,
// d128-128x176, d256-128x80, and with session 18's tile boundary (tile_config.h OverlappedEpilogue:
// O by TMA store, the work announced; d256 staged in Q) d64-192x128-epi, d64-128x128-epi,
// d128-128x128-epi, d256-128x80-epi, and the float8_e4m3fn tiles (tile_config.h Fp8Tile: q, k, v in
// e4m3, V^T's pre-pass before the traced launch, descales 1) d64-fp8, d128-fp8, d128-fp8-192,
// d256-fp8 (default: d128-128x128:512:0 d128-128x176:8192:0). "ideal" counts 8192 dense FLOP per
// clock for the fp8 tiles. Each output is hashed (equal hashes: equal bits) and compared with the
// first variant of the same L, causality and head dim run before it (largest and RMS difference
// beside O's RMS).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "../bench_common.h"
#include "sm90_sweep.h"

namespace fb = flashserve::bench;
namespace sm90 = flashserve::attention::sm90;

namespace {

using Runner = void (*)(const sm90::FwdArgs&, uint64_t*);

template <class Cfg, bool kCausal>
void run_traced(const sm90::FwdArgs& a, uint64_t* trace) {
  sm90::FwdParams p = sm90::fwd_params(a);
  p.trace = trace;
  sm90::launch<Cfg, true, kCausal>(p, a);
}

struct Variant {
  int d, block_m, block_n;
  Runner run[2];  // non-causal, causal
  bool fp8 = false;
};

template <int kD, int kM, int kN, bool kLazy = false, bool kEpilogue = false>
Variant variant() {
  using Base = sm90::TileConfig<kD, kM, kN, 2, /*kLazyRescale=*/kLazy, /*kTmaStoreO=*/false,
                                /*kTrace=*/true>;
  // The boundary as the kernel has it (staged in Q where O has no buffer of its own, which
  // EpilogueTile leaves out: it measured slower), to see where its time goes.
  using Cfg =
      std::conditional_t<kEpilogue, sm90::OverlappedEpilogue<Base, sm90::kOwnEpilogueBuffer<Base>>,
                         Base>;
  return {kD, kM, kN, {run_traced<Cfg, false>, run_traced<Cfg, true>}};
}

// An fp8 tile with the timeline on (the kernel reads Cfg::kTrace).
template <class Cfg>
struct Traced : Cfg {
  static constexpr bool kTrace = true;
};

// V^T's pre-pass (untraced), then the traced fp8 kernel; `a` carries the e4m3 buffers and V^T's
// workspace (main).
template <class Cfg, bool kCausal>
void run_traced_fp8(const sm90::FwdArgs& a, uint64_t* trace) {
  sm90::transpose_v<Cfg::kHeadDim>(a, Cfg::kBlockN);
  sm90::FwdParams p = sm90::fwd_params(a);
  p.trace = trace;
  sm90::launch<Traced<Cfg>, true, kCausal>(p, a);
}

template <int kD, int kN>
Variant fp8_variant() {
  using Cfg = typename sm90::Fp8Tile<kD, kN>::type;
  return {kD,
          Cfg::kBlockM,
          Cfg::kBlockN,
          {run_traced_fp8<Cfg, false>, run_traced_fp8<Cfg, true>},
          true};
}

double bf16_to_double(uint16_t x) {
  uint32_t bits = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Mean cycles of named phases.
struct Phases {
  std::vector<std::string> order;
  std::map<std::string, std::pair<double, long>> sum;
  void add(const std::string& name, uint64_t cycles) {
    if (!sum.count(name)) order.push_back(name);
    sum[name].first += static_cast<double>(cycles);
    sum[name].second += 1;
  }
};

void analyse(const std::vector<uint64_t>& buf, int ctas, int consumers, double ideal_step,
             double elapsed_ms) {
  Phases ph;
  double consumer_cycles = 0;
  uint64_t span = 0;
  for (int b = 0; b < ctas; ++b) {
    uint64_t first = UINT64_MAX, last = 0;
    for (int role = 0; role < sm90::kTraceRoles; ++role) {
      const uint64_t* r = buf.data() + (int64_t{b} * sm90::kTraceRoles + role) * sm90::kTraceCap;
      for (int i = 0; i < sm90::kTraceCap && r[i] != 0; ++i) {
        first = std::min(first, r[i] >> 8);
        last = std::max(last, r[i] >> 8);
      }
    }
    if (last > first) span = std::max(span, last - first);
    for (int c = 0; c < consumers; ++c) {
      const uint64_t* r = buf.data() + (int64_t{b} * sm90::kTraceRoles + 1 + c) * sm90::kTraceCap;
      uint64_t t_prev[32] = {};  // the last time of each event
      uint64_t epi_end = 0, tile_read = 0, step_end = 0;
      int block = 0;
      for (int i = 0; i < sm90::kTraceCap && r[i] != 0; ++i) {
        const uint32_t e = r[i] & 0xff;
        const uint64_t t = r[i] >> 8;
        t_prev[e] = t;
        switch (e) {
          case sm90::kTileRead:
            if (epi_end) ph.add("tile: gap after the previous epilogue", t - epi_end);
            tile_read = t;
            block = 0;
            break;
          case sm90::kQReady:
            ph.add("tile: wait for Q", t - tile_read);
            break;
          case sm90::kTurn:
            ph.add(block == 0 ? "first block: wait for the turn" : "step: wait for the turn",
                   t - (block == 0 ? t_prev[sm90::kQReady] : step_end));
            break;
          case sm90::kKReady:
            ph.add(block == 0 ? "first block: wait for K" : "step: wait for K",
                   t - t_prev[sm90::kTurn]);
            break;
          case sm90::kIssued:
            ph.add(block == 0 ? "first block: issue" : "step: wait for V, issue",
                   t - t_prev[sm90::kKReady]);
            break;
          case sm90::kSReady:
            ph.add(block == 0 ? "first block: S ready" : "step: S ready",
                   t - t_prev[sm90::kIssued]);
            break;
          case sm90::kSoftmaxDone:
            ph.add(block == 0 ? "first block: softmax" : "step: softmax",
                   t - t_prev[sm90::kSReady]);
            break;
          case sm90::kPvDone:
            ph.add("step: wait for PV", t - t_prev[sm90::kSoftmaxDone]);
            break;
          case sm90::kStepEnd:
            ph.add(block == 0 ? "first block: zero O, P" : "step: rescale O, P",
                   t - t_prev[block == 0 ? sm90::kSoftmaxDone : sm90::kPvDone]);
            step_end = t;
            ++block;
            break;
          case sm90::kEpilogueStart:
            ph.add("tile: last PV", t - step_end);
            break;
          case sm90::kEpilogueFree:
            ph.add("epilogue: staging free", t - t_prev[sm90::kEpilogueStart]);
            break;
          case sm90::kEpilogueWritten:
            ph.add("epilogue: O and LSE written",
                   t - std::max(t_prev[sm90::kEpilogueFree], t_prev[sm90::kEpilogueStart]));
            break;
          case sm90::kEpilogueSynced:
            ph.add("epilogue: fenced and synced", t - t_prev[sm90::kEpilogueWritten]);
            break;
          case sm90::kEpilogueEnd:
            if (t_prev[sm90::kEpilogueSynced] > t_prev[sm90::kEpilogueStart])
              ph.add("epilogue: TMA stores issued", t - t_prev[sm90::kEpilogueSynced]);
            ph.add("tile: epilogue", t - t_prev[sm90::kEpilogueStart]);
            ph.add("tile: total", t - tile_read);
            consumer_cycles += static_cast<double>(t - tile_read);
            epi_end = t;
            break;
          default:
            break;
        }
      }
    }
  }
  // Q's round trip, tile by tile (the k-th Q the producer issues is the k-th tile with keys of
  // every consumer): from the previous tile's last S ready (the last of the consumers': Q is
  // released after it) to the producer's issue, and from the issue to each consumer's Q ready.
  for (int b = 0; b < ctas; ++b) {
    std::vector<uint64_t> q_issue;
    const uint64_t* pr = buf.data() + int64_t{b} * sm90::kTraceRoles * sm90::kTraceCap;
    for (int i = 0; i < sm90::kTraceCap && pr[i] != 0; ++i)
      if ((pr[i] & 0xff) == sm90::kProducerQ) q_issue.push_back(pr[i] >> 8);
    std::vector<uint64_t> released(q_issue.size() + 1, 0);  // tile k's Q free: max last S ready
    std::vector<std::vector<uint64_t>> ready(consumers);
    for (int c = 0; c < consumers; ++c) {
      const uint64_t* r = buf.data() + (int64_t{b} * sm90::kTraceRoles + 1 + c) * sm90::kTraceCap;
      uint64_t last_s = 0;
      for (int i = 0; i < sm90::kTraceCap && r[i] != 0; ++i) {
        const uint32_t e = r[i] & 0xff;
        const uint64_t t = r[i] >> 8;
        if (e == sm90::kQReady) {
          const size_t k = ready[c].size();
          if (k > 0 && k - 1 < released.size()) released[k - 1] = std::max(released[k - 1], last_s);
          ready[c].push_back(t);
        }
        if (e == sm90::kSReady) last_s = t;
      }
    }
    for (size_t k = 0; k < q_issue.size(); ++k) {
      if (k > 0 && released[k - 1] != 0 && q_issue[k] > released[k - 1])
        ph.add("Q: the tile before's last S ready to the issue", q_issue[k] - released[k - 1]);
      for (int c = 0; c < consumers; ++c)
        if (k < ready[c].size() && ready[c][k] > q_issue[k])
          ph.add("Q: issue to ready", ready[c][k] - q_issue[k]);
    }
  }
  std::printf("kernel %.1f us; longest CTA %llu cycles (%.0f MHz); ideal step %.0f cycles\n\n",
              elapsed_ms * 1e3, static_cast<unsigned long long>(span), span / (elapsed_ms * 1e3),
              ideal_step);
  std::printf("| phase | count | mean cycles | share of consumer time |\n|---|---|---|---|\n");
  for (const auto& name : ph.order) {
    const auto& [total, n] = ph.sum[name];
    // Q's round trip is the producer's and spans consumer phases: no share of theirs.
    if (name.rfind("Q: ", 0) == 0)
      std::printf("| %s | %ld | %.0f | - |\n", name.c_str(), n, total / n);
    else
      std::printf("| %s | %ld | %.0f | %.1f%% |\n", name.c_str(), n, total / n,
                  name == "tile: total" ? 100.0 : 100.0 * total / consumer_cycles);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, Variant> variants{
      {"d64-192x128", variant<64, 192, 128>()},
      {"d64-128x128", variant<64, 128, 128>()},
      {"d128-128x128", variant<128, 128, 128>()},
      {"d128-128x176", variant<128, 128, 176>()},
      {"d256-128x80", variant<256, 128, 80, true>()},
      {"d64-192x128-epi", variant<64, 192, 128, false, true>()},
      {"d64-128x128-epi", variant<64, 128, 128, false, true>()},
      {"d128-128x128-epi", variant<128, 128, 128, false, true>()},
      {"d256-128x80-epi", variant<256, 128, 80, true, true>()},
      {"d64-fp8", fp8_variant<64, 128>()},
      {"d128-fp8", fp8_variant<128, 128>()},
      {"d128-fp8-192", fp8_variant<128, 192>()},
      {"d256-fp8", fp8_variant<256, 128>()},
  };
  std::vector<std::string> specs;
  for (int i = 1; i < argc; ++i) specs.push_back(argv[i]);
  if (specs.empty()) specs = {"d128-128x128:512:0", "d128-128x176:8192:0"};
  int sms = 0, l2 = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CUDA_OK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  constexpr int kTokens = 16384, kHidden = 2048;
  const int64_t elems = int64_t{kTokens} * kHidden;
  uint16_t *q, *k, *v, *out;
  for (auto** b : {&q, &k, &v, &out}) CUDA_OK(cudaMalloc(b, elems * 2));
  float* lse = nullptr;
  CUDA_OK(cudaMalloc(&lse, int64_t{kTokens} * 64 * sizeof(float)));
  int* counter = nullptr;
  CUDA_OK(cudaMalloc(&counter, sizeof(int)));
  fill_random<<<1024, 256>>>(q, elems, 1);
  fill_random<<<1024, 256>>>(k, elems, 2);
  fill_random<<<1024, 256>>>(v, elems, 3);
  // The fp8 variants' q, k, v (the same values times 4, as e4m3); V^T's workspace per shape.
  uint8_t *q8, *k8, *v8, *vt = nullptr;
  int64_t vt_bytes = 0;
  for (auto** b : {&q8, &k8, &v8}) CUDA_OK(cudaMalloc(b, elems));
  to_e4m3<<<1024, 256>>>(q, q8, elems, 4.0f);
  to_e4m3<<<1024, 256>>>(k, k8, elems, 4.0f);
  to_e4m3<<<1024, 256>>>(v, v8, elems, 4.0f);
  CUDA_OK(cudaGetLastError());
  const size_t trace_words = size_t(sms) * sm90::kTraceRoles * sm90::kTraceCap;
  uint64_t* trace = nullptr;
  CUDA_OK(cudaMalloc(&trace, trace_words * 8));
  std::vector<uint64_t> host(trace_words);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t t0, t1;
  CUDA_OK(cudaEventCreate(&t0));
  CUDA_OK(cudaEventCreate(&t1));
  std::map<std::string, std::pair<std::string, std::vector<uint16_t>>> first_output;
  for (const auto& spec : specs) {
    char name[64];
    int L = 0, causal = 0;
    if (std::sscanf(spec.c_str(), "%63[^:]:%d:%d", name, &L, &causal) != 3 ||
        !variants.count(name) || L <= 0 || kTokens % L) {
      std::fprintf(stderr, "sm90_trace: bad shape '%s' (variant:L:causal)\n", spec.c_str());
      return 2;
    }
    const Variant& var = variants.at(name);
    sm90::FwdArgs a = fb::grid_args(q, k, v, out, lse, counter, var.d, L, causal != 0, kTokens,
                                    kHidden, sms, l2, stream);
    if (var.fp8) {
      a.q = q8;
      a.k = k8;
      a.v = v8;
      a.dtype = flashserve::DType::kFloat8E4M3;
      a.vt_keys = sm90::fp8_vt_keys(L);
      const int64_t need = int64_t{kHidden} * (kTokens / L) * a.vt_keys;  // batch x h x d x keys
      if (need > vt_bytes) {
        CUDA_OK(cudaFree(vt));
        CUDA_OK(cudaMalloc(&vt, need));
        vt_bytes = need;
      }
      a.vt = vt;
      a.fp8_block_n = var.block_n;
    }
    const Runner run = var.run[causal != 0];
    for (int i = 0; i < 3; ++i) run(a, nullptr);
    // O poisoned (0xffff: a bf16 NaN) before the traced launch, hashed after it: variants of one
    // tile that must compute the same bits print the same hash.
    CUDA_OK(cudaMemsetAsync(out, 0xff, elems * 2, stream));
    CUDA_OK(cudaMemsetAsync(trace, 0, trace_words * 8, stream));
    CUDA_OK(cudaEventRecord(t0, stream));
    run(a, trace);
    CUDA_OK(cudaEventRecord(t1, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
    CUDA_OK(cudaMemcpy(host.data(), trace, trace_words * 8, cudaMemcpyDeviceToHost));
    const double flops = 4.0 * kTokens * double(L) * kHidden / (causal ? 2 : 1);
    std::printf("## %s, L %d, %s: %.1f TFLOP/s in the traced launch\n\n", name, L,
                causal ? "causal" : "non-causal", flops / (ms * 1e-3) / 1e12);
    const double ideal_step = 2.0 * 2 * 64 * var.block_n * var.d / (var.fp8 ? 8192.0 : 4096.0);
    analyse(host, sms, var.block_m / 64, ideal_step, ms);
    std::vector<uint16_t> o(static_cast<size_t>(elems));
    CUDA_OK(cudaMemcpy(o.data(), out, elems * 2, cudaMemcpyDeviceToHost));
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over O's bits
    int64_t nan = 0;
    for (const uint16_t x : o) {
      hash = (hash ^ x) * 1099511628211ull;
      nan += (x & 0x7f80) == 0x7f80 && (x & 0x7f) != 0;
    }
    std::printf("output: hash %016llx, %lld NaN of %lld\n", static_cast<unsigned long long>(hash),
                static_cast<long long>(nan), static_cast<long long>(elems));
    // Against the first variant of this L, causality and head dim: the largest difference and the
    // RMS of the differences, beside O's RMS (a variant that computes other bits, -h2, must stay
    // within its rounding; one that permutes P wrongly is off by O's size).
    const std::string key = std::to_string(L) + ":" + std::to_string(causal) + ":" +
                            std::to_string(var.d) + (var.fp8 ? ":fp8" : "");
    if (!first_output.count(key)) {
      first_output[key] = {name, o};
    } else {
      const auto& [ref_name, ref] = first_output[key];
      double max_diff = 0, sq = 0, ref_sq = 0;
      for (size_t i = 0; i < o.size(); ++i) {
        const double a = bf16_to_double(o[i]), b = bf16_to_double(ref[i]);
        max_diff = std::max(max_diff, std::abs(a - b));
        sq += (a - b) * (a - b);
        ref_sq += b * b;
      }
      std::printf("against %s: max |diff| %.3g, RMS diff %.3g, RMS of O %.3g\n", ref_name.c_str(),
                  max_diff, std::sqrt(sq / double(o.size())), std::sqrt(ref_sq / double(o.size())));
    }
    std::printf("\n");
  }
  return 0;
}
