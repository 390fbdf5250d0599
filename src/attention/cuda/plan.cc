#include "plan.h"

#include <algorithm>
#include <sstream>

#include "attention/kernel/split_items.h"
#include "attention/sm80/tile_config.h"
#include "attention/sm90/tile_config.h"
#include "common/env_switch.h"
#include "common/str_cat.h"
#include "flashserve/error.h"

namespace flashserve::attention {

int32_t clamp_window(int64_t side, int64_t bound) {
  return side < 0 || side > bound ? -1 : int32_t(side);
}

size_t partial_bytes(int64_t splits, int64_t rows, int64_t h_q, int64_t head_dim) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(splits) * rows * h_q * (head_dim + 1) * sizeof(float);
}

void check_cuda_head_dims(const Problem& pr) {
  for (const auto& [d, arg] : {std::pair{pr.head_dim, "q"}, std::pair{pr.head_dim_v, "v"}})
    if (d < 32 || d > 256 || d % 8 != 0)
      throw Error(
          ErrorKind::kUnsupported, arg,
          str_cat("head_dim ", d,
                  " is not supported by the CUDA kernels (a multiple of 8 from 32 to 256)"));
}

namespace {

bool padded(const Problem& pr) {
  return sm80::padded_head_dims(static_cast<int>(pr.head_dim), static_cast<int>(pr.head_dim_v));
}

}  // namespace

void refuse_padded_if_off(const Problem& pr, const char* value) {
  if (!padded(pr) || env_switch(value, "FLASHSERVE_PADDED_HEAD_DIMS", kPaddedHeadDimsByDefault))
    return;
  throw Error(ErrorKind::kUnsupported, "q",
              str_cat("head dims ", pr.head_dim, "/", pr.head_dim_v,
                      " run on the padded sm80 kernels, which FLASHSERVE_PADDED_HEAD_DIMS=0 "
                      "turned off: unset it or set FLASHSERVE_PADDED_HEAD_DIMS=1 to turn them on "
                      "(64, 128 and 256 with equal q and v head dims run without it)"));
}

namespace {
// The call's problem as one launch's group of sequences sees it: its own count and longest
// lengths (the split choices follow the group's shape).
Problem group_problem(const Problem& pr, int64_t sequences, int64_t max_q_len, int64_t max_kv_len) {
  Problem group = pr;
  group.batch = std::max<int64_t>(sequences, 1);
  group.max_q_len = max_q_len;
  group.max_kv_len = max_kv_len;
  return group;
}
}  // namespace

KernelChoice choose_kernel(const Problem& pr, const SplitDevice& dev, bool decode,
                           int64_t sequences, int64_t max_q_len, int64_t max_kv_len, bool may_split,
                           bool kv_fp8_register) {
  KernelChoice k;
  // The sm80 plan; the default dispatch replaces it by one sm90 launch where sm90 is measured
  // faster (sm90_preferred below), FLASHSERVE_KERNEL forces either family.
  k.family = KernelFamily::kSm80;
  k.decode = decode;
  const int64_t bound = pr.max_q_len + pr.max_kv_len;
  k.head_dim =
      sm80::kernel_head_dim(static_cast<int>(pr.head_dim), static_cast<int>(pr.head_dim_v));
  k.padded = padded(pr);
  // Score modifiers and padded head dims run on the masked prefill tiles whatever the mask: only
  // those (and the decode tiles) have modifier and padded kernels (sm80/launch_template.h
  // launch_score_mod, run_fwd_padded_impl), and an unbounded window there masks only the keys
  // past kv_len.
  // The fp8 KV kernels exist for decode and masked prefill tiles only, as the padded ones.
  k.kv_fp8 = kv_fp8(pr);
  k.kv_fp8_register = k.kv_fp8 && decode && kv_fp8_register;
  k.masked = !decode &&
             (pr.score_mod.any() || k.padded || k.kv_fp8 ||
              clamp_window(pr.mask.left, bound) >= 0 || clamp_window(pr.mask.right, bound) >= 0);
  k.paged = pr.paged;
  // Splits follow the group's own shape: its sequences and their longest lengths.
  Problem group = group_problem(pr, sequences, max_q_len, max_kv_len);
  if (group.num_splits == 0 && !may_split) group.num_splits = 1;
  k.splits = choose_splits(group, dev, decode, k.kv_fp8_register);
  const sm80::Tiles t =
      decode ? sm80::decode_tiles(k.head_dim) : sm80::fwd_tiles(k.head_dim, k.masked);
  k.block_m = t.block_m;
  k.block_n = t.block_n;
  return k;
}

