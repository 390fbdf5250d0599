// The CUDA path's plan of a call (docs/architecture.md, attention/cuda): which kernel runs which
// sequences with how many splits, and how much workspace that takes, decided on the host once per
// step from the lengths the scheduler already has; run (cuda_dispatch.cu) then launches it per
// layer without reading lengths back, so that it can be captured in a CUDA graph. Plain C++: CI
// tests the grouping and splitting without a GPU.
//
// A serving step is a mixed batch: prefill chunks (many queries per sequence) and decodes (one).
// One kernel for all of them fits neither: 128-row prefill tiles compute 128 rows for each decode
// row, and the decodes lose the packed GQA tiles and the splits they get alone (3.3x the time of
// the two parts launched separately, issue 15). So the plan groups the sequences by kind, one
// launch per group: the decodes in packed GQA decode tiles, the chunks in prefill tiles, each
// group split by its own shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/problem.h"
#include "attention/split_policy.h"

namespace flashserve::attention {

// Which sequences of its range a launch computes (the kernels' SeqKind, kernel/seqlen.h).
enum class SeqGroup : int32_t { kAll = 0, kDecodes = 1, kPrefills = 2 };

// The kernel of one launch: kSm80 (FlashAttention-2 style, every GPU from Ampere on) or kSm90
// (the Hopper kernel), which the plan takes where it measured faster (make_plan's sm90 rules) or
// where FLASHSERVE_KERNEL=sm90 forces it.
enum class KernelFamily { kSm80, kSm90 };

// The family a call asks for: FLASHSERVE_KERNEL (unset, empty or "auto"; "sm80"; "sm90"), read
// once per plan by the dispatch.
enum class FamilyRequest { kAuto, kSm80, kSm90 };

struct KernelChoice {
  KernelFamily family = KernelFamily::kSm80;
  bool decode = false;  // the packed GQA decode tiles (sm80/tile_config.h decode_tiles)
  bool masked = false;  // causal or a window: the masked instantiation
  bool paged = false;
  int splits = 1;  // split-KV ways (> 1: partials in the workspace, then the combine)
  // sm90 masked: a persistent grid whose CTAs take their next tile from a counter in the
  // workspace (at workspace_offset), zeroed before the launch.
  bool tile_counter = false;
  // The sm90 float8_e4m3fn forward (q, k, v e4m3, out bf16; sm90/tile_config.h Fp8Tile): its V^T
  // pre-pass writes into the workspace at LaunchPlan::vt_offset (fp8_vt_bytes).
  bool fp8 = false;
  // An fp8 KV cache: K and V float8_e4m3fn beside a bfloat16 q (sm80's fwd_kernel_kv_fp8: decode
  // or masked prefill tiles, paged; the descales per (sequence, KV head)).
  bool kv_fp8 = false;
  // kv_fp8 decode tiles only: the codes converted at operand load, in registers (sm80/
  // kv_fp8_reg.h), instead of widened to a bf16 tile in shared memory; from
  // PlanContext::kv_fp8_register. Not the same bits (f16 GEMMs: P rounded to f16, not bf16).
  bool kv_fp8_register = false;
  // The tile the launch runs: query rows and keys per block, read from the family's tile
  // configuration (sm80/tile_config.h, sm90/tile_config.h), which the launch instantiates.
  int block_m = 0, block_n = 0;
  // sm90 16-bit and fp8 tiles: session 18's tile boundary (sm90/tile_config.h
  // OverlappedEpilogue: O by TMA store where its staging fits, the tile's work announced to the
  // consumers), from PlanContext::sm90_epilogue (fp8: not with exp2_fma). Same arithmetic, same
  // bits.
  bool epilogue = false;
  // sm90 16-bit d64 tiles and fp8 tiles (d64, d128, d256): part of the softmax's exponentials on
  // the FMA pipe (sm90/tile_config.h Exp2Fma), from PlanContext::sm90_exp2_fma; false at the
  // other 16-bit head dims, which it does not reach. Not the same bits: exp2_poly.h and
  // ex2.approx round differently.
  bool exp2_fma = false;
  // The head dim the kernel is compiled for (64, 128, 256): the call's, or for sm80 the smallest
  // at or above both of the call's head dims (sm80/tile_config.h kernel_head_dim); then `padded`:
  // the padded instantiation, which reads q, k and v only up to the call's head dims and stores
  // out only up to head_dim_v. Split-KV partials hold `head_dim` columns per row.
  int head_dim = 0;
  bool padded = false;
  // sm80 decode tiles split 2 to sm80::kClusterCombineMaxSplits ways on a device with thread-block
  // clusters (sm_90): the splits of one (sequence, KV head) run as one cluster and merge their
  // partials through distributed shared memory (sm80/cluster_combine.h), from
  // PlanContext::decode_cluster (automatic splits then at most that many): no partials in the
  // workspace, no combine launch. Not the same bits as the combine kernel (the LSE's sum in
  // another order).
  bool cluster_combine = false;
  // sm80 decode tiles split by length (split_policy.h balanced_split, kernel/split_items.h):
  // > 0, `splits` is the items a sequence of the grid holds and this the fewest key blocks of a
  // share; from PlanContext::decode_balance. Not the same bits as the even split where lengths
  // differ (other shares, so the partials sum in another grouping); the same where they are equal.
  int split_min_blocks = 0;
};

// One launch: the kernel, its sequences [seq_begin, seq_end) (of which it takes `group`), the
// longest of their lengths (the grid and the masked grid's order), and where its split-KV
// partials live: `rows` rows at workspace_offset, which are rows [row_begin, row_begin + rows) of
// q for a prefill launch, and one per sequence of the range for a decode launch.
struct LaunchPlan {
  KernelChoice kernel;
  SeqGroup group = SeqGroup::kAll;
  int64_t seq_begin = 0, seq_end = 0;
  int64_t max_q_len = 0, max_kv_len = 0;
  int64_t row_begin = 0, rows = 0;
  size_t workspace_offset = 0;
  size_t vt_offset = 0;  // kernel.fp8: where V^T lives in the workspace
  // kernel.split_min_blocks > 0: where the launch's item map lives (split_policy.h
  // split_map_bytes), after its partials.
  size_t map_offset = 0;
};

struct Plan {
  std::vector<LaunchPlan> launches;  // none when there is nothing to compute
  size_t workspace_bytes = 0;
  // The shared memory per block the sm80 launches pick their tiles under: the device's opt-in
  // maximum, or less where FLASHSERVE_SMEM_PER_BLOCK asks (cuda_dispatch.cu, read once per plan
  // like FLASHSERVE_KERNEL, so a plan's runs agree with it).
  int smem_per_block = 0;
  std::string summary() const;  // one line per launch, for logs and benchmarks
};

// The lengths of a step as the host knows them. Empty vectors: unknown (attention_forward has only
// device tensors and max_seqlen_q/k): then each group's range is the whole batch and the kernels
// skip the sequences of the other kind.
struct HostLengths {
  std::vector<int64_t> q_start;  // [batch + 1] row of q where each sequence starts (cu_seqlens_q)
  std::vector<int64_t> kv_len;   // [batch] keys of each sequence
  // AttentionLengths::for_replay: the launches chosen from these lengths, widened (widen_launches).
  bool widen = false;
  bool known() const { return !q_start.empty(); }
};

// Whether the sm90 forward's 16-bit tiles take session 18's tile boundary by default
// (FLASHSERVE_SM90_EPILOGUE unset): on since its device run (session 19, H200: every *Sm90* test
// with it on, memcheck and racecheck clean; bench_sm90 --epilogue-ab +0-6% at 512-2k keys, within
// -1..+2% beyond). It computes the same bits as the register stores (Sm90Epilogue.SameBits*);
// "0" turns it off (docs/kernel-notes.md, sessions 18 and 19).
inline constexpr bool kSm90EpilogueByDefault = true;

// Whether the sm90 forward's d64 16-bit tiles compute part of the softmax's exponentials on the
// FMA pipe by default (FLASHSERVE_SM90_EXP2_FMA unset): off. Its first device run (session 20,
// bench/results/exp2-fma-h200-2026-12-03.md) measured it 5-11% slower at every d64 shape, 512 to
// 16k keys, causal or not: the d64 tile is not bound by the MUFU (docs/kernel-notes.md, "exp2 on
// the FMA pipe"). "1" turns it on, for the fp8 tiles too (issue 23: d64, d128, d256; session 23
// measured 0.96-1.00x at d128 x 128 and d256, 1.005-1.016x at d128 x 192); the outputs differ from
// the MUFU's in rounding only (Sm90Exp2Fma.* and Sm90Fp8Exp2Fma.* bound the difference).
inline constexpr bool kSm90Exp2FmaByDefault = false;

// Whether the fp8 KV cache's decode tiles convert the e4m3 codes at operand load, in registers
// (sm80/kv_fp8_reg.h), by default (FLASHSERVE_KV_FP8_REGISTER unset): on. Session 23's device
// run (H200, bench_serve_attn --kv-fp8, bench/results/kv-fp8-h200-2026-12-03.md) measured the
// decode rows at 0.58-0.61x bf16's time (the widening in shared memory: 1.82-1.91x), and every
// KvFp8* test passed both ways. "0" goes back to the widening for the decode launches (the masked
// prefill tiles widen either way); the outputs differ from the widening's in rounding only
// (KvFp8Register.* bound the difference).
inline constexpr bool kKvFp8RegisterByDefault = true;

// Whether split decode launches merge their splits inside a thread-block cluster by default
// (FLASHSERVE_DECODE_CLUSTER unset; KernelChoice::cluster_combine): off. Session 32 (H100,
// kernel-notes "Session 31 (issue 21)"): correct, ~1 us faster at 8 splits or fewer but slower at
// 16 (1 x 1024 keys 8.7 against 7.7 us; 8 x 1024 31.7 against 16.6), +3-5% on a whole decode
// step at batch 1-4.
inline constexpr bool kDecodeClusterByDefault = false;

// When automatic sm80 decode splits follow the sequences' lengths (KernelChoice::split_min_blocks):
// never, where the plan's host lengths are unequal (split_policy.h decodes_unequal; a plan
// without lengths, such as a decode graph's for its bound, splits evenly), or always.
enum class DecodeBalance { kOff, kUnequal, kAlways };
// The default (FLASHSERVE_DECODE_BALANCE unset): where the lengths are unequal. Session 33 walked
// the lengths in every CTA (equal lengths 5-38% slower); session 34's item map, made once a launch
// (H100, bench/results/decode-balance-h100-2026-12-05-session34.md): exponential lengths from
// 1.29-1.57x the equal ones' time to 1.06-1.15x, equal lengths 3-14% slower (the map's kernel and
// a combine), hence only where decodes_unequal says so.
inline constexpr DecodeBalance kDecodeBalanceByDefault = DecodeBalance::kUnequal;

// What the plan needs of the device and of the call beside the problem.
struct PlanContext {
  SplitDevice device;
  int64_t q_rows = 0;  // rows of q (dense batch * seqlen_q, varlen total_q)
  // Automatic splitting (num_splits 0) only where a workspace will be there: plan_attention's
  // caller allocates workspace_bytes; attention_forward without a workspace does not split (its
  // run allocates what the plan still needs, such as a masked sm90 launch's tile counter).
  bool workspace_available = true;
  FamilyRequest family = FamilyRequest::kAuto;
  // Why the sm90 kernel cannot run here whatever the problem's shape ("" when it can): a build
  // without 90a, a device other than compute capability 9.0, tensors whose strides TMA cannot
  // describe. The dispatch fills it from the device and the tensors.
  std::string sm90_unavailable = "this build has no sm90 kernels";
  // Whether a float8_e4m3fn call may run the sm90 fp8 forward: FLASHSERVE_FP8_ATTENTION
  // (parse_fp8_attention), read by the dispatch once per plan of an e4m3 call.
  bool fp8_attention = false;
  // The fp8 forward's key block at d128: FLASHSERVE_FP8_BLOCK_N (parse_fp8_block_n), 128 or 192,
  // or 0: chosen by the call's longest key range and its mask (sm90/tile_config.h fp8_block_n;
  // the other head dims run 128 whatever it says).
  int fp8_block_n = 0;
  // Whether sm90 16-bit launches take session 18's tile boundary: FLASHSERVE_SM90_EPILOGUE
  // (parse_sm90_epilogue), read by the dispatch once per plan.
  bool sm90_epilogue = kSm90EpilogueByDefault;
  // Whether sm90 16-bit d64 launches compute part of the softmax's exponentials on the FMA pipe:
  // FLASHSERVE_SM90_EXP2_FMA (parse_sm90_exp2_fma), read by the dispatch once per plan.
  bool sm90_exp2_fma = kSm90Exp2FmaByDefault;

