// The attention contract (docs/architecture.md, "The attention contract").
//
// Layouts (strides are free except that the last dimension must be contiguous):
//   dense   q [batch, seqlen_q, h_q, d]      k, v [batch, seqlen_k, h_kv, d]
//   varlen  q [total_q, h_q, d] + cu_seqlens_q[batch+1]
//           k, v [total_k, h_kv, d] + cu_seqlens_k[batch+1]
//   paged   k, v [num_pages, page_size, h_kv, d] + block_table[batch, pages_per_seq]
//           + seqused_k[batch] (kv_len of each sequence); q dense or varlen.
//   out     same layout as q, head dim of v.
//   lse     optional float32, dense [batch, h_q, seqlen_q], varlen [h_q, total_q] (natural log).
// seqused_k may also be given without paging: sequence b then uses only its first seqused_k[b]
// keys.
//
// Masking is aligned bottom-right: with q_len queries and kv_len keys, query t sits at absolute
// position p = kv_len - q_len + t and sees key j iff  p - window_left <= j <= p + window_right
// (a negative window side means unbounded; causal sets window_right = 0). A query row that sees no
// key produces a zero output row and lse = -inf.
//
// Score modifiers (FlashAttention-2's, in its order): the score of query t and key j is
//   s = scale * q.k,  then  s = softcap * tanh(s / softcap)  when softcap > 0 (Gemma-2's capping),
//   then  s -= slope * |p - j|  when alibi_slopes gives the head's slope (ALiBi, p as above),
// then the mask and the softmax; lse is the log-sum-exp of these scores. With softcap a score of
// +-inf is capped to +-softcap (tanh's limit) and so makes no row NaN. The CPU path implements
// both, forward and backward (no gradient flows to the slopes). On CUDA the sm80 forward kernels
// have them (prefill, varlen, paged, decode, split-KV; the plan never picks the sm90 kernel for
// them, and a forced sm90 refuses them by name, kUnsupported); the CUDA backward refuses them by
// name.
//
// NaN and infinity, as in PyTorch and FlashAttention: a NaN in q or in a key a row sees, or a score
// that overflows to +inf, makes that row's output and lse NaN (never the zero row of "saw no key");
// -inf scores weigh 0 like masked keys. A NaN or inf in v reaches the rows that weigh it; whether a
// row that gives it weight 0 (a masked key in the same tile) turns NaN is unspecified (0 * NaN).
// Every element pointer must be aligned to its dtype's size.
//
// FP8 (float8_e4m3fn, DType::kFloat8E4M3), FlashAttention-3's inputs: either q, k and v all e4m3
// with out bfloat16 (FA3's flash_attn_func), or k and v alone e4m3 beside a float32, float16 or
// bfloat16 q and out of q's dtype (an fp8 KV cache read by a higher-precision query). The value
// an e4m3 element stands for is its code times its tensor's descale factor: q_descale, k_descale,
// v_descale, each optional float32 [batch, h_kv] (absent: 1), the factor of sequence b's KV head
// hk (q_descale: of that KV head's group of query heads), as FA3 takes them. The scores are
// scale * (q_descale q).(k_descale k) and the output is softmax V with V = v_descale v. The CPU
// path computes on the dequantised values in float32. On CUDA, q, k and v all e4m3 run on the
// sm90 fp8 forward when FLASHSERVE_FP8_ATTENTION=1 (off by default until its first device run;
// docs/fp8.md), an e4m3 k and v beside a 16-bit q are refused (kUnsupported), and there is no
// backward for e4m3. Likewise on the CPU path
// only, a float32 q may read a bfloat16 or float16 k and v (a 16-bit KV cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "flashserve/error.h"
#include "flashserve/tensor.h"