std::string sm90_lacks(const Problem& pr, const PlanContext& ctx) {
  if (!ctx.sm90_unavailable.empty()) return ctx.sm90_unavailable;
  if (kv_fp8(pr)) return "float8_e4m3fn K/V beside a 16-bit q (the fp8 KV cache runs on sm80)";
  if (pr.head_dim != 64 && pr.head_dim != 128 && pr.head_dim != 256)
    return str_cat("head_dim ", pr.head_dim, " (64, 128 and 256 only; sm80 runs the others)");
  if (pr.head_dim_v != pr.head_dim)
    return str_cat("head_dim_v ", pr.head_dim_v, " differs from head_dim ", pr.head_dim,
                   " (sm80 runs unequal head dims)");
  if (pr.paged && pr.page_size % 8 != 0)
    return str_cat("page size ", pr.page_size, " (paged K/V needs a multiple of 8)");
  if (pr.num_splits > 1) return "split-KV is not supported yet";
  if (pr.score_mod.capped()) return "logit soft-capping (softcap) is not supported";
  if (pr.score_mod.has_alibi()) return "ALiBi (alibi_slopes) is not supported";
  return "";
}

bool parse_fp8_attention(const char* value) {
  return env_switch(value, "FLASHSERVE_FP8_ATTENTION", kFp8AttentionByDefault);
}

bool parse_sm90_bwd_dq_bulk(const char* value) {
  return env_switch(value, "FLASHSERVE_SM90_BWD_DQ_BULK", kSm90BwdDqBulkByDefault);
}

bool parse_sm90_bwd_overlap(const char* value, int64_t head_dim) {
  return env_switch(value, "FLASHSERVE_SM90_BWD_OVERLAP", sm90_bwd_overlap_by_default(head_dim));
}

bool parse_sm90_bwd_heavy_first(const char* value) {
  return env_switch(value, "FLASHSERVE_SM90_BWD_HEAVY_FIRST", kSm90BwdHeavyFirstByDefault);
}

bool parse_sm90_bwd_persistent(const char* value, int64_t head_dim, bool masked,
                               int64_t max_kv_len) {
  return env_switch(value, "FLASHSERVE_SM90_BWD_PERSISTENT",
                    sm90_bwd_persistent_by_default(head_dim, masked, max_kv_len));
}

bool parse_sm90_bwd_fused_dq(const char* value) {
  return env_switch(value, "FLASHSERVE_SM90_BWD_FUSED_DQ", kSm90BwdFusedDqByDefault);
}

bool parse_sm90_bwd_d256(const char* value) {
  return env_switch(value, "FLASHSERVE_SM90_BWD_D256", kSm90BwdD256ByDefault);
}

bool parse_sm90_epilogue(const char* value) {
  return env_switch(value, "FLASHSERVE_SM90_EPILOGUE", kSm90EpilogueByDefault);
}

bool parse_sm90_exp2_fma(const char* value) {
  return env_switch(value, "FLASHSERVE_SM90_EXP2_FMA", kSm90Exp2FmaByDefault);
}

int parse_fp8_block_n(const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  if (std::string(value) == "128") return 128;
  if (std::string(value) == "192") return 192;
  throw Error(ErrorKind::kInvalidArgument, "FLASHSERVE_FP8_BLOCK_N",
              str_cat("must be 128 or 192, got \"", value, "\""));
}

void refuse_fp8_if_off(const Problem& pr, bool fp8_attention) {
  if (pr.dtype != DType::kFloat8E4M3 || fp8_attention) return;
  throw Error(ErrorKind::kUnsupported, "q",
              "float8_e4m3fn attention on CUDA runs on the sm90 fp8 forward, which "
              "FLASHSERVE_FP8_ATTENTION=0 turned off: unset it or set FLASHSERVE_FP8_ATTENTION=1 "
              "to turn it on (or run the call on the CPU)");
}

Fp8Lack sm90_fp8_lacks(const Problem& pr, const PlanContext& ctx) {
  if (!ctx.sm90_unavailable.empty()) return {"q", "needs the sm90 kernel: " + ctx.sm90_unavailable};
  if (!sm90::fp8_head_dim(static_cast<int>(pr.head_dim)))
    return {"q", str_cat("head_dim ", pr.head_dim, " (64, 128 and 256 only)")};
  if (pr.head_dim_v != pr.head_dim)
    return {"v", str_cat("head_dim_v ", pr.head_dim_v, " differs from head_dim ", pr.head_dim,
                         " (equal head dims only)")};
  if (pr.paged) return {"block_table", "paged K/V is not supported yet"};
  if (pr.num_splits > 1) return {"num_splits", "split-KV is not supported yet"};
  if (pr.score_mod.capped()) return {"softcap", "logit soft-capping is not supported"};
  if (pr.score_mod.has_alibi()) return {"alibi_slopes", "ALiBi is not supported"};
  return {};
}

