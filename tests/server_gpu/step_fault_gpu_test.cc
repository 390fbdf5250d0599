// The server in process on the CUDA runner (the tiny checkpoint) when a step hits a real device
// fault: an executor wraps the runner's and, once the test arms it, enqueues on the runner's stream
// a kernel that stores through a null pointer before the step runs, so the runner's own next CUDA
// call fails with the sticky cudaErrorIllegalAddress. Every request must still be answered (the
// stream with an error event and [DONE], the others 500 engine_failed), /health answer 503 while
// the server drains, and the server stop on its own; every wait is bounded, nothing may hang.
// The scenario and its checks are the CPU test's (HttpServer.AStepThatFails..., an executor that
// throws): support/server_harness.h.
//
// Its own binary, one test: the fault leaves the process's CUDA context unusable, so nothing else
// may run in this process after it (ctest runs each test in its own process anyway; this keeps a
// direct run of the binary safe too). Without a CUDA device it skips with "skipped: no CUDA
// device".
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "engine/front_door.h"
#include "engine/model_engine.h"
#include "engine/model_executor.h"
#include "flashserve/error.h"
#include "model/cuda/cuda_runner.h"
#include "model_gpu/tiny_model.h"
#include "server/server.h"
#include "server_gpu/device_fault.h"
#include "support/cuda_skip.h"
#include "support/server_harness.h"

namespace flashserve::testing {
namespace {

TEST(ServerGpu, ADeviceFaultInAStepEndsEveryRequestWithAnErrorAndStopsTheServer) {
  SKIP_WITHOUT_CUDA();
  auto control = std::make_shared<HeldFaultExecutor::Control>();
  auto hold = std::make_shared<HoldingCodec::Hold>();
  Running s(
      {},
      [&] {
        engine::ModelEngineOptions mo;
        mo.model_dir = tiny_checkpoint_dir();
        mo.device = "cuda";
        mo.num_blocks = 256;  // not 90% of the GPU: the test needs a few
        const engine::LoadedModel m = engine::load_model(mo);
        auto* cuda = dynamic_cast<model::cuda::CudaRunner*>(m.runner.get());
        if (!cuda) throw Error(ErrorKind::kInternal, "runner", "not the CUDA runner");
        void* stream = cuda->stream();
        serve::SchedulerConfig sc;
        sc.max_running = 2;  // the third request waits behind the two of the failing step
        sc.max_model_len = 256;
        auto executor = std::make_unique<HeldFaultExecutor>(
            control, std::make_unique<engine::ModelExecutor>(m.runner, m.block_size, m.device),
            [stream] { launch_illegal_store(stream); });
        auto engine = engine::make_model_engine(m, sc, engine::EngineConfig{}.watermark,
                                                /*prefix_caching=*/false, std::move(executor));
        server::Backend b;
        b.max_model_len = engine->config().scheduler.max_model_len;
        b.codec = std::make_unique<HoldingCodec>(hold);
        b.loop = std::make_unique<engine::EngineLoop>(std::move(engine));
        return b;
      },
      /*expect_failure=*/true);
  ASSERT_TRUE(
      wait_until([&] { return s.server->ready() || s.returned.load(); }, std::chrono::seconds(300)))
      << "the model did not load";
  ASSERT_TRUE(s.server->ready()) << "loading failed: " << s.run_error;

  const StepFaultOutcome o = drive_step_fault(s, *control, *hold);
  expect_step_fault_outcome(o, s);
  // The fault was the device's own: the context still holds it (sticky), whatever call of the
  // runner's saw it first (a CUDA runtime call or cuBLASLt's).
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress) << s.run_error;
  std::printf("the step's failure as the server reported it: %s\n", s.run_error.c_str());
}

}  // namespace
}  // namespace flashserve::testing
