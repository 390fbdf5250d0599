// make_cuda_runner and make_random_cuda_runner in a build without the model's CUDA runner
// (src/model/cuda_runner.cu replaces this file when CUDA is built; see src/CMakeLists.txt).
#include "flashserve/error.h"
#include "model/runner.h"

namespace flashserve::model {

std::unique_ptr<ModelRunner> make_cuda_runner(const std::string& dir, int device,
                                              int tensor_parallel_size) {
  (void)dir;
  (void)device;
  (void)tensor_parallel_size;
  throw Error(ErrorKind::kUnsupported, "device",
              "cuda: this flashserve is built without the CUDA model runner (use --device cpu)");
}

std::unique_ptr<ModelRunner> make_random_cuda_runner(const ModelConfig& config, uint64_t seed,
                                                     int device, int tensor_parallel_size) {
  (void)config;
  (void)seed;
  return make_cuda_runner("", device, tensor_parallel_size);
}

}  // namespace flashserve::model