bool parse_fp8_kv_cache(const char* value) {
  return env_switch(value, "FLASHSERVE_CUDA_FP8_KV", kFp8KvCacheByDefault);
}

DecodeBalance parse_decode_balance(const char* value) {
  if (value == nullptr || *value == '\0') return kDecodeBalanceByDefault;
  return env_switch(value, "FLASHSERVE_DECODE_BALANCE", false) ? DecodeBalance::kAlways
                                                               : DecodeBalance::kOff;
}

bool parse_decode_cluster(const char* value) {
  return env_switch(value, "FLASHSERVE_DECODE_CLUSTER", kDecodeClusterByDefault);
}

bool parse_kv_fp8_register(const char* value) {
  return env_switch(value, "FLASHSERVE_KV_FP8_REGISTER", kKvFp8RegisterByDefault);
}

Fp8Lack fp8_kv_lacks(const Problem& pr, const PlanContext& ctx) {
  if (!ctx.fp8_kv_cache)
    return {"k",
            "float8_e4m3fn K/V beside a 16-bit q (an fp8 KV cache) run on the CUDA fp8 KV "
            "kernels, which are off by default (correct, but slower than bf16's until their "
            "staging is asynchronous: docs/fp8.md): set FLASHSERVE_CUDA_FP8_KV=1 to turn them on "
            "(or run the call on the CPU)"};
  if (pr.dtype != DType::kBFloat16)
    return {"q", str_cat("dtype ", dtype_name(pr.dtype),
                         ": the fp8 KV kernels take a bfloat16 q (float16 is not built)")};
  if (!pr.paged)
    return {"block_table", "the fp8 KV kernels read paged K/V only (the fp8 KV cache's layout)"};
  if (pr.head_dim != 64 && pr.head_dim != 128 && pr.head_dim != 256)
    return {"q", str_cat("head_dim ", pr.head_dim, " (the fp8 KV kernels have 64, 128 and 256)")};
  if (pr.head_dim_v != pr.head_dim)
    return {"v", str_cat("head_dim_v ", pr.head_dim_v, " differs from head_dim ", pr.head_dim,
                         " (the fp8 KV kernels need equal head dims)")};
  if (pr.score_mod.capped()) return {"softcap", "the fp8 KV kernels have no soft-capping"};
  if (pr.score_mod.has_alibi()) return {"alibi_slopes", "the fp8 KV kernels have no ALiBi"};
  if (ctx.family == FamilyRequest::kSm90)
    return {"FLASHSERVE_KERNEL",
            "sm90: no sm90 kernel reads an fp8 KV cache (the sm80 kernels do: unset "
            "FLASHSERVE_KERNEL)"};
  return {};
}

size_t fp8_vt_bytes(const Problem& pr) {
  return static_cast<size_t>(pr.batch) * pr.h_kv * pr.head_dim * sm90::fp8_vt_keys(pr.max_kv_len);
}

FamilyRequest parse_family_request(const char* value, const char* variable) {
  if (value == nullptr || *value == '\0' || std::string(value) == "auto")
    return FamilyRequest::kAuto;
  if (std::string(value) == "sm80") return FamilyRequest::kSm80;
  if (std::string(value) == "sm90") return FamilyRequest::kSm90;
  throw Error(ErrorKind::kInvalidArgument, variable,
              str_cat("must be auto, sm80 or sm90, got \"", value, "\""));
}

std::string sm90_backward_lacks(const Problem& pr, bool deterministic,
                                const std::string& sm90_unavailable, bool d256) {
  if (!sm90_unavailable.empty()) return sm90_unavailable;
  // Past 128 (multiples of 8, check_cuda_head_dims): the d256 kernel, padded below 256.
  const bool wide = pr.head_dim > 128 && pr.head_dim <= 256;
  if (wide && !d256)
    return str_cat("head_dim ", pr.head_dim,
                   " (the sm90 backward's d256 kernel is off: FLASHSERVE_SM90_BWD_D256=0)");
  if (pr.head_dim != 64 && pr.head_dim != 128 && !wide)
    return str_cat("head_dim ", pr.head_dim,
                   " (the sm90 backward has 64, 128 and, with FLASHSERVE_SM90_BWD_D256=1, "
                   "136-256)");
  if (pr.score_mod.any()) return "score modifiers (softcap, alibi_slopes)";
  if (deterministic)
    return "deterministic mode (bit-identical dq runs on sm80's fixed-order dq kernel)";
  return "";
}

