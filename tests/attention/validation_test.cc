// Every check in src/attention/problem.cc: a call that breaks it must throw flashserve::Error with
// the right kind, argument() and message. Each check is a named test built by mutating a valid
// call.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention/problem.h"
#include "support/attention_case.h"

namespace flashserve::testing {
namespace {

enum class Base { kDense, kVarlen, kPaged, kSequsedDense };

CaseSpec base_spec(Base b) {
  CaseSpec s;
  s.head_dim = 8;
  s.h_q = 4;
  s.h_kv = 2;
  s.seed = 3;
  switch (b) {
    case Base::kDense:
      s.batch = 3;
      s.q_lens = {5};
      s.kv_lens = {7};
      break;
    case Base::kVarlen:
      s.batch = 3;
      s.q_lens = {2, 0, 5};
      s.kv_lens = {4, 6, 3};
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kVarlen;
      break;
    case Base::kPaged:
      s.batch = 2;
      s.q_lens = {3, 1};
      s.kv_lens = {20, 9};
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kPaged;
      s.page_size = 8;
      break;
    case Base::kSequsedDense:
      s.batch = 2;
      s.q_lens = {3};
      s.kv_lens = {6, 4};
      s.use_seqused_k = true;
      s.kv_extra = 2;
      break;
  }
  return s;
}

int32_t* ints(const TensorView& t) {
  return static_cast<int32_t*>(t.data);
}

void all_on_cuda(AttentionParams& p) {
  for (TensorView* t : {&p.q, &p.k, &p.v, &p.out, &p.lse, &p.cu_seqlens_q, &p.cu_seqlens_k,
                        &p.seqused_k, &p.block_table})
    t->device = {DeviceType::kCUDA, 0};
}

struct Check {
  std::string name;
  Base base;
  std::function<void(AttentionParams&)> mutate;
  std::string argument;
  std::string message;  // a substring of what()
  ErrorKind kind = ErrorKind::kInvalidArgument;
};

const Device kCuda{DeviceType::kCUDA, 0};
constexpr int64_t kBig = std::numeric_limits<int64_t>::max();

// ALiBi slopes for the checks: room for [batch, h_q] of the dense base (3 x 4), all 0.25.
float g_slopes[12] = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f,
                      0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
TensorView slopes(int64_t rows, int64_t cols = 0) {
  TensorView t;
  t.data = g_slopes;
  t.dtype = DType::kFloat32;
  t.rank = cols ? 2 : 1;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.stride[0] = cols ? cols : 1;
  t.stride[1] = 1;
  return t;
}

std::vector<Check> checks() {
  using P = AttentionParams&;
  return {
      // Combinations of the optional tensors.
      {"CuSeqlensKWithBlockTable", Base::kPaged, [](P p) { p.cu_seqlens_k = p.seqused_k; },
       "cu_seqlens_k", "cannot be combined with block_table"},
      {"BlockTableWithoutSeqused", Base::kPaged, [](P p) { p.seqused_k = {}; }, "seqused_k",
       "is required with block_table"},
      // check_view.
      {"QRank", Base::kDense, [](P p) { p.q.rank = 3; }, "q", "expected rank 4, got rank 3"},
      {"KRankVarlen", Base::kVarlen, [](P p) { p.k.rank = 4; }, "k", "expected rank 3, got rank 4"},
      {"NegativeSize", Base::kDense, [](P p) { p.q.shape[1] = -1; }, "q",
       "negative size -1 in dimension 1"},
      {"NegativeStride", Base::kDense, [](P p) { p.k.stride[0] = -5; }, "k",
       "negative stride -5 in dimension 0"},
      {"LastDimNotContiguous", Base::kDense, [](P p) { p.v.stride[3] = 2; }, "v",
       "the last dimension must be contiguous"},
      {"NullData", Base::kDense, [](P p) { p.out.data = nullptr; }, "out", "null data pointer"},
      {"NullDataWhoseSizeProductWraps", Base::kDense,
       [](P p) {  // 2^22 * 2^21 * 2^21 = 2^64 elements: numel() wraps to 0
         p.q.data = nullptr;
         p.q.shape[0] = int64_t{1} << 22;
         p.q.shape[1] = p.q.shape[2] = int64_t{1} << 21;
         p.q.stride[0] = p.q.stride[1] = p.q.stride[2] = 0;
       },
       "q", "null data pointer"},
      {"ExtentOverflowsElements", Base::kDense, [](P p) { p.q.stride[0] = kBig / 2 + 1; }, "q",
       "more elements than fit in 64 bits"},
      {"ExtentOverflowsBytes", Base::kDense, [](P p) { p.q.stride[0] = int64_t{1} << 61; }, "q",
       "more bytes than fit in 64 bits"},
      // Dtypes and devices.
      {"QDtypeNotFloat", Base::kDense, [](P p) { p.q.dtype = DType::kInt32; }, "q",
       "dtype int32 is not supported"},
      {"QDtypeFloat64", Base::kDense, [](P p) { p.q.dtype = DType::kFloat64; }, "q",
       "dtype float64 is not supported"},
      {"KDtypeDiffers", Base::kDense, [](P p) { p.k.dtype = DType::kInt32; }, "k",
       "dtype int32 differs from q's float32"},
      // A float32 q may read a 16-bit k and v (a KV cache), but v must then be k's.
      {"VDtypeDiffersFromNarrowerK", Base::kDense, [](P p) { p.k.dtype = DType::kFloat16; }, "v",
       "dtype float32 differs from k's float16"},
      {"OutDtypeDiffers", Base::kDense, [](P p) { p.out.dtype = DType::kBFloat16; }, "out",
       "dtype bfloat16 differs"},
      {"VDevice", Base::kDense, [](P p) { p.v.device = kCuda; }, "v",
       "must be on the same device as q"},
      {"OutDeviceIndex", Base::kDense,
       [](P p) {
         p.out.device = {DeviceType::kCPU, 1};
       },
       "out", "must be on the same device as q"},
      // Heads and head dims.
      {"NoQueryHeads", Base::kDense, [](P p) { p.q.shape[2] = p.out.shape[2] = 0; }, "q",
       "number of heads must be positive"},
      {"NoKvHeads", Base::kDense, [](P p) { p.k.shape[2] = p.v.shape[2] = 0; }, "k",
       "number of heads must be positive"},
      {"GqaNotAMultiple", Base::kDense, [](P p) { p.k.shape[2] = p.v.shape[2] = 3; }, "k",
       "h_q (4) must be a multiple of h_kv (3)"},
      {"HeadDimZero", Base::kDense, [](P p) { p.q.shape[3] = p.k.shape[3] = 0; }, "q",
       "head_dim 0 is not supported"},
      {"HeadDimTooLarge", Base::kDense, [](P p) { p.q.shape[3] = 513; }, "q",
       "head_dim 513 is not supported (1..512)"},
      {"HeadDimVZero", Base::kDense, [](P p) { p.v.shape[3] = p.out.shape[3] = 0; }, "v",
       "head_dim 0 is not supported"},
      {"KHeadDimDiffers", Base::kDense, [](P p) { p.k.shape[3] = 4; }, "k",
       "head_dim 4 differs from q's 8"},
      {"VShapeDiffers", Base::kDense, [](P p) { p.v.shape[1] -= 1; }, "v", "does not match k's"},
      {"OutShapeDiffers", Base::kDense, [](P p) { p.out.shape[1] -= 1; }, "out",
       "does not match q's"},
      {"OutHeadDimDiffers", Base::kDense, [](P p) { p.out.shape[3] = 4; }, "out",
       "head_dim 4 differs from v's 8"},
      // Aliasing.
      {"OutOverlapsQ", Base::kDense, [](P p) { p.out.data = p.q.data; }, "out", "overlaps q"},
      // out (3 x 5 x 4 x 8) is larger than k and v (3 x 7 x 2 x 8): with its batch stride 0 it
      // lies inside their buffers, so the neighbour it reaches on the heap (ASan's layout varies)
      // cannot be what the error names.
      {"OutOverlapsK", Base::kDense, [](P p) { p.out.data = p.k.data, p.out.stride[0] = 0; }, "out",
       "overlaps k"},
      {"OutOverlapsV", Base::kDense, [](P p) { p.out.data = p.v.data, p.out.stride[0] = 0; }, "out",
       "overlaps v"},
      {"OutOverlapsItself", Base::kDense, [](P p) { p.out.stride[1] = 0; }, "out",
       "distinct elements share memory"},
      {"LseOverlapsItself", Base::kDense, [](P p) { p.lse.stride[0] = 1; }, "lse",
       "distinct elements share memory"},
      {"LseOverlapsOut", Base::kDense, [](P p) { p.lse.data = p.out.data; }, "lse", "overlaps out"},
      {"LseOverlapsQ", Base::kDense, [](P p) { p.lse.data = p.q.data; }, "lse", "overlaps q"},
      // Outputs over the index tensors: writing them would corrupt lengths and page indices
      // that the CPU path reads while it writes.
      {"OutOverlapsBlockTable", Base::kPaged, [](P p) { p.block_table.data = p.out.data; }, "out",
       "overlaps block_table"},
      {"OutOverlapsSequsedK", Base::kSequsedDense, [](P p) { p.seqused_k.data = p.out.data; },
       "out", "overlaps seqused_k"},
      {"LseOverlapsCuSeqlensQ", Base::kVarlen, [](P p) { p.cu_seqlens_q.data = p.lse.data; }, "lse",
       "overlaps cu_seqlens_q"},
      {"LseOverlapsCuSeqlensK", Base::kVarlen, [](P p) { p.cu_seqlens_k.data = p.lse.data; }, "lse",
       "overlaps cu_seqlens_k"},
      // Varlen q.
      {"CuSeqlensQDtype", Base::kVarlen, [](P p) { p.cu_seqlens_q.dtype = DType::kFloat32; },
       "cu_seqlens_q", "expected int32, got float32"},
      {"CuSeqlensQRank", Base::kVarlen, [](P p) { p.cu_seqlens_q.rank = 2; }, "cu_seqlens_q",
       "expected rank 1, got rank 2"},
      {"CuSeqlensQStrided", Base::kVarlen, [](P p) { p.cu_seqlens_q.stride[0] = 2; },
       "cu_seqlens_q", "must be contiguous"},
      {"CuSeqlensQDevice", Base::kVarlen, [](P p) { p.cu_seqlens_q.device = kCuda; },
       "cu_seqlens_q", "must be on the same device as q"},
      {"CuSeqlensQEmpty", Base::kVarlen, [](P p) { p.cu_seqlens_q.shape[0] = 0; }, "cu_seqlens_q",
       "needs batch + 1 >= 1 entries"},
      {"CuSeqlensQFirstNegative", Base::kVarlen, [](P p) { ints(p.cu_seqlens_q)[0] = -1; },
       "cu_seqlens_q", "entry 0 is negative (-1)"},
      {"CuSeqlensQDecreasing", Base::kVarlen, [](P p) { ints(p.cu_seqlens_q)[2] = 1; },
       "cu_seqlens_q", "must be non-decreasing, but entry 2 (1) < entry 1 (2)"},
      {"CuSeqlensQPastRows", Base::kVarlen, [](P p) { ints(p.cu_seqlens_q)[3] = 8; },
       "cu_seqlens_q", "last entry 8 exceeds the 7 rows"},
      {"MaxSeqlenQTooSmall", Base::kVarlen, [](P p) { p.max_seqlen_q = 4; }, "max_seqlen_q",
       "4 is less than the longest sequence (5)"},
      // Varlen k.
      {"CuSeqlensKLength", Base::kVarlen, [](P p) { p.cu_seqlens_k.shape[0] = 3; }, "cu_seqlens_k",
       "expected 4 entries, got 3"},
      {"CuSeqlensKPastRows", Base::kVarlen, [](P p) { ints(p.cu_seqlens_k)[3] = 14; },
       "cu_seqlens_k", "exceeds the 13 rows"},
      {"MaxSeqlenKTooSmall", Base::kVarlen, [](P p) { p.max_seqlen_k = 5; }, "max_seqlen_k",
       "5 is less than the longest sequence (6)"},
      {"DenseKBatchDiffers", Base::kDense, [](P p) { p.k.shape[0] = p.v.shape[0] = 2; }, "k",
       "batch 2 differs from q's 3"},
      // Paged KV.
      {"BlockTableRank", Base::kPaged, [](P p) { p.block_table.rank = 1; }, "block_table",
       "expected rank 2, got rank 1"},
      {"BlockTableDtype", Base::kPaged, [](P p) { p.block_table.dtype = DType::kFloat32; },
       "block_table", "expected int32"},
      {"BlockTableDevice", Base::kPaged, [](P p) { p.block_table.device = kCuda; }, "block_table",
       "must be on the same device as q"},
      {"BlockTableRows", Base::kPaged, [](P p) { p.block_table.shape[0] = 1; }, "block_table",
       "has 1 rows for a batch of 2"},
      {"PageSizeZero", Base::kPaged, [](P p) { p.k.shape[1] = p.v.shape[1] = 0; }, "k",
       "page size (dimension 1 of the paged cache) must be positive"},
      {"BlockTableEntryNegative", Base::kPaged, [](P p) { ints(p.block_table)[1] = -1; },
       "block_table", "entry [0, 1] is -1, outside the pool"},
      {"BlockTableEntryPastPool", Base::kPaged,
       [](P p) {
         ints(p.block_table)[p.block_table.stride[0]] = static_cast<int32_t>(p.k.shape[0]);
       },
       "block_table", "entry [1, 0] is"},
      {"SequsedPastPages", Base::kPaged,
       [](P p) { ints(p.seqused_k)[1] = static_cast<int32_t>(p.block_table.shape[1] * 8 + 1); },
       "seqused_k", "entry 1 is"},
      {"PagedMaxSeqlenKTooSmall", Base::kPaged, [](P p) { p.max_seqlen_k = 19; }, "max_seqlen_k",
       "19 is less than the longest sequence (20)"},
      // seqused_k.
      {"SequsedLength", Base::kSequsedDense, [](P p) { p.seqused_k.shape[0] = 1; }, "seqused_k",
       "expected 2 entries, got 1"},
      {"SequsedDtype", Base::kSequsedDense, [](P p) { p.seqused_k.dtype = DType::kFloat32; },
       "seqused_k", "expected int32"},
      {"SequsedNegative", Base::kSequsedDense, [](P p) { ints(p.seqused_k)[0] = -2; }, "seqused_k",
       "entry 0 is -2, outside [0, 8]"},
      {"SequsedPastDenseKeys", Base::kSequsedDense, [](P p) { ints(p.seqused_k)[1] = 9; },
       "seqused_k", "entry 1 is 9, outside [0, 8]"},
      {"SequsedPastVarlenKeys", Base::kVarlen,
       [](P p) {
         static int32_t used[3] = {4, 7, 3};  // sequence 1 has 6 keys
         p.seqused_k = p.cu_seqlens_k;
         p.seqused_k.data = used;
         p.seqused_k.shape[0] = 3;
       },
       "seqused_k", "entry 1 is 7, outside [0, 6]"},
      // lse.
      {"LseRank", Base::kDense, [](P p) { p.lse.rank = 2; }, "lse", "expected rank 3, got rank 2"},
      {"LseDtype", Base::kDense, [](P p) { p.lse.dtype = DType::kFloat16; }, "lse",
       "expected float32, got float16"},
      {"LseDevice", Base::kDense, [](P p) { p.lse.device = kCuda; }, "lse",
       "must be on the same device as q"},
      {"LseShapeDense", Base::kDense, [](P p) { p.lse.shape[2] = 4; }, "lse",
       "does not match [batch, h_q, seqlen_q]"},
      {"LseShapeVarlen", Base::kVarlen, [](P p) { p.lse.shape[0] = 2; }, "lse",
       "does not match [h_q, total_q]"},
      // Scalars.
      {"ScaleNan", Base::kDense, [](P p) { p.softmax_scale = NAN; }, "softmax_scale",
       "must be finite"},
      {"ScaleInf", Base::kDense, [](P p) { p.softmax_scale = INFINITY; }, "softmax_scale",
       "must be finite"},
      // A subnormal scale is not "default" and not a usable scale (issue 9).
      {"ScaleSubnormal", Base::kDense, [](P p) { p.softmax_scale = 1e-40f; }, "softmax_scale",
       "is subnormal in float32 (0 asks for 1/sqrt(head_dim))"},
      {"ScaleNegativeSubnormal", Base::kDense, [](P p) { p.softmax_scale = -1e-45f; },
       "softmax_scale", "is subnormal in float32"},
      // Score modifiers.
      {"SoftcapNegative", Base::kDense, [](P p) { p.softcap = -1.0f; }, "softcap",
       "must be 0 (off) or a normal float32 in (0, 1e30], got -1"},
      {"SoftcapNan", Base::kDense, [](P p) { p.softcap = NAN; }, "softcap", "must be finite"},
      {"SoftcapInf", Base::kDense, [](P p) { p.softcap = INFINITY; }, "softcap", "must be finite"},
      {"SoftcapSubnormal", Base::kDense, [](P p) { p.softcap = 1e-40f; }, "softcap",
       "a normal float32 in (0, 1e30]"},
      {"SoftcapHuge", Base::kDense, [](P p) { p.softcap = 2e30f; }, "softcap",
       "a normal float32 in (0, 1e30]"},
      {"AlibiShape", Base::kDense, [](P p) { p.alibi_slopes = slopes(3); }, "alibi_slopes",
       "shape [3] is neither [h_q] = [4] nor [batch, h_q] = [3, 4]"},
      {"AlibiBatch", Base::kDense, [](P p) { p.alibi_slopes = slopes(2, 4); }, "alibi_slopes",
       "shape [2, 4] is neither"},
      {"AlibiRank", Base::kDense,
       [](P p) {
         p.alibi_slopes = slopes(1, 4);
         p.alibi_slopes.rank = 3;
         p.alibi_slopes.shape[2] = 1;
       },
       "alibi_slopes", "expected rank 1, got rank 3"},
      {"AlibiDtype", Base::kDense,
       [](P p) {
         p.alibi_slopes = slopes(4);
         p.alibi_slopes.dtype = DType::kFloat16;
       },
       "alibi_slopes", "expected float32, got float16"},
      {"AlibiDevice", Base::kDense,
       [](P p) {
         p.alibi_slopes = slopes(3, 4);
         p.alibi_slopes.device = kCuda;
       },
       "alibi_slopes", "must be on the same device as q"},
      {"AlibiNotFinite", Base::kDense,
       [](P p) {
         static float bad[12] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, NAN, 0.5f, 0.5f, 0.5f, 0.5f};
         p.alibi_slopes = slopes(3, 4);
         p.alibi_slopes.data = bad;
       },
       "alibi_slopes", "entry for sequence 1, head 2 is not finite"},
      // Misaligned elements (issue 9: a float32 array one byte off was read misaligned).
      {"MisalignedQ", Base::kDense, [](P p) { p.q.data = static_cast<char*>(p.q.data) + 1; }, "q",
       "-byte elements (float32)"},
      {"MisalignedV", Base::kDense, [](P p) { p.v.data = static_cast<char*>(p.v.data) + 2; }, "v",
       "is not aligned to its 4-byte"},
      {"MisalignedOut", Base::kDense, [](P p) { p.out.data = static_cast<char*>(p.out.data) + 3; },
       "out", "is not aligned"},
      {"MisalignedCuSeqlens", Base::kVarlen,
       [](P p) { p.cu_seqlens_q.data = static_cast<char*>(p.cu_seqlens_q.data) + 2; },
       "cu_seqlens_q", "is not aligned to its 4-byte elements (int32)"},
      {"WindowLeft", Base::kDense, [](P p) { p.window_left = -2; }, "window_left",
       "must be >= -1, got -2"},
      {"WindowRight", Base::kDense, [](P p) { p.window_right = -3; }, "window_right",
       "must be >= -1, got -3"},
      {"CausalWithWindowRight", Base::kDense,
       [](P p) {
         p.causal = true;
         p.window_right = 2;
       },
       "window_right", "must be 0 or -1 with causal, got 2"},
      {"NumSplitsNegative", Base::kDense, [](P p) { p.num_splits = -1; }, "num_splits",
       "must be in [0, 256], got -1"},
      {"NumSplitsTooMany", Base::kDense, [](P p) { p.num_splits = 257; }, "num_splits",
       "must be in [0, 256], got 257"},
      {"MaxSeqlenQNegative", Base::kDense, [](P p) { p.max_seqlen_q = -1; }, "max_seqlen_q",
       "must not be negative"},
      {"MaxSeqlenKNegative", Base::kDense, [](P p) { p.max_seqlen_k = -1; }, "max_seqlen_k",
       "must not be negative"},
      // CUDA tensors: lengths cannot be read, so the maxima are required.
      {"CudaVarlenNeedsMaxSeqlenQ", Base::kVarlen,
       [](P p) {
         all_on_cuda(p);
         p.max_seqlen_q = 0;
       },
       "max_seqlen_q", "is required with cu_seqlens_q on a CUDA device"},
      {"CudaPagedNeedsMaxSeqlenK", Base::kPaged,
       [](P p) {
         all_on_cuda(p);
         p.max_seqlen_k = 0;
       },
       "max_seqlen_k", "is required with cu_seqlens_k or block_table on a CUDA device"},
  };
}

void PrintTo(const Check& c, std::ostream* os) {
  *os << c.name;
}

class Validation : public ::testing::TestWithParam<Check> {};

TEST_P(Validation, RejectsWithNamedArgument) {
  const Check& c = GetParam();
  AttentionCase ac(base_spec(c.base));
  AttentionParams p = ac.params();
  ASSERT_NO_THROW(validate(p)) << "the unmutated call must be valid";
  c.mutate(p);
  try {
    validate(p);
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), c.kind) << e.what();
    EXPECT_EQ(e.argument(), c.argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << c.message;
    EXPECT_EQ(std::string(e.what()).rfind(c.argument + ": ", 0), 0u) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Checks, Validation, ::testing::ValuesIn(checks()),
                         [](const auto& info) { return info.param.name; });

TEST(ValidationValid, CudaCallsWithMaximaPassWithoutReadingLengths) {
  for (Base b : {Base::kVarlen, Base::kPaged}) {
    AttentionCase ac(base_spec(b));
    AttentionParams p = ac.params();
    all_on_cuda(p);
    // The views point at host memory: entries that would fail if describe() read them.
    for (const TensorView* t : {&p.cu_seqlens_q, &p.cu_seqlens_k, &p.seqused_k, &p.block_table})
      if (t->defined()) ints(*t)[0] = -1;
    const auto pr = attention::describe(p);
    EXPECT_EQ(pr.device.type, DeviceType::kCUDA);
  }
}

TEST(ValidationValid, ZeroLengthEverythingIsValid) {
  CaseSpec s = base_spec(Base::kVarlen);
  s.q_lens = {0, 0, 0};
  s.kv_lens = {0, 0, 0};
  AttentionCase ac(s);
  EXPECT_NO_THROW(attention_forward(ac.params()));
}

TEST(ValidationValid, NaiveBackwardRejectsPagedKv) {
  AttentionCase ac(base_spec(Base::kPaged));
  const AttentionParams p = ac.params();
  try {
    attention::reference::naive_backward(p, p.out);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(e.argument(), "block_table");
  }
}

// dout gets the checks of every tensor argument: a stride that would send the reads outside its
// buffer is an Error naming dout, not an out-of-bounds read.
TEST(ValidationValid, NaiveBackwardChecksDoutLayout) {
  AttentionCase ac(base_spec(Base::kDense));
  const AttentionParams p = ac.params();
  std::vector<float> dout(p.out.numel());
  for (const auto& [stride, message] :
       {std::pair{-1, "negative stride"}, std::pair{2, "must be contiguous"}}) {
    TensorView d = make_view(dout.data(), DType::kFloat32,
                             {p.out.shape[0], p.out.shape[1], p.out.shape[2], p.out.shape[3]});
    d.stride[stride < 0 ? 0 : 3] = stride;
    try {
      attention::reference::naive_backward(p, d);
      FAIL() << "no error for stride " << stride;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "dout") << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// With cu_seqlens_k and seqused_k, the keys a sequence uses are seqused_k[b], not the stored
// cu_seqlens_k[b + 1] - cu_seqlens_k[b]: max_seqlen_k bounds the former (the contract), so a bound
// between the two is valid, and one below the longest used length is still an error.
TEST(ValidationValid, MaxSeqlenKBoundsTheUsedKeysWithSequsedK) {
  CaseSpec s = base_spec(Base::kVarlen);
  s.use_seqused_k = true;
  s.kv_extra = 5;  // stored lengths 9, 11, 8; used 4, 6, 3
  AttentionCase ac(s);
  AttentionParams p = ac.params();
  p.max_seqlen_k = 6;
  EXPECT_EQ(attention::describe(p).max_kv_len, 6);
  p.max_seqlen_k = 5;
  try {
    attention::describe(p);
    FAIL() << "no error for max_seqlen_k below the longest used length";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "max_seqlen_k") << e.what();
  }
}

}  // namespace
}  // namespace flashserve::testing
