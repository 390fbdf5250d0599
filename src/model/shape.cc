#include "model/shape.h"

#include "flashserve/error.h"

namespace flashserve::model {

int64_t ModelShape::layer_linear_params() const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  return hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * ffn;
}

int64_t ModelShape::weight_bytes() const {
  return (linear_params() + hidden * (embedding_rows > 0 ? embedding_rows : vocab)) *
         bytes_per_param;
}

void ModelShape::validate() const {
  if (layers < 1 || hidden < 1 || heads < 1 || kv_heads < 1 || head_dim < 1 || ffn < 1 ||
      vocab < 1 || max_context < 2 || bytes_per_param < 1 || kv_bytes_per_elem < 1)
    throw Error(ErrorKind::kInvalidArgument, "model", name + ": every dimension must be positive");
  if (heads % kv_heads)
    throw Error(ErrorKind::kInvalidArgument, "model",
                name + ": heads must be a multiple of kv_heads");
}

}  // namespace flashserve::model