KernelFamily choose_backward_family(const Problem& pr, bool deterministic, FamilyRequest request,
                                    const std::string& sm90_unavailable, bool d256) {
  if (request == FamilyRequest::kSm80) return KernelFamily::kSm80;
  const std::string lacks = sm90_backward_lacks(pr, deterministic, sm90_unavailable, d256);
  if (request == FamilyRequest::kSm90 && !lacks.empty())
    throw Error(ErrorKind::kUnsupported, "FLASHSERVE_BWD_KERNEL", "sm90: " + lacks);
  const bool sm90 = request == FamilyRequest::kSm90 || kSm90BackwardByDefault;
  return sm90 && lacks.empty() ? KernelFamily::kSm90 : KernelFamily::kSm80;
}

namespace {

constexpr size_t kAlign = 256;  // each launch's partials start on their own 256-byte boundary

size_t aligned(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// Lays launch l's workspace out at the plan's end: the tile counter (sm90 masked) or the split
// partials, then (a length-aware decode launch) its item map, then (fp8) V^T.
void place_workspace(Plan& plan, LaunchPlan& l, const Problem& pr) {
  l.workspace_offset = plan.workspace_bytes;
  plan.workspace_bytes +=
      aligned(l.kernel.tile_counter ? sizeof(int32_t)
              : l.kernel.cluster_combine
                  ? 0  // the partials stay in the cluster's shared memory
                  : partial_bytes(l.kernel.splits, l.rows, pr.h_q, l.kernel.head_dim));
  l.map_offset = plan.workspace_bytes;
  if (l.kernel.split_min_blocks > 0)
    plan.workspace_bytes += aligned(split_map_bytes(l.rows, l.kernel.splits));
  l.vt_offset = plan.workspace_bytes;
  if (l.kernel.fp8) plan.workspace_bytes += aligned(fp8_vt_bytes(pr));
}

// Whether the sm90 kernel runs its masked instantiation: causal or a window narrower than the
// sequences.
bool sm90_masked(const Problem& pr) {
  const int64_t bound = pr.max_q_len + pr.max_kv_len;
  return clamp_window(pr.mask.left, bound) >= 0 || clamp_window(pr.mask.right, bound) >= 0;
}

// The default dispatch takes sm90 for a launch where it was measured faster than the sm80
// kernel `k` the launch would otherwise run: prefill-sized launches with at least one full
// 128-row query tile and at least 512 keys (bench_sm90 over the FA3 grid, H200,
// bench/results/sm90-h200-2026-12-01-run32-34.md: d128 and d256 at 256 keys 0.99-1.17x, at 512
// 1.24-1.47x; d64 at 256 0.97x. d64 causal at 512 was 0.94x until its ShortTile: in session
// 10's run 40 sm90 ran it at 224 TFLOP/s against sm80's 180 in run 41,
// bench/results/sm90-h200-2026-12-01-session10.md). Varlen, seqused_k, paged K/V and windows
// take it too (session 13, bench/results/sm90-h200-2026-12-02-session13.md: varlen 1.73-2.21x,
// a 4096-key window 1.86-2.16x, the engine's 512-token chunks over paged 1k-8k keys 1.1-2.6x).
// Never for decode launches (sm80 packs a query's heads into one tile; sm90 would spend a
// 128-row tile on one row), and where sm80 splits the keys only when sm90's unsplit tiles still
// fill two thirds of the SMs: sm90 has no split-KV yet, so a few query tiles over long keys
// would leave most SMs idle. Measured at 128 tiles on 132 SMs (a 512-token chunk over 4k keys
// at d128: sm90 unsplit 52 us against sm80's 3 splits 136 us) and at 96 (the same chunk at d64,
// 192-row tiles: 51 us against 73, and 83 against 99 on 16-key pages; session 14); fewer
// tiles are unmeasured and stay on sm80. On 16-key pages (copied by cp.async at d64 and
// d128, one TMA box per page at d256: tile_config.h) sm90 ran the engine's 512-token chunks
// 16-32% faster than sm80 at every head dim (bench_serve_attn --head-dim 64/128/256, session 14,
// bench/results/sm90-h200-2026-12-02-session14.md).
bool sm90_preferred(const Problem& pr, const PlanContext& ctx, const KernelChoice& k, int64_t rows,
                    int64_t max_q_len, int64_t max_kv_len) {
  if (!sm90_lacks(pr, ctx).empty() || k.decode) return false;
  if (max_q_len < 128 || max_kv_len < 512) return false;
  const sm90::TileShape tile =
      sm90::tile_shape(static_cast<int>(pr.head_dim), sm90_masked(pr), max_kv_len);
  const int64_t tiles = (rows + tile.block_m - 1) / tile.block_m * pr.h_q;
  if (k.splits > 1 && tiles * 3 < int64_t{ctx.device.sms} * 2) return false;
  return true;
}

// The sm90 kernel for a launch whose keys are at most max_kv_len: no splits; masked tiles differ
// in cost, so the persistent CTAs take them from a counter (16 bytes of the workspace, zeroed
// before the launch). attention_forward without a workspace gets the counter from a stream-ordered
// scratch allocation, as explicit splits get their partials: one CTA a tile instead ran d64 causal
// 512 in 31 waves at 0.59x cuDNN (session 36, H100).
KernelChoice sm90_kernel(const Problem& pr, const PlanContext& ctx, int64_t max_kv_len) {
  KernelChoice k;
  k.family = KernelFamily::kSm90;
  k.masked = sm90_masked(pr);
  k.paged = pr.paged;
  k.tile_counter = k.masked;
  k.epilogue = ctx.sm90_epilogue;
  k.head_dim = static_cast<int>(pr.head_dim);
  k.exp2_fma = ctx.sm90_exp2_fma && sm90::exp2_fma_head_dim(k.head_dim);
  const sm90::TileShape tile =
      sm90::tile_shape(static_cast<int>(pr.head_dim), k.masked, max_kv_len);
  k.block_m = tile.block_m;
  k.block_n = tile.block_n;
  return k;
}

// Whether this call's decode launches merge their splits in a cluster: the switch is on, the
// device has clusters, and the launch runs the plain sm80 kernel (fwd_kernel: no modifiers, no
// padded head dims, 16-bit K/V). Their partials then need no workspace, so they split
// automatically without one too.
bool cluster_decodes(const Problem& pr, const PlanContext& ctx) {
  return ctx.decode_cluster && ctx.clusters && !padded(pr) && !kv_fp8(pr) && !pr.score_mod.any();
}

// The sm80 decode launch `k` of such a call merges its splits in a cluster if it has 2 to
// sm80::kClusterCombineMaxSplits of them. Automatic splits above that are brought down to it: a
// decode graph plans for a power-of-two bound of keys (a batch-1 decode over 1k keys replays a
// plan for 2k: 32 splits of one key block, half of them past its keys), and each split's share
// follows its own sequence's keys (kernel/block_mask.h keep_split).
void take_cluster_combine(const Problem& pr, const PlanContext& ctx, KernelChoice& k) {
  if (!cluster_decodes(pr, ctx) || k.family != KernelFamily::kSm80 || !k.decode) return;
  if (pr.num_splits == 0) k.splits = std::min(k.splits, sm80::kClusterCombineMaxSplits);
  k.cluster_combine = k.splits >= 2 && k.splits <= sm80::kClusterCombineMaxSplits;
}

// Whether the decodes among sequences [begin, end) have lengths unequal enough for the split by
// length (split_policy.h decodes_unequal, on the key blocks of k's tile under the window); false
// where the host lengths are unknown.
bool host_decodes_unequal(const Problem& pr, const HostLengths& lens, int64_t begin, int64_t end,
                          const KernelChoice& k) {
  if (!lens.known()) return false;
  const int left = clamp_window(pr.mask.left, pr.max_q_len + pr.max_kv_len);
  int64_t longest = 0, total = 0, decodes = 0;
  for (int64_t b = begin; b < end; ++b) {
    if (lens.q_start[b + 1] - lens.q_start[b] != 1) continue;
    const int64_t blocks =
        kernel::decode_key_blocks(static_cast<int>(lens.kv_len[b]), left, k.block_n);
    longest = std::max(longest, blocks);
    total += blocks;
    ++decodes;
  }
  return decodes_unequal(longest, total, decodes);
}

// The sm80 decode launch `k` of sequences [seq_begin, seq_end) (the longest max_kv_len keys) splits
// by length where ctx.decode_balance asks for it (always, or where the host lengths are unequal),
// its splits are automatic and it writes partials to the workspace: the plain, padded and modifier
// decode tiles, not the fp8 KV cache's register tiles (their split rule was measured apart) nor a
// cluster's merge (its splits are a sequence's).
void take_balanced_split(const Problem& pr, const PlanContext& ctx, const HostLengths& lens,
                         int64_t seq_begin, int64_t seq_end, int64_t max_kv_len, bool may_split,
                         KernelChoice& k) {
  if (ctx.decode_balance == DecodeBalance::kOff || !may_split || pr.num_splits != 0 ||
      k.family != KernelFamily::kSm80 || !k.decode || k.cluster_combine || k.kv_fp8_register)
    return;
  if (ctx.decode_balance == DecodeBalance::kUnequal &&
      !host_decodes_unequal(pr, lens, seq_begin, seq_end, k))
    return;
  const BalancedSplit b =
      balanced_split(group_problem(pr, seq_end - seq_begin, 1, max_kv_len), ctx.device);
  if (b.items == 0) return;
  k.splits = b.items;
  k.split_min_blocks = b.min_blocks;
}

// The launches: decodes and prefill chunks grouped by kind, each group's kernel chosen for its
// own shape: the sm80 kernel with its splits (choose_kernel), or the sm90 kernel where the call
// forces it or the default prefers it.
Plan grouped_plan(const Problem& pr, const PlanContext& ctx, const HostLengths& lens) {
  Plan plan;
  // Decode tiles take the sequences with one query: a tile's rows are the heads of that query,
  // which see the same keys (a left window bounds them alike; the right side of a single
  // bottom-right query masks nothing).
  const bool auto_split = pr.num_splits == 0 && ctx.workspace_available;

  auto add = [&](bool decode, SeqGroup group, int64_t seq_begin, int64_t seq_end, int64_t sequences,
                 int64_t max_q, int64_t max_kv, int64_t row_begin, int64_t rows, bool may_split) {
    LaunchPlan l;
    // Decodes merged in a cluster keep no partials: they split without a workspace too.
    const bool splits_here =
        may_split || (decode && pr.num_splits == 0 && cluster_decodes(pr, ctx));
    l.kernel = choose_kernel(pr, ctx.device, decode, sequences, max_q, max_kv, splits_here,
                             ctx.kv_fp8_register);
    if (ctx.family == FamilyRequest::kSm90 ||
        (ctx.family == FamilyRequest::kAuto &&
         sm90_preferred(pr, ctx, l.kernel, rows, max_q, max_kv)))
      l.kernel = sm90_kernel(pr, ctx, max_kv);
    take_cluster_combine(pr, ctx, l.kernel);
    take_balanced_split(pr, ctx, lens, seq_begin, seq_end, max_kv, may_split, l.kernel);
    l.group = group;
    l.seq_begin = seq_begin;
    l.seq_end = seq_end;
    l.max_q_len = max_q;
    l.max_kv_len = max_kv;
    // Decode launches keep their partials by sequence (one query each), prefill launches by row.
    l.row_begin = decode ? 0 : row_begin;
    l.rows = decode ? seq_end - seq_begin : rows;
    place_workspace(plan, l, pr);
    plan.launches.push_back(l);
  };

  if (!lens.known()) {
    // Only the longest lengths are known. One query at most everywhere: decode tiles. A varlen
    // batch with longer queries may hold decodes too: a decode launch and a prefill launch over
    // the whole batch, each skipping the other's sequences. The decode launch splits as if every
    // sequence were a decode of the longest length (with none in the batch, its blocks and its
    // combine find nothing to do: a few microseconds).
    if (pr.max_q_len <= 1) {
      add(true, SeqGroup::kAll, 0, pr.batch, pr.batch, 1, pr.max_kv_len, 0, ctx.q_rows,
          auto_split || pr.num_splits > 1);
    } else if (pr.varlen_q && pr.batch > 1) {
      add(true, SeqGroup::kDecodes, 0, pr.batch, pr.batch, 1, pr.max_kv_len, 0, ctx.q_rows,
          auto_split || pr.num_splits > 1);
      add(false, SeqGroup::kPrefills, 0, pr.batch, pr.batch, pr.max_q_len, pr.max_kv_len, 0,
          ctx.q_rows, auto_split || pr.num_splits > 1);
    } else {
      add(false, SeqGroup::kAll, 0, pr.batch, pr.batch, pr.max_q_len, pr.max_kv_len, 0, ctx.q_rows,
          auto_split || pr.num_splits > 1);
    }
    return plan;
  }

  // Lengths known: each group's range is from its first sequence to its last, and its longest
  // lengths are its own. Sequences without queries belong to either group.
  const bool may_split = auto_split || pr.num_splits > 1;
  struct Group {
    int64_t first = -1, last = -1, count = 0, max_q = 0, max_kv = 0;
    void take(int64_t b, int64_t q, int64_t kv) {
      if (first < 0) first = b;
      last = b;
      ++count;
      max_q = std::max(max_q, q);
      max_kv = std::max(max_kv, kv);
    }
  } decodes, prefills;
  int64_t max_kv_all = 0;
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t q = lens.q_start[b + 1] - lens.q_start[b], kv = lens.kv_len[b];
    max_kv_all = std::max(max_kv_all, kv);
    if (q == 1) decodes.take(b, q, kv);
    if (q > 1) prefills.take(b, q, kv);
  }
  if (decodes.count == 0 && prefills.count == 0) return plan;  // no queries at all
  const int64_t rows_all = lens.q_start[pr.batch] - lens.q_start[0];
  if (prefills.count == 0) {
    // All decodes, for replay (a decode graph): split for the bound as a plan without lengths
    // does, so that one graph serves every step under it; the lengths still decide whether the
    // splits follow them (take_balanced_split).
    add(true, SeqGroup::kAll, 0, pr.batch, decodes.count, 1,
        lens.widen ? pr.max_kv_len : max_kv_all, lens.q_start[0], rows_all, may_split);
    return plan;
  }
  if (decodes.count == 0) {
    add(false, SeqGroup::kAll, 0, pr.batch, prefills.count, prefills.max_q, max_kv_all,
        lens.q_start[0], rows_all, may_split);
    return plan;
  }
  // A mixed batch: a group's range holds the other kind only where the batch interleaves them;
  // then its launch skips those sequences (and its combine, their rows).
  auto mixed_in = [&](const Group& g, bool want_decode) {
    for (int64_t b = g.first; b <= g.last; ++b) {
      const int64_t q = lens.q_start[b + 1] - lens.q_start[b];
      if (q > 0 && (q == 1) != want_decode) return true;
    }
    return false;
  };
  for (bool decode : {true, false}) {
    const Group& g = decode ? decodes : prefills;
    const SeqGroup only =
        mixed_in(g, decode) ? (decode ? SeqGroup::kDecodes : SeqGroup::kPrefills) : SeqGroup::kAll;
    add(decode, only, g.first, g.last + 1, g.count, g.max_q, g.max_kv, lens.q_start[g.first],
        lens.q_start[g.last + 1] - lens.q_start[g.first], may_split);
  }
  return plan;
}

// An all-e4m3 call: the sm90 fp8 forward or a refusal by name. One launch over the whole batch
// (decodes included: the fp8 path has no decode tiles yet, and its V^T covers every sequence).
Plan fp8_plan(const Problem& pr, const PlanContext& ctx) {
  refuse_fp8_if_off(pr, ctx.fp8_attention);
  if (ctx.family == FamilyRequest::kSm80)
    throw Error(ErrorKind::kUnsupported, "FLASHSERVE_KERNEL",
                "sm80: the sm80 kernels have no float8_e4m3fn forward (it runs on sm90: unset "
                "FLASHSERVE_KERNEL)");
  const Fp8Lack lack = sm90_fp8_lacks(pr, ctx);
  if (!lack.empty())
    throw Error(ErrorKind::kUnsupported, lack.argument,
                "float8_e4m3fn attention on CUDA (the sm90 fp8 forward): " + lack.what);
  Plan plan;
  LaunchPlan l;
  l.kernel.family = KernelFamily::kSm90;
  l.kernel.fp8 = true;
  l.kernel.head_dim = static_cast<int>(pr.head_dim);
  l.kernel.masked = sm90_masked(pr);
  l.kernel.tile_counter = l.kernel.masked;  // the 16-bit kernel's reason (sm90_kernel)
  // FLASHSERVE_SM90_EXP2_FMA: the fp8 tiles' Exp2Fma variant (sm90/tile_config.h), every fp8
  // head dim.
  l.kernel.exp2_fma = ctx.sm90_exp2_fma && sm90::fp8_exp2_fma_head_dim(l.kernel.head_dim);
  // FLASHSERVE_SM90_EPILOGUE: O staged and stored by TMA, as the 16-bit tiles' (every fp8 tile
  // has room for the staging); the Exp2Fma tiles keep the register stores (one variant of the
  // switched-off experiment is enough).
  l.kernel.epilogue = ctx.sm90_epilogue && !l.kernel.exp2_fma;
  const sm90::TileShape tile = sm90::fp8_tile_shape(static_cast<int>(pr.head_dim), ctx.fp8_block_n,
                                                    pr.max_kv_len, l.kernel.masked);
  l.kernel.block_m = tile.block_m;
  l.kernel.block_n = tile.block_n;
  l.group = SeqGroup::kAll;
  l.seq_begin = 0;
  l.seq_end = pr.batch;
  l.max_q_len = pr.max_q_len;
  l.max_kv_len = pr.max_kv_len;
  l.row_begin = 0;
  l.rows = ctx.q_rows;
  place_workspace(plan, l, pr);
  plan.launches.push_back(l);
  return plan;
}

}  // namespace