namespace flashserve {

struct AttentionParams {
  TensorView q, k, v, out;
  TensorView lse;              // optional
  TensorView cu_seqlens_q;     // optional int32 [batch + 1]
  TensorView cu_seqlens_k;     // optional int32 [batch + 1]; not with block_table
  TensorView seqused_k;        // optional int32 [batch]; required with block_table
  TensorView block_table;      // optional int32 [batch, pages_per_seq]
  int64_t max_seqlen_q = 0;    // varlen: an upper bound of every q_len (required for CUDA varlen)
  int64_t max_seqlen_k = 0;    // varlen/paged: an upper bound of every kv_len (required for CUDA)
  float softmax_scale = 0.0f;  // 0: 1/sqrt(head_dim); subnormal values are refused
  float softcap = 0.0f;        // > 0: tanh capping (above); 0: off; negative, subnormal refused
  TensorView alibi_slopes;     // optional float32 [h_q] or [batch, h_q]: the ALiBi slope per head
  // Optional float32 [batch, h_kv], only beside e4m3 q / k / v (above); absent means 1.
  TensorView q_descale, k_descale, v_descale;
  bool causal = false;
  int32_t window_left = -1;   // -1: unbounded
  int32_t window_right = -1;  // -1: unbounded (0 when causal)
  int32_t num_splits = 1;     // split-KV: 1 none, 0 automatic, n > 1 exactly n splits
  void* stream = nullptr;     // cudaStream_t for CUDA tensors (null: the default stream)
  void* workspace = nullptr;  // device scratch for split-KV partials (see workspace_size)
  size_t workspace_bytes = 0;
};

// Throws flashserve::Error naming the first argument that breaks the contract. Reads the
// length and block-table tensors when they are in host memory (every entry is checked then).
// On a CUDA device they are trusted as given (reading them would synchronize every call), as are
// max_seqlen_q/k; with the environment variable FLASHSERVE_CHECK_INDICES=1, attention_forward
// copies them to the host first and checks every entry the same way (a debugging aid: each call
// then synchronizes its stream). FLASHSERVE_SMEM_PER_BLOCK=<bytes> makes the CUDA path pick the
// tiles of a device with at most that much shared memory per block (testing a smaller GPU's tiles).
void validate(const AttentionParams& params);

// Validates, then runs on the device that holds the tensors (CPU or CUDA).
void attention_forward(const AttentionParams& params);

// Bytes of device workspace that attention_forward needs for these params (0 when none). Throws
// what attention_forward would throw for a call it cannot run (the checks come first).
size_t attention_workspace_size(const AttentionParams& params);

// ---------------------------------------------------------------------------------------------
// Plan and run: attention for a serving loop (FlashInfer's shape). A step's batch mixes prefill
// chunks (many queries per sequence) with single-token decodes; the plan, made once per step on the
// host from the lengths the scheduler has, groups the sequences by kind (decodes into packed-GQA
// decode tiles, chunks into prefill tiles), decides the split-KV ways of each group and the
// workspace they need. run_attention then launches the plan once per layer with that layer's
// tensors: it reads no length back to the host and allocates nothing when params.workspace holds
// workspace_bytes(), so a step's layers can be captured in a CUDA graph (a captured graph replays
// the plan it was captured with). attention_forward(params) is plan_attention(params) (lengths
// unknown) followed by run_attention.
//
// The batch's order is the caller's: decodes kept together (and chunks together) give each group
// one contiguous range of sequences; interleaved, each launch skips the other's sequences.

// The host-side lengths of a step. Null pointers: unknown (then the plan uses max_seqlen_q/k and
// the device-side lengths, as attention_forward does). They must be the lengths the device tensors
// of every run hold: the kernels read those, but the plan sizes each launch's grid from these (a
// query the host lengths do not count may be left unwritten).
struct AttentionLengths {
  const int32_t* cu_seqlens_q = nullptr;  // host [batch + 1], as params.cu_seqlens_q (varlen q)
  const int32_t* kv_lens = nullptr;       // host [batch]: keys of each sequence (seqused_k)
  // A plan that a CUDA graph replays for later steps of other lengths (needs both lengths above):
  // the kernels, their tiles, splits and sequence ranges are chosen from these lengths as
  // without it (but a call of single-query sequences only splits for params.max_seqlen_k, as a
  // plan without lengths does: one graph then serves every such step under that bound), and
  // every launch's grid and split-KV partials cover any lengths up to params.max_seqlen_q /
  // max_seqlen_k and every row of q. A later step (same params, its own
  // lengths in the device tensors) whose own plan has the same AttentionPlan::replay_key() gets
  // from this plan bit for bit what its own plan computes: a sequence's rows depend on its
  // lengths, its kernel and its splits, never on the grid around it.
  bool for_replay = false;
};

// What a run_attention call may take from the runs of its plan before it.
struct AttentionRunOptions {
  // The plan's per-step state (what its launches derive from the lengths on the device: the item
  // map of a decode launch that splits by length) is already in params.workspace, written by an
  // earlier run_attention of this plan on the same workspace and length tensors (cu_seqlens_q,
  // seqused_k), which still hold the same lengths, ordered before this run (the same stream),
  // with nothing but this plan's runs writing the workspace since. The layers of a step after its
  // first (every layer sees the step's lengths) so skip a small kernel each; a CUDA graph of the
  // step replays the first layer's rebuild with each step's lengths. Anything else is undefined:
  // the launches would read another step's map. Refused, naming "workspace", without
  // params.workspace where the plan needs one.
  bool reuse_step_state = false;
  // Programmatic dependent launch (sm_90 and later; elsewhere ignored): the run's sm80-family
  // kernels (every decode's) may be scheduled while the stream's previous kernel is still
  // finishing; each waits for it to complete before reading anything, and lets the kernel after
  // it be scheduled early in turn. For a caller whose kernels before and after attention are
  // launched so too (the CUDA runner's, model/decode_kernels.h): the launch gaps overlap.
  bool programmatic_launch = false;
};

namespace attention {
struct PlanState;
}

class AttentionPlan {
 public:
  AttentionPlan();
  // Bytes of device workspace run_attention needs in params.workspace (0 when none).
  size_t workspace_bytes() const;
  // One line per launch: kernel, sequences, splits (for logs and benchmarks).
  std::string summary() const;
  // What two plans of the same params must share for one's launches to compute the other's
  // results bit for bit (AttentionLengths::for_replay): each launch's kernel, tile, splits,
  // group and sequence range. Empty on the CPU.
  std::string replay_key() const;

 private:
  friend AttentionPlan plan_attention(const AttentionParams&, const AttentionLengths&);
  friend void run_attention(const AttentionPlan&, const AttentionParams&,
                            const AttentionRunOptions&);
  std::shared_ptr<const attention::PlanState> state_;
};

// Validates params (the shapes, dtype, device, mask and num_splits of the step; their tensors'
// data is not read unless the length tensors are in host memory) and plans the call. Throws
// flashserve::Error as attention_forward does.
AttentionPlan plan_attention(const AttentionParams& params, const AttentionLengths& lengths = {});

// Runs a plan with params of the same shapes (another layer's tensors, the same batch). Throws
// kInvalidArgument naming "plan" when params do not match the plan, "workspace" when the
// workspace is too small.
void run_attention(const AttentionPlan& plan, const AttentionParams& params,
                   const AttentionRunOptions& options = {});

}  // namespace flashserve
