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
  if (config.auto_budget_slo_s > 0)
    engine.set_auto_budget(std::make_unique<serve::AutoBudget>(
        cost, serve::AutoBudgetConfig::for_scheduler(config.scheduler, config.num_blocks,
                                                     config.block_size, config.auto_budget_slo_s)));
  return replay(engine, requests);
}

}  // namespace flashserve::engine