Plan make_plan(const Problem& pr, const PlanContext& ctx, const HostLengths& lens) {
  if (pr.batch == 0 || pr.max_q_len == 0 || ctx.q_rows == 0) return Plan{};
  if (pr.dtype == DType::kFloat8E4M3) return fp8_plan(pr, ctx);
  if (kv_fp8(pr)) {
    // An fp8 KV cache: sm80's fp8 KV kernels or a refusal by name (never the 16-bit kernels on
    // the codes).
    const Fp8Lack lack = fp8_kv_lacks(pr, ctx);
    if (!lack.empty()) throw Error(ErrorKind::kUnsupported, lack.argument, lack.what);
  }
  // Padded head dims have no modifier kernels (each would be another 16 instantiations per head
  // dim): refused by the modifier's name, whichever family was asked for.
  if (padded(pr))
    refuse_score_mods(pr.score_mod,
                      str_cat("the CUDA kernels with head dims ", pr.head_dim, "/", pr.head_dim_v,
                              " (64, 128 and 256 with equal q and v head dims have it)")
                          .c_str());
  if (ctx.family == FamilyRequest::kSm90) {
    // The modifiers are refused by their own names: the argument to drop, or to run on sm80.
    refuse_score_mods(pr.score_mod,
                      "the sm90 kernel (FLASHSERVE_KERNEL=sm90; the sm80 kernels have it)");
    const std::string lacks = sm90_lacks(pr, ctx);
    if (!lacks.empty()) throw Error(ErrorKind::kUnsupported, "FLASHSERVE_KERNEL", "sm90: " + lacks);
  }
  Plan plan = grouped_plan(pr, ctx, lens);
  if (lens.widen && lens.known()) widen_launches(plan, pr, ctx);
  return plan;
}

