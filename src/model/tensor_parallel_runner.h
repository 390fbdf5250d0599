// A tensor-parallel model as one ModelRunner: the ranks' runners, one thread each in this process
// (one per GPU on CUDA; docs/tensor-parallel.md says why threads, not processes), driven by the
// engine's one scheduler. forward() hands the same ForwardBatch to every rank at once (each
// blocks in its collectives until all arrive); the logits, all-gathered, are rank 0's, and rank 0
// samples. KV pools are per rank (its KV heads), sized by allocate_kv on all of them.
#pragma once

#include <memory>
#include <vector>

#include "model/communicator.h"
#include "model/runner.h"

namespace flashserve::model {

// `ranks[r]` computes with group->rank(r) (the group outlives them: the runner owns both). A rank
// that throws aborts the group, so that the others return; forward() rethrows the first error
// once every rank has returned, and recovers the group for the next step.
std::unique_ptr<ModelRunner> make_tensor_parallel_runner(
    std::unique_ptr<CommunicatorGroup> group, std::vector<std::unique_ptr<ModelRunner>> ranks);

}  // namespace flashserve::model
