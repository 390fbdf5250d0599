// The CPU runner as one rank of a tensor-parallel model (model/tensor_parallel_runner.h joins the
// ranks); make_cpu_runner (runner.h) is the public way in.
#pragma once

#include <memory>
#include <string>

#include "model/communicator.h"
#include "model/runner.h"

namespace flashserve::model {

// The rank comm->rank() of comm->size() (comm null: the whole model): loads its slice of every
// weight; its forward takes part in comm's collectives, so every rank of the group must run the
// same batches. Error(kInvalidArgument, "tensor_parallel_size") for a size that does not split
// the model.
std::unique_ptr<ModelRunner> make_cpu_rank_runner(const std::string& dir, Communicator* comm);

}  // namespace flashserve::model