  // Whether an e4m3 K/V beside a bfloat16 q (the fp8 KV cache) may run on sm80's fp8 KV kernels:
  // FLASHSERVE_CUDA_FP8_KV (parse_fp8_kv_cache), read by the dispatch once per plan of such a
  // call.
  bool fp8_kv_cache = false;
  // Whether the fp8 KV cache's decode launches convert the codes at operand load:
  // FLASHSERVE_KV_FP8_REGISTER (parse_kv_fp8_register), read by the dispatch once per plan of
  // such a call.
  bool kv_fp8_register = kKvFp8RegisterByDefault;
  // Whether split decode launches merge their splits in a cluster (KernelChoice::cluster_combine):
  // FLASHSERVE_DECODE_CLUSTER (parse_decode_cluster), read by the dispatch once per plan, and
  // whether the device and the build have clusters (compute capability 9.x, 90a built).
  bool decode_cluster = kDecodeClusterByDefault;
  bool clusters = false;
  // When automatic sm80 decode splits follow the lengths (KernelChoice::split_min_blocks):
  // FLASHSERVE_DECODE_BALANCE (parse_decode_balance), read by the dispatch once per plan.
  DecodeBalance decode_balance = kDecodeBalanceByDefault;
};

// FLASHSERVE_DECODE_BALANCE: unset (null) or empty, kDecodeBalanceByDefault; "1" always; "0"
// never; anything else throws kInvalidArgument naming the variable.
DecodeBalance parse_decode_balance(const char* value);

// FLASHSERVE_DECODE_CLUSTER: unset (null) or empty, kDecodeClusterByDefault; "1" on; "0" off;
// anything else throws kInvalidArgument naming the variable.
bool parse_decode_cluster(const char* value);

// FLASHSERVE_SM90_EPILOGUE: unset (null) or empty, kSm90EpilogueByDefault; "1" on; "0" off;
// anything else throws kInvalidArgument naming the variable.
bool parse_sm90_epilogue(const char* value);

// FLASHSERVE_SM90_EXP2_FMA: unset (null) or empty, kSm90Exp2FmaByDefault; "1" on; "0" off;
// anything else throws kInvalidArgument naming the variable.
bool parse_sm90_exp2_fma(const char* value);

// Whether the fp8 KV cache's CUDA kernels (e4m3 K/V beside a bfloat16 q: sm80/fwd_kernel.h
// fwd_kernel_kv_fp8) run by default (FLASHSERVE_CUDA_FP8_KV unset): off. Their first device run
// (H200) passed every test but measured decode attention at 2.2x bf16's time (synchronous
// staging of the codes; docs/fp8.md), so they stay opt-in until the staging is asynchronous. The
// model layer's switch of the same variable (model/kv_cache_dtype.h kCudaFp8KvCacheByDefault)
// must agree; a CPU test checks it.
inline constexpr bool kFp8KvCacheByDefault = false;

// FLASHSERVE_CUDA_FP8_KV: unset (null) or empty, kFp8KvCacheByDefault; "1" on; "0" off; anything
// else throws kInvalidArgument naming the variable.
bool parse_fp8_kv_cache(const char* value);

// FLASHSERVE_KV_FP8_REGISTER: unset (null) or empty, kKvFp8RegisterByDefault; "1" on; "0" off;
// anything else throws kInvalidArgument naming the variable.
bool parse_kv_fp8_register(const char* value);

// Whether the call is an fp8 KV cache's: e4m3 K/V beside a 16-bit q.
inline bool kv_fp8(const Problem& pr) {
  return pr.kv_dtype == DType::kFloat8E4M3 && pr.dtype != DType::kFloat8E4M3;
}

// Whether the sm90 float8_e4m3fn forward runs by default (FLASHSERVE_FP8_ATTENTION unset): on
// since its device run passed (session 18, H200: every fp8 GPU test at d64/d128/d256 within its
// float64 bound at the CPU emulation's RMS error; bench/results/fp8-h200-2026-12-03.md).
// FLASHSERVE_FP8_ATTENTION=0 turns it off, and e4m3 calls on CUDA are then refused naming q.
inline constexpr bool kFp8AttentionByDefault = true;

// FLASHSERVE_FP8_ATTENTION: unset (null) or empty, kFp8AttentionByDefault; "1" on; "0" off;
// anything else throws kInvalidArgument naming the variable.
bool parse_fp8_attention(const char* value);

// FLASHSERVE_FP8_BLOCK_N: unset (null) or empty, 0 (the plan chooses by the keys:
// sm90/tile_config.h fp8_block_n); "128" or "192" forces that key block at d128; anything else
// throws kInvalidArgument naming the variable. The A/B switch of the fp8 tiles' key block.
int parse_fp8_block_n(const char* value);

// An all-e4m3 call (q, k, v float8_e4m3fn) with the fp8 forward off: throws kUnsupported naming
// q, saying how to turn it on. Nothing for any other call. The dispatch calls it before it looks
// at the device, so the refusal is the same on every machine.
void refuse_fp8_if_off(const Problem& pr, bool fp8_attention);

// What the sm90 fp8 forward cannot run of an all-e4m3 call, as the argument to name and the
// reason; both empty if it can: the sm90 kernel itself (ctx.sm90_unavailable: the build, the
// device, TMA's strides), head dims other than 64, 128 and 256, paged K/V (block_table), split-KV
// (num_splits > 1), softcap and alibi_slopes.
struct Fp8Lack {
  std::string argument, what;
  bool empty() const { return what.empty(); }
};
Fp8Lack sm90_fp8_lacks(const Problem& pr, const PlanContext& ctx);

// What the fp8 KV kernels cannot run of such a call, as the argument to name and the reason; both
// empty if they can: the switch off (k, saying how to turn it on), a q other than bfloat16 (q),
// K/V that are not paged (block_table), head dims other than 64, 128 and 256 with equal q and v
// dims (q or v), softcap and alibi_slopes, FLASHSERVE_KERNEL=sm90 (no sm90 fp8 KV kernel).
Fp8Lack fp8_kv_lacks(const Problem& pr, const PlanContext& ctx);

// Bytes of the fp8 forward's V^T workspace (sm90/fp8_vt.h): batch x h_kv x head_dim x the longest
// kv rounded up to 128 keys.
size_t fp8_vt_bytes(const Problem& pr);

// A window side wider than any sequence is the same as unbounded; clamping keeps the kernels'
// row + offset + window arithmetic inside int32.
int32_t clamp_window(int64_t side, int64_t bound);

// The head dims the CUDA forward runs: q/k's and v's each a multiple of 8 from 32 to 256, equal or
// not (FlashAttention-2 takes multiples of 8 up to 256 with equal dims; DeepSeek's 192/128 differ).
// 64, 128 and 256 with equal dims run on their own kernels (sm80 or sm90); the others on the sm80
// kernel of the next compiled head dim, padded (KernelChoice::padded). Throws kUnsupported naming
// q (or v) otherwise.
void check_cuda_head_dims(const Problem& pr);

// Whether calls at the padded head dims (every pair but 64, 128 and 256 with equal dims) run by
// default: on since their device run (session 18, H200: the 140 `*HeadDim*` GPU tests against
// float64, memcheck on their small cases and the PyTorch head-dim tests passed);
// FLASHSERVE_PADDED_HEAD_DIMS=0 turns them off.
inline constexpr bool kPaddedHeadDimsByDefault = true;

// For a call at padded head dims: `value` (FLASHSERVE_PADDED_HEAD_DIMS) unset or empty,
// kPaddedHeadDimsByDefault; "1" runs; "0" throws kUnsupported naming q, saying how to turn them
// on; anything else throws kInvalidArgument naming the variable. Any other call:
// nothing (the variable is not read).
void refuse_padded_if_off(const Problem& pr, const char* value);

// The sm80 kernel for a group of sequences with these longest lengths (readable on purpose:
// every rule of the choice is here). kv_fp8_register: PlanContext's switch (the fp8 KV cache's
// decode tiles convert at operand load, and split as their smaller blocks ask).
KernelChoice choose_kernel(const Problem& pr, const SplitDevice& dev, bool decode,
                           int64_t sequences, int64_t max_q_len, int64_t max_kv_len, bool may_split,
                           bool kv_fp8_register = kKvFp8RegisterByDefault);

// What the sm90 kernel cannot run of this call, or "" if it can: ctx.sm90_unavailable, else the
// problem's shape (head dims 64, 128 and 256, v's equal to q's: other head dims run padded on
// sm80; pages of a multiple of 8 keys; no split-KV yet; no score modifiers: calls with softcap or
// alibi_slopes run on sm80).
std::string sm90_lacks(const Problem& pr, const PlanContext& ctx);

// The plan of one call: the family (FLASHSERVE_KERNEL's request, else the sm90 kernel where it
// measured faster than the sm80 plan), then the launches. `lens` may be unknown (see
// HostLengths). A forced family that cannot run the call throws kUnsupported naming
// FLASHSERVE_KERNEL, or the modifier (softcap, alibi_slopes) that forced sm90 lacks. Padded head
// dims (check_cuda_head_dims) run on sm80 only, and without score modifiers: those are refused
// by the modifier's name.
Plan make_plan(const Problem& pr, const PlanContext& ctx, const HostLengths& lens);

// A plan for a CUDA graph that later steps replay (AttentionLengths::for_replay): each launch keeps
// its kernel, tile, splits, group and sequences, and its grid and partials grow to the problem's
// bounds: prefill launches to pr.max_q_len queries and partial rows for every row of q (row 0 on;
// the combine skips rows that are not the launch's), every launch to pr.max_kv_len keys, except
// that an sm90 launch on its short-key tile (sm90/tile_config.h short_keys, which the launch picks
// from max_kv_len) stays within the short keys. The workspace is laid out again.
void widen_launches(Plan& plan, const Problem& pr, const PlanContext& ctx);

// What a step's own plan must share with a widened plan for the widened launches to compute its
// results bit for bit: per launch the kernel (family, decode, masked, paged, tile, tile counter,
// and for sm90 whether the short-key tile runs), the splits, the group and the sequence range;
// and the shared memory the sm80 tiles were chosen under. A sequence's rows depend on these and
// its own lengths (which the kernels read from the device), not on the grid's size or order.
std::string replay_key(const Plan& plan);

// The family FLASHSERVE_KERNEL (or, for the backward, FLASHSERVE_BWD_KERNEL) asks for: unset
// (null), empty or "auto", "sm80", "sm90"; anything else throws kInvalidArgument naming
// `variable`.
FamilyRequest parse_family_request(const char* value, const char* variable);

// What the sm90 backward kernel (sm90/bwd_kernel.h) cannot run of this call, or "" if it can:
// `sm90_unavailable` (the build, the device, TMA's strides: backward_cuda.cu), else the call's
// shape: head dims 64 and 128, and when `d256` (FLASHSERVE_SM90_BWD_D256: parse_sm90_bwd_d256;
// sm90/bwd_swapped_kernel.h) 256 and the multiples of 8 from 136 to 248 (padded to 256), no
// score modifiers, not deterministic (bit-identical dq is sm80's fixed-order dq kernel,
// bwd_dq_kernel).
std::string sm90_backward_lacks(const Problem& pr, bool deterministic,
                                const std::string& sm90_unavailable, bool d256);

// Whether the default dispatch takes the sm90 backward where it can run the call: on since its
// first device run (H200, session 16: every backward GPU test against the float64 reference
// through both families, sanitizers clean, 1.4-2.3x the sm80 backward at d64/d128 and 2k-8k
// keys; bench/results/bwd-h200-2026-12-02-session16.md). The switch stays so that a kernel not
// yet run on a device can be merged off.
inline constexpr bool kSm90BackwardByDefault = true;

// Whether the sm90 backward adds dQ by a TMA bulk reduce-add of a shared-memory tile per step
// (sm90/bwd_kernel.h, kDqBulk) instead of per-element fp32 atomics: on since its device run
// (session 19, H200: the 195 backward GPU tests with it on against the float64 reference,
// memcheck and racecheck clean; bench/bwd_compare.py +1-12%, +9-12% at 8k keys). "0" turns it off.
inline constexpr bool kSm90BwdDqBulkByDefault = true;

// FLASHSERVE_SM90_BWD_DQ_BULK: unset (null) or empty, kSm90BwdDqBulkByDefault; "1" on; "0" off
// (the atomics); anything else throws kInvalidArgument naming the variable. Read by the CUDA
// backward once per call (backward_cuda.cu), the A/B switch between the two dQ paths.
bool parse_sm90_bwd_dq_bulk(const char* value);

// Whether the sm90 backward's bulk-dQ kernel runs its step in FlashAttention-3's order
// (sm90/bwd_kernel.h, Cfg::kOverlap) by default at this head dim: dV issued before dS is packed
// and stored, dK after dQ and running under the dQ tile's stores, so that the tensor core has
// queued work through those stores. Written without a GPU (session 19); its on/off tests passed
// on the H200 (session 20). Measured in session 21 (bench/bwd_compare.py, 16k tokens, 2k/8k keys,
// causal or not; bench/results/bwd-host-h200-2026-12-03.md): d128 +4..+14% at every shape, so on;
// d64 -5..+4% (8k non-causal the slower one), so off. The atomics' kernel
// (FLASHSERVE_SM90_BWD_DQ_BULK=0) has no such schedule and ignores it.
constexpr bool sm90_bwd_overlap_by_default(int64_t head_dim) {
  return head_dim == 128;
}

// FLASHSERVE_SM90_BWD_OVERLAP: unset (null) or empty, sm90_bwd_overlap_by_default(head_dim); "1"
// on; "0" off; anything else throws kInvalidArgument naming the variable. Read by the CUDA
// backward once per call (backward_cuda.cu), as FLASHSERVE_SM90_BWD_DQ_BULK.
bool parse_sm90_bwd_overlap(const char* value, int64_t head_dim);

// Whether the sm90 backward's bulk-dQ kernel takes a masked call's key blocks heaviest first
// (sm90/bwd_kernel.h, Cfg::kHeavyFirst): a 1-D grid in attention/kernel/tile_order.h's order
// (sections of (KV head, sequence) units about two waves of CTAs large, each starting with every
// unit's heaviest key block: the first under a causal mask) instead of all key blocks of one unit
// after another, whose last unit's heaviest CTA starts in the last wave. The same CTAs, in another
// order (dk and dv keep their bits; dq is summed in no fixed order either way). Off until a
// device run has passed the backward tests with it and measured it (written without a GPU). The
// atomics' kernel (FLASHSERVE_SM90_BWD_DQ_BULK=0) and unmasked calls ignore it.
inline constexpr bool kSm90BwdHeavyFirstByDefault = false;

// FLASHSERVE_SM90_BWD_HEAVY_FIRST: unset (null) or empty, kSm90BwdHeavyFirstByDefault; "1" on;
// "0" off; anything else throws kInvalidArgument naming the variable. Read by the CUDA backward
// once per call (backward_cuda.cu), as FLASHSERVE_SM90_BWD_DQ_BULK.
bool parse_sm90_bwd_heavy_first(const char* value);

// Whether the sm90 backward's bulk-dQ kernel runs on a persistent grid (sm90/bwd_kernel.h,
// Cfg::kPersistent) by default for this head dim (the d64 kernel's rule up to 64, d128's above),
// mask (causal or a window) and longest key length: one CTA per multiprocessor, each looping over
// tiles (masked calls in the heaviest-first order, whatever FLASHSERVE_SM90_BWD_HEAVY_FIRST says),
// loading a tile's K and V while the consumers store the previous tile's dK and dV, instead of one
// CTA per tile (4096 CTAs, 31 waves at 512 keys, each paying its first loads and its stores alone;
// cuDNN's backward runs 132 persistent CTAs). The same products in the same order per tile: dk and
// dv keep their bits. Measured in session 41 (H100, bench/bwd_compare.py --graph: the kernels
// alone, two calls; bench/results/bwd-fused-dq-v2-h100-2026-12-06-session41.md), persistent against
// one CTA per tile: d64 -0.2..+10.5% at every length 512-8k, causal or not (most at 512-1k); d128
// non-causal +3.6..+3.9% at 512, +0.3..+1.6% at 1k-2k, -0.6..-1.7% at 4k-8k; d128 causal -2.6..
// -2.8% at 512, +0.9..+8.8% at 1k-8k. So on for d64, and for d128 where it did not lose: unmasked
// below 4096 keys, masked from 1024. (Eager timings, session 39: +0.7..+2.0% at 2k, -0.1..-4.7%
// at 8k, within their host noise.) Not yet measured on the H200. The atomics' kernel
// (FLASHSERVE_SM90_BWD_DQ_BULK=0) and d256 (bwd_swapped_kernel.h) ignore it.
constexpr bool sm90_bwd_persistent_by_default(int64_t head_dim, bool masked, int64_t max_kv_len) {
  if (head_dim <= 64) return true;
  return masked ? max_kv_len >= 1024 : max_kv_len < 4096;
}

// FLASHSERVE_SM90_BWD_PERSISTENT: unset (null) or empty, sm90_bwd_persistent_by_default(...); "1"
// on; "0" off; anything else throws kInvalidArgument naming the variable. Read by the CUDA
// backward once per call (backward_cuda.cu), as FLASHSERVE_SM90_BWD_DQ_BULK.
bool parse_sm90_bwd_persistent(const char* value, int64_t head_dim, bool masked,
                               int64_t max_kv_len);

// Whether the sm90 backward's bulk-dQ kernel (d64 and d128, one CTA per tile) converts dQ itself:
// each CTA counts itself done on its (sequence, KV head) once its reduce-adds are complete, and
// the last of them scales that unit's fp32 accumulator into dq while it is still in L2, instead
// of the postprocess kernel reading all of it back from memory after the main kernel (68 us of a
// 0.58 ms d128 call at 512 keys on an H100, session 40; 5% at 2k). Dense batches without
// seqused_k only (there every key block's CTA has keys, so each unit's count is the grid's key
// blocks); varlen, seqused_k, d256, the persistent grid and the heaviest-first order keep the
// postprocess. dq is scaled and rounded as the postprocess does it. Off: correct (every backward
// test, memcheck and racecheck, sessions 40-41) but no faster. The first version (a row loaded
// and stored at a time) lost 4-10% at 2k-8k; the second (8 rows' loads before their stores) in
// two H100 calls of bwd_compare (session 41): -5.1..+9.5% at 512, -3.2..+8.0% at 2k, -7.5..+1.3%
// at 8k (kernels alone, --graph: -5.1..+3.0%), mostly below the postprocess it replaces: the
// unit's last CTA converts serially what the postprocess spreads over the whole GPU.
inline constexpr bool kSm90BwdFusedDqByDefault = false;

// FLASHSERVE_SM90_BWD_FUSED_DQ: unset (null) or empty, kSm90BwdFusedDqByDefault; "1" on; "0" off;
// anything else throws kInvalidArgument naming the variable. Read by the CUDA backward once per
// call (backward_cuda.cu), as FLASHSERVE_SM90_BWD_DQ_BULK.
bool parse_sm90_bwd_fused_dq(const char* value);

// Whether the sm90 backward runs head dims 136-256 (sm90/bwd_swapped_kernel.h, padded to 256
// below it: 64 x 64 tiles, dV^T and dK^T over half the head dim per consumer warpgroup,
// docs/kernel-notes.md session 29) instead of sm80's padded kernel in two launches of half the
// columns (0.27x FlashAttention-2 at d256 on the H200, session 26). On since session 30: its
// device runs (sessions 29-30) passed the backward tests, compute-sanitizer's memcheck and
// racecheck, and measured it at 4.4-5.3x sm80's padded kernel, 1.13-1.46x FlashAttention-2 from
// 2k keys (bench/results/bwd-d256-h200-*).
inline constexpr bool kSm90BwdD256ByDefault = true;

// FLASHSERVE_SM90_BWD_D256: unset (null) or empty, kSm90BwdD256ByDefault; "1" on; "0" off;
// anything else throws kInvalidArgument naming the variable. Read by the CUDA backward once per
// call (backward_cuda.cu) before it chooses the family, as FLASHSERVE_SM90_BWD_DQ_BULK.
bool parse_sm90_bwd_d256(const char* value);

// The backward's one decision: with `request` kAuto and kSm90BackwardByDefault, sm90 wherever
// sm90_backward_lacks is "" (the compute capability 9.0 device of a build with 90a; `d256` its
// switch), else sm80; kSm80 forces sm80; kSm90 forces sm90, and a call it cannot run throws
// kUnsupported naming FLASHSERVE_BWD_KERNEL.
KernelFamily choose_backward_family(const Problem& pr, bool deterministic, FamilyRequest request,
                                    const std::string& sm90_unavailable, bool d256);

// Bytes of fp32 partial O and LSE that `splits` ways over `rows` rows of q take.
size_t partial_bytes(int64_t splits, int64_t rows, int64_t h_q, int64_t head_dim);

}  // namespace flashserve::attention