void widen_launches(Plan& plan, const Problem& pr, const PlanContext& ctx) {
  plan.workspace_bytes = 0;
  for (LaunchPlan& l : plan.launches) {
    const bool sm90_short =
        l.kernel.family == KernelFamily::kSm90 && sm90::short_keys(l.max_kv_len);
    l.max_kv_len = sm90_short ? std::min<int64_t>(pr.max_kv_len, sm90::kShortKeys)
                              : std::max(l.max_kv_len, pr.max_kv_len);
    if (!l.kernel.decode) {
      l.max_q_len = std::max(l.max_q_len, pr.max_q_len);
      l.row_begin = 0;
      l.rows = ctx.q_rows;
    }
    place_workspace(plan, l, pr);
  }
}

std::string replay_key(const Plan& plan) {
  std::ostringstream os;
  os << "smem " << plan.smem_per_block;
  for (const LaunchPlan& l : plan.launches) {
    const KernelChoice& k = l.kernel;
    const bool sm90 = k.family == KernelFamily::kSm90;
    os << "; "
       << (k.fp8  ? "sm90 fp8"
           : sm90 ? (sm90::short_keys(l.max_kv_len) ? "sm90 short" : "sm90")
                  : "sm80")
       << (k.decode ? " decode" : "") << (k.masked ? " masked" : "") << (k.paged ? " paged" : "")
       << (k.tile_counter ? " counter" : "") << (k.epilogue ? " epilogue" : "")
       << (k.exp2_fma ? " exp2-fma" : "") << (k.padded ? str_cat(" padded d", k.head_dim) : "")
       << (k.kv_fp8 ? " kv-e4m3" : "") << (k.kv_fp8_register ? " register" : "")
       << (k.cluster_combine ? " cluster" : "") << " " << k.block_m << "x" << k.block_n
       << " splits " << k.splits
       << (k.split_min_blocks > 0 ? str_cat(" by-length ", k.split_min_blocks) : "") << " group "
       << static_cast<int>(l.group) << " seqs " << l.seq_begin << "-" << l.seq_end;
  }
  return os.str();
}

