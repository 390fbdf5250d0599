#include "engine/simulator.h"

#include "engine/simulated_executor.h"

namespace flashserve::engine {

SimResult simulate(const std::vector<serve::Request>& requests, const SimConfig& config,
                   const serve::CostModel& cost, const StepObserver& observer) {
  EngineConfig ec;
  ec.scheduler = config.scheduler;
  ec.num_blocks = config.num_blocks;
  ec.block_size = config.block_size;
  ec.watermark = config.watermark;
  Engine engine(ec, std::make_unique<SimulatedExecutor>(cost));
  if (observer) engine.set_observer(observer);
  return replay(engine, requests);
}

}  // namespace flashserve::engine
