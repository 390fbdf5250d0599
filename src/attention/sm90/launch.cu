#include "launch.h"

#include "bwd_launch.h"

#include "common/str_cat.h"
#include "flashserve/error.h"

namespace flashserve::attention::sm90 {

void run_fwd(const FwdArgs& args) {
  if (args.dtype == DType::kFloat8E4M3) {
    switch (args.head_dim) {
      case 64:
        return run_fwd_fp8_hdim<64>(args);
      case 128:
        return run_fwd_fp8_hdim<128>(args);
      case 256:
        return run_fwd_fp8_hdim<256>(args);
      default:
        throw Error(ErrorKind::kUnsupported, "q",
                    str_cat("head_dim ", args.head_dim,
                            " has no sm90 float8_e4m3fn kernel yet (64, 128, 256)"));
    }
  }
  switch (args.head_dim) {
    case 64:
      return run_fwd_hdim<64>(args);
    case 128:
      return run_fwd_hdim<128>(args);
    case 256:
      return run_fwd_hdim<256>(args);
    default:
      throw Error(ErrorKind::kUnsupported, "q",
                  str_cat("head_dim ", args.head_dim, " has no sm90 kernel yet (64, 128, 256)"));
  }
}

void run_bwd(const sm80::BwdParams& params, const BwdArgs& args, int head_dim) {
  switch (head_dim) {
    case 64:
      return run_bwd_hdim<64>(params, args);
    case 128:
      return run_bwd_hdim<128>(params, args);
    default:
      // 136-248 padded to 256 (bwd_hdim256.cu).
      if (head_dim > 128 && head_dim <= 256 && head_dim % 8 == 0)
        return run_bwd_hdim<256>(params, args);
      throw Error(ErrorKind::kUnsupported, "q",
                  str_cat("head_dim ", head_dim,
                          " has no sm90 backward kernel (64, 128, multiples of 8 in 136-256)"));
  }
}

}  // namespace flashserve::attention::sm90