std::string Plan::summary() const {
  std::ostringstream os;
  if (launches.empty()) os << "nothing to compute";
  for (size_t i = 0; i < launches.size(); ++i) {
    const LaunchPlan& l = launches[i];
    if (i) os << "; ";
    os << (l.kernel.fp8                             ? "sm90 fp8 "
           : l.kernel.family == KernelFamily::kSm90 ? "sm90 "
                                                    : "")
       << (l.kernel.decode ? "decode" : "prefill") << (l.kernel.masked ? " masked" : "")
       << (l.kernel.paged ? " paged" : "")
       << (l.kernel.padded ? str_cat(" padded d", l.kernel.head_dim) : "")
       << (l.kernel.kv_fp8 ? " kv-e4m3" : "") << (l.kernel.kv_fp8_register ? " register" : "")
       << (l.kernel.cluster_combine ? " cluster combine" : "") << " seqs [" << l.seq_begin << ","
       << l.seq_end << ")"
       << (l.group == SeqGroup::kAll       ? ""
           : l.group == SeqGroup::kDecodes ? " decodes only"
                                           : " prefills only")
       << " max_q " << l.max_q_len << " max_kv " << l.max_kv_len << " tile " << l.kernel.block_m
       << "x" << l.kernel.block_n << " splits " << l.kernel.splits
       << (l.kernel.split_min_blocks > 0
               ? str_cat(" by length (shares of >= ", l.kernel.split_min_blocks, " blocks)")
               : "")
       << (l.kernel.tile_counter ? " tile counter" : "")
       << (l.kernel.epilogue ? " overlapped epilogue" : "")
       << (l.kernel.exp2_fma ? " exp2 on fma" : "");
    if (l.kernel.fp8) os << " V^T at " << l.vt_offset;
  }
  os << "; workspace " << workspace_bytes << " B";
  return os.str();
}

}  // namespace flashserve::attention
