// The CUDA backend: can a kernel run this call (everything the kernels assume — dtype, head dim,
// alignment for cp.async, grid limits, 32-bit lengths — is checked here and reported as an Error
// naming the argument), its plan (cuda/plan.h: which kernel takes which sequences, the splits, the
// workspace), and the run of a plan: the sm80 launches, without host syncs or allocations when the
// workspace is given.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backends.h"
#include "common/str_cat.h"
#include "cuda/check_aligned.h"
#include "cuda/fwd_params_of.h"
#include "cuda/plan.h"
#include "cuda_check.h"
#include "sm80/fwd_params.h"
#include "sm80/launch.h"
#include "split_policy.h"
#if defined(FLASHSERVE_WITH_SM90)
#include "sm90/launch.h"
#include "sm90/tile_config.h"
#endif

namespace flashserve::attention {
namespace {

[[noreturn]] void unsupported(const std::string& arg, const std::string& what) {
  throw Error(ErrorKind::kUnsupported, arg, what);
}

// A stream-ordered device allocation freed (stream-ordered) when the call returns or throws.
class StreamScratch {
 public:
  explicit StreamScratch(cudaStream_t stream) : stream_(stream) {}
  void* allocate(size_t bytes) {
    check_cuda(cudaMallocAsync(&ptr_, bytes, stream_), "cudaMallocAsync (split-KV partials)");
    return ptr_;
  }
  ~StreamScratch() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

// Rows of q: the partial buffers of split-KV hold one slot per (split, row, head).
int64_t q_rows(const AttentionParams& params, const Problem& pr) {
  return pr.varlen_q ? params.q.shape[0] : pr.batch * params.q.shape[1];
}

// What the dispatch needs to know of a device, queried once per device (each query is a driver
// call, and a decode step of a serving loop calls attention once per layer).
struct DeviceProps {
  int major = 0, minor = 0;
  int sms = 0;
  int smem_per_block = 0;  // opt-in maximum
  int smem_per_sm = 0;
  int l2_bytes = 0;
};

const DeviceProps& device_props(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceProps> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  DeviceProps d;
  const auto get = [device](int& value, cudaDeviceAttr attr) {
    check_cuda(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  };
  get(d.major, cudaDevAttrComputeCapabilityMajor);
  get(d.minor, cudaDevAttrComputeCapabilityMinor);
  get(d.sms, cudaDevAttrMultiProcessorCount);
  get(d.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  get(d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  get(d.l2_bytes, cudaDevAttrL2CacheSize);
  return cache.emplace(device, d).first->second;
}

SplitDevice split_device(const DeviceProps& d) {
  return SplitDevice{d.sms, d.smem_per_sm};
}

// FLASHSERVE_SMEM_PER_BLOCK=<bytes>: plan with at most this much shared memory per block, that is,
// run the tiles a smaller device would take (101376 = sm86/sm89's 99 KB, where d256 drops the PV
// pairs' exchange), to test them on a larger GPU. Unset or empty: the device's opt-in maximum.
int smem_per_block_limit(int device_max) {
  const char* v = std::getenv("FLASHSERVE_SMEM_PER_BLOCK");
  if (v == nullptr || *v == '\0') return device_max;
  char* end = nullptr;
  const long long bytes = std::strtoll(v, &end, 10);
  if (*end != '\0' || bytes <= 0)
    throw Error(ErrorKind::kInvalidArgument, "FLASHSERVE_SMEM_PER_BLOCK",
                std::string("must be a positive number of bytes, got \"") + v + "\"");
  return static_cast<int>(std::min<long long>(bytes, device_max));
}

void check_device_indices(const AttentionParams& params, cudaStream_t stream) {
  AttentionParams host = params;  // the same call, with its index tensors copied to the host
  std::vector<std::vector<int32_t>> copies;
  copy_indices_to_host({&host.cu_seqlens_q, &host.cu_seqlens_k, &host.seqused_k, &host.block_table},
                       copies, stream);
  // Every view claims the host, so that validation reads the index entries; it reads no other
  // tensor's data. The ALiBi slopes stay out: the host check of their entries would read device
  // memory (the call's own validation has checked their shape and device).
  host.alibi_slopes = TensorView{};
  for (TensorView* t : {&host.q, &host.k, &host.v, &host.out, &host.lse, &host.cu_seqlens_q,
                        &host.cu_seqlens_k, &host.seqused_k, &host.block_table})
    if (t->defined()) t->device = Device{DeviceType::kCPU, 0};
  validate(host);
}

// Everything the kernels assume that the shapes decide, checked before any plan: features first,
// so the message names what is missing rather than a derived symptom. Returns the device's
// properties.
const DeviceProps& check_supported(const AttentionParams& params, const Problem& pr) {
  if (pr.dtype == DType::kFloat32)
    unsupported("q", "float32 is not supported by the CUDA kernels (use bfloat16 or float16)");
  check_cuda_head_dims(pr);
  refuse_padded_if_off(pr, std::getenv("FLASHSERVE_PADDED_HEAD_DIMS"));
  if (!(pr.scale > 0.0f))
    unsupported("softmax_scale", "must be positive for the CUDA kernels (the row max assumes it)");
  if (pr.batch > 65535)
    unsupported("q", str_cat("batch ", pr.batch, " exceeds the grid limit 65535"));
  if (pr.h_q > 65535) unsupported("q", str_cat("h_q ", pr.h_q, " exceeds the grid limit 65535"));
  constexpr int64_t kMaxLen = int64_t{1} << 29;  // keeps row + offset + window in int32
  if (pr.max_q_len >= kMaxLen)
    unsupported("q", str_cat("sequence length ", pr.max_q_len, " is too long"));
  if (pr.max_kv_len >= kMaxLen)
    unsupported("k", str_cat("sequence length ", pr.max_kv_len, " is too long"));

  // Device: the tensors' device, compute capability 8.0 or newer.
  const int count = cuda_device_count();
  if (pr.device.index < 0 || pr.device.index >= count)
    throw Error(
        ErrorKind::kInvalidArgument, "q",
        str_cat("device index ", pr.device.index, " is not one of the ", count, " CUDA devices"));
  const DeviceProps& dev = device_props(pr.device.index);
  if (dev.major < 8)
    unsupported("q", str_cat("the CUDA kernels need compute capability 8.0 or newer, device ",
                             pr.device.index, " is ", dev.major, ".", dev.minor));
  check_aligned(params.q, "q", "the CUDA kernels");
  check_aligned(params.k, "k", "the CUDA kernels");
  check_aligned(params.v, "v", "the CUDA kernels");
  check_aligned(params.out, "out", "the CUDA kernels");
  if (pr.paged) {  // the paged loader's offsets are 32-bit counts of 8-element chunks
    for (const auto& [t, name] : {std::pair{&params.k, "k"}, std::pair{&params.v, "v"}}) {
      int64_t extent = 1;
      for (int i = 0; i < t->rank; ++i) extent += (t->shape[i] - 1) * t->stride[i];
      if (extent >= (int64_t{1} << 35))
        unsupported(name,
                    "a paged K/V pool of 2^35 elements or more per tensor (64 GB of bf16, 32 GB "
                    "of e4m3: the CUDA kernels address pages with 32-bit offsets)");
    }
  }
  return dev;
}

// FLASHSERVE_KERNEL picks the kernel family, read once per plan (so a test or benchmark can set
// it around one call): unset, empty or "auto", the default dispatch (make_plan's sm90 rules);
// "sm90", every call runs the Hopper kernel (sm90/) or is refused with what it lacks; "sm80",
// every call runs the FlashAttention-2-style kernels (the comparison, and a way back should sm90
// misbehave).
FamilyRequest family_request() {
  return parse_family_request(std::getenv("FLASHSERVE_KERNEL"), "FLASHSERVE_KERNEL");
}

// Why the sm90 kernel cannot run on this device with these tensors, whatever the problem's shape
// ("" when it can): a build without sm_90a, a device other than compute capability 9.0, q/k/v
// strides TMA cannot describe (positive, below 2^40 bytes; a dimension of size 1 is never
// stepped along, launch_template.h's make_map). The shape's limits are make_plan's (sm90_lacks).
std::string sm90_unavailable(const AttentionParams& params, const DeviceProps& dev) {
  if (!cuda_sm90_built())
    return "this build has no sm90 kernels (90a not in FLASHSERVE_CUDA_ARCHS)";
  if (dev.major != 9 || dev.minor != 0)
    return str_cat("needs a compute capability 9.0 device, this one is ", dev.major, ".",
                   dev.minor);
  for (const auto& [t, name] :
       {std::pair{&params.q, "q"}, std::pair{&params.k, "k"}, std::pair{&params.v, "v"}})
    if (std::string why = tma_stride_problem(*t, name); !why.empty()) return why;
  return "";
}

}  // namespace

Plan cuda_plan(const AttentionParams& params, const Problem& pr, const HostLengths& lens,
               bool workspace_available) {
  PlanContext ctx;
  // FLASHSERVE_FP8_ATTENTION, read once per plan of an all-e4m3 call (other calls never read
  // it); off, the call is refused before anything looks at the device.
  if (pr.dtype == DType::kFloat8E4M3) {
    ctx.fp8_attention = parse_fp8_attention(std::getenv("FLASHSERVE_FP8_ATTENTION"));
    refuse_fp8_if_off(pr, ctx.fp8_attention);
    ctx.fp8_block_n = parse_fp8_block_n(std::getenv("FLASHSERVE_FP8_BLOCK_N"));
  }
  ctx.sm90_epilogue = parse_sm90_epilogue(std::getenv("FLASHSERVE_SM90_EPILOGUE"));
  ctx.sm90_exp2_fma = parse_sm90_exp2_fma(std::getenv("FLASHSERVE_SM90_EXP2_FMA"));
  // FLASHSERVE_CUDA_FP8_KV, read once per plan of an fp8 KV cache's call (e4m3 K/V beside a
  // 16-bit q). What the fp8 KV kernels lack is refused here, before anything looks at the device,
  // so the refusal is the same on every machine (make_plan checks it again).
  if (kv_fp8(pr)) {
    ctx.fp8_kv_cache = parse_fp8_kv_cache(std::getenv("FLASHSERVE_CUDA_FP8_KV"));
    ctx.kv_fp8_register = parse_kv_fp8_register(std::getenv("FLASHSERVE_KV_FP8_REGISTER"));
    ctx.family = family_request();
    const Fp8Lack lack = fp8_kv_lacks(pr, ctx);
    if (!lack.empty()) unsupported(lack.argument, lack.what);
  }
  const DeviceProps& dev = check_supported(params, pr);
  ctx.device = split_device(dev);
  ctx.q_rows = q_rows(params, pr);
  ctx.workspace_available = workspace_available;
  if (params.q.numel() == 0) return Plan{};  // nothing to compute (no rows, heads or columns)
  ctx.family = family_request();
  ctx.sm90_unavailable = sm90_unavailable(params, dev);
  ctx.decode_cluster = parse_decode_cluster(std::getenv("FLASHSERVE_DECODE_CLUSTER"));
  ctx.decode_balance = parse_decode_balance(std::getenv("FLASHSERVE_DECODE_BALANCE"));
  // Thread-block clusters in the sm80 kernels' sm_90a code (sm80/cluster_combine.h is compiled
  // for sm_90 only; another device would run the sm_80 code, which has none).
  ctx.clusters = dev.major == 9 && cuda_sm90_built();
  Plan plan = make_plan(pr, ctx, lens);
  plan.smem_per_block = smem_per_block_limit(dev.smem_per_block);
  return plan;
}

bool cuda_sm90_built() {
#if defined(FLASHSERVE_WITH_SM90)
  return true;
#else
  return false;
#endif
}

namespace {

// The sm90 kernel over one launch's sequences (the plan has accepted the call; a run's tensors
// may still differ from the plan's in their strides). `f`: the call's shared parameters
// (fwd_params: strides, varlen batch stride 0, the lengths' sources, the clamped window).
void run_sm90(const LaunchPlan& l, const sm80::FwdParams& f, const AttentionParams& params,
              const Problem& pr, const DeviceProps& dev, void* workspace, cudaStream_t stream) {
#if defined(FLASHSERVE_WITH_SM90)
  const std::string unavailable = sm90_unavailable(params, dev);
  if (!unavailable.empty())
    throw Error(ErrorKind::kUnsupported, "FLASHSERVE_KERNEL", "sm90: " + unavailable);
  sm90::FwdArgs a{};
  a.q = params.q.data;
  a.k = params.k.data;
  a.v = params.v.data;
  a.out = params.out.data;
  a.lse = f.lse;
  a.dtype = pr.dtype;
  a.batch = static_cast<int>(pr.batch);
  a.seq_begin = static_cast<int>(l.seq_begin);
  a.seqs = static_cast<int>(l.seq_end - l.seq_begin);
  a.only = static_cast<int>(l.group);
  a.seqlen_q = static_cast<int>(params.q.shape[pr.varlen_q ? 0 : 1]);
  a.seqlen_k = static_cast<int>(params.k.shape[pr.varlen_k ? 0 : 1]);
  a.max_seqlen_q = static_cast<int>(l.max_q_len);  // the launch's sequences' longest
  a.max_seqlen_k = static_cast<int>(l.max_kv_len);
  a.cu_seqlens_q = f.cu_seqlens_q;
  a.cu_seqlens_k = f.cu_seqlens_k;
  a.seqused_k = f.seqused_k;
  a.block_table = f.block_table;
  a.block_table_stride = f.block_table_stride;
  a.num_pages = static_cast<int>(pr.num_pages);
  a.page_size = static_cast<int>(pr.page_size);
  a.k_page_stride = f.k_page_stride;
  a.v_page_stride = f.v_page_stride;
  a.h_q = static_cast<int>(pr.h_q);
  a.h_kv = static_cast<int>(pr.h_kv);
  a.head_dim = static_cast<int>(pr.head_dim);
  a.q_batch_stride = f.q_batch_stride, a.q_row_stride = f.q_row_stride;
  a.q_head_stride = f.q_head_stride;
  a.k_batch_stride = f.k_batch_stride, a.k_row_stride = f.k_row_stride;
  a.k_head_stride = f.k_head_stride;
  a.v_batch_stride = f.v_batch_stride, a.v_row_stride = f.v_row_stride;
  a.v_head_stride = f.v_head_stride;
  a.o_batch_stride = f.o_batch_stride, a.o_row_stride = f.o_row_stride;
  a.o_head_stride = f.o_head_stride;
  a.lse_batch_stride = f.lse_batch_stride, a.lse_row_stride = f.lse_row_stride;
  a.lse_head_stride = f.lse_head_stride;
  a.window_left = f.window_left;
  a.window_right = f.window_right;
  a.scale = pr.scale;
  a.sms = dev.sms;
  a.l2_bytes = dev.l2_bytes;
  a.tile_counter = l.kernel.tile_counter
                       ? reinterpret_cast<int*>(static_cast<char*>(workspace) + l.workspace_offset)
                       : nullptr;
  a.stream = stream;
  // O leaves by TMA only through a map of out, which needs strides TMA can describe (q's are
  // checked by sm90_unavailable; the run's out may differ from the plan's).
  a.epilogue = l.kernel.epilogue && tma_stride_problem(params.out, "out").empty();
  a.exp2_fma = l.kernel.exp2_fma;
  if (l.kernel.fp8) {
    const auto descale = [](const TensorView& d, const float*& ptr, int64_t& batch_stride,
                            int64_t& head_stride) {
      ptr = d.defined() ? d.ptr<const float>() : nullptr;
      batch_stride = d.defined() ? d.stride[0] : 0;
      head_stride = d.defined() ? d.stride[1] : 0;
    };
    descale(params.q_descale, a.q_descale, a.q_descale_batch_stride, a.q_descale_head_stride);
    descale(params.k_descale, a.k_descale, a.k_descale_batch_stride, a.k_descale_head_stride);
    descale(params.v_descale, a.v_descale, a.v_descale_batch_stride, a.v_descale_head_stride);
    a.vt = static_cast<char*>(workspace) + l.vt_offset;
    a.vt_keys = sm90::fp8_vt_keys(pr.max_kv_len);
    a.fp8_block_n = l.kernel.block_n;
  }
  sm90::run_fwd(a);
#else
  (void)l, (void)f, (void)params, (void)pr, (void)dev, (void)workspace, (void)stream;
  throw Error(ErrorKind::kUnsupported, "FLASHSERVE_KERNEL", "sm90: this build has no sm90 kernels");
#endif
}

}  // namespace

void cuda_run(const Plan& plan, const AttentionParams& params, const Problem& pr,
              const AttentionRunOptions& options) {
  const DeviceProps& dev = check_supported(params, pr);
  if (plan.launches.empty()) return;
  DeviceGuard guard(pr.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(params.stream);
  if (check_indices_requested()) check_device_indices(params, stream);
  const sm80::FwdParams base = fwd_params(params, pr);
  // The sm80 family's launches (every decode's) may start programmatically (their kernels wait
  // for the stream's previous kernel first); the sm90 kernels launch as before.
  const bool pdl = options.programmatic_launch && dev.major >= 9;

  // Split-KV partials live in the caller's workspace (the plan says how much; a serving loop
  // allocates it once, which keeps the call CUDA-graph safe). Without one (explicit splits, or a
  // plan made for a workspace that was not given) a stream-ordered scratch allocation serves.
  void* workspace = params.workspace;
  StreamScratch scratch(stream);
  if (plan.workspace_bytes > 0) {
    if (workspace == nullptr) {
      workspace = scratch.allocate(plan.workspace_bytes);
    } else if (params.workspace_bytes < plan.workspace_bytes ||
               reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
      throw Error(
          ErrorKind::kInvalidArgument, "workspace",
          str_cat("this plan needs ", plan.workspace_bytes,
                  " bytes of 16-byte aligned device workspace, got ", params.workspace_bytes));
    }
  }

  for (const LaunchPlan& l : plan.launches) {
    if (l.kernel.family == KernelFamily::kSm90) {
      run_sm90(l, base, params, pr, dev, workspace, stream);
      continue;
    }
    const int64_t sequences = l.seq_end - l.seq_begin;
    const int splits = l.kernel.splits;
    if (sequences * splits > 65535)
      unsupported("num_splits", str_cat("batch x num_splits exceeds 65535"));
    sm80::FwdParams p = base;
    p.seq_begin = static_cast<int32_t>(l.seq_begin);
    p.seq_end = static_cast<int32_t>(l.seq_end);
    p.only = static_cast<int32_t>(l.group);
    p.num_splits = splits;
    p.q_rows = l.rows;
    p.partial_row0 = l.row_begin;
    p.partials_by_seq = l.kernel.decode;
    p.split_min_blocks = l.kernel.split_min_blocks;
    p.split_block_n = l.kernel.block_n;
    if (l.kernel.split_min_blocks > 0) {  // the item map, made before the split kernel reads it
      p.split_map = static_cast<char*>(workspace) + l.map_offset;
      if (!options.reuse_step_state) sm80::run_split_map(p, stream, pdl);  // else a layer's before
    }
    if (splits > 1 && !l.kernel.cluster_combine) {
      p.o_partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + l.workspace_offset);
      p.lse_partial =
          p.o_partial + static_cast<int64_t>(splits) * l.rows * pr.h_q * l.kernel.head_dim;
    }
    sm80::FwdLaunch launch{};
    if (pr.score_mod.any()) {  // the modifier kernels, in their units (changes p's scale)
      launch.has_score_mod = true;
      launch.score_mod = score_mod_params(pr, p);
    }
    launch.dtype = pr.dtype;
    launch.decode = l.kernel.decode;
    launch.cluster_combine = l.kernel.cluster_combine;
    launch.has_mask = l.kernel.masked;
    launch.paged = l.kernel.paged;
    launch.batch = static_cast<int>(sequences);
    launch.max_q_len = static_cast<int>(l.max_q_len);
    launch.max_kv_len = static_cast<int>(l.max_kv_len);
    launch.smem_per_block = plan.smem_per_block;
    launch.smem_per_sm = dev.smem_per_sm;
    launch.sms = dev.sms;
    launch.l2_bytes = dev.l2_bytes;
    launch.stream = stream;
    launch.pdl = pdl;
    launch.head_dim = static_cast<int>(pr.head_dim);
    launch.head_dim_v = static_cast<int>(pr.head_dim_v);
    if (l.kernel.kv_fp8) {
      launch.kv_fp8_register = l.kernel.kv_fp8_register;
      if (params.k_descale.defined()) {
        launch.k_descale = params.k_descale.ptr<const float>();
        launch.k_descale_batch_stride = params.k_descale.stride[0];
        launch.k_descale_head_stride = params.k_descale.stride[1];
      }
      if (params.v_descale.defined()) {
        launch.v_descale = params.v_descale.ptr<const float>();
        launch.v_descale_batch_stride = params.v_descale.stride[0];
        launch.v_descale_head_stride = params.v_descale.stride[1];
      }
    }
    const auto run = l.kernel.kv_fp8
                         ? std::array{&sm80::run_fwd_kv_fp8<64>, &sm80::run_fwd_kv_fp8<128>,
                                      &sm80::run_fwd_kv_fp8<256>}
                     : l.kernel.padded
                         ? std::array{&sm80::run_fwd_padded<64>, &sm80::run_fwd_padded<128>,
                                      &sm80::run_fwd_padded<256>}
                         : std::array{&sm80::run_fwd<64>, &sm80::run_fwd<128>, &sm80::run_fwd<256>};
    switch (l.kernel.head_dim) {
      case 64:
        run[0](p, launch);
        break;
      case 128:
        run[1](p, launch);
        break;
      case 256:
        run[2](p, launch);
        break;
      default:
        throw Error(ErrorKind::kInternal, "q",
                    str_cat("the plan chose an sm80 kernel of head dim ", l.kernel.head_dim));
    }
    if (splits > 1 && !l.kernel.cluster_combine) {
      // A length-aware launch gives a long sequence's row more items than `splits`: up to its
      // key blocks over the shares' floor.
      const int row_splits =
          l.kernel.split_min_blocks > 0
              ? std::max<int>(splits, kernel::items_for(
                                          kernel::decode_key_blocks(static_cast<int>(l.max_kv_len),
                                                                    -1, l.kernel.block_n),
                                          l.kernel.split_min_blocks))
              : splits;
      sm80::run_combine(p, pr.dtype, l.kernel.head_dim, stream,
                        l.kernel.padded ? static_cast<int>(pr.head_dim_v) : 0, row_splits, pdl);
    }
  }
}

// attention_forward's CUDA path: a plan from the call's own (device-side) lengths, then its run.
void cuda_forward(const AttentionParams& params, const Problem& pr) {
  cuda_run(cuda_plan(params, pr, HostLengths{}, params.workspace != nullptr), params, pr, {});
}

// The workspace that attention_forward's plan takes when a workspace is given.
// The plan begins with the checks of what the kernels support (check_supported): a call that
// attention_forward would refuse is refused here too, with the same error, so that a caller who
// sizes the workspace first (flash_attn_with_kvcache, before it writes the cache) learns it then.
size_t cuda_workspace_size(const AttentionParams& params, const Problem& pr) {
  if (pr.batch == 0 || pr.max_q_len == 0) return 0;
  return cuda_plan(params, pr, HostLengths{}, true).workspace_bytes;
}

}  // namespace flashserve::attention
