// The front door with threads: requests submitted from several threads at once each get exactly
// the tokens they get alone; a stream closed (or dropped) half way ends its request with kAbort and
// frees its blocks; refused requests are refused in the caller's thread; stop() ends every stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "engine/executor.h"
#include "engine/front_door.h"
#include "engine/model_engine.h"
#include "engine/tiny_model.h"
#include "flashserve/error.h"
#include "model/test_dirs.h"

namespace fe = flashserve::engine;
namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

struct Fixture {
  fe::LoadedModel model;
  std::unique_ptr<fe::EngineLoop> loop;
  const fe::Engine* engine = nullptr;
};

Fixture start(int64_t blocks) {
  Fixture f;
  fe::ModelEngineOptions mo;
  mo.model_dir = fe::testing::tiny_dir();
  mo.num_blocks = blocks;
  f.model = fe::load_model(mo);
  fs::SchedulerConfig sc;
  sc.max_tokens_per_step = 48;
  sc.max_running = 8;
  sc.max_model_len = 256;
  sc.chunk_tile = 16;
  auto engine = fe::make_model_engine(f.model, sc);
  f.engine = engine.get();
  f.loop = std::make_unique<fe::EngineLoop>(std::move(engine));
  return f;
}

fe::NewRequest request(int thread, int i) {
  fe::NewRequest n;
  for (int t = 0; t < 20 + 13 * i + thread; ++t)
    n.prompt.push_back(7 + (t * 31 + thread * 101 + i) % 1000);
  n.max_tokens = 6 + (i + thread) % 9;
  n.ignore_eos = true;
  return n;
}

TEST(FrontDoor, ConcurrentSubmittersGetTheirOwnTokens) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  auto runner = flashserve::model::make_cpu_runner(fe::testing::tiny_dir());
  constexpr int kThreads = 4, kPerThread = 3;
  std::vector<std::vector<std::vector<int32_t>>> want(kThreads), got(kThreads);
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kPerThread; ++i) {
      const fe::NewRequest r = request(t, i);
      want[t].push_back(fe::testing::generate_alone(*runner, r.prompt, r.max_tokens).tokens);
    }
  Fixture f = start(64);  // 1024 token slots for 12 requests of up to ~80: some preemption
  std::vector<std::thread> threads;
  std::atomic<int> aborted{0};
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::shared_ptr<fe::TokenStream>> streams;
      for (int i = 0; i < kPerThread; ++i) streams.push_back(f.loop->submit(request(t, i)));
      // A fifth request whose reader goes away after its first tokens.
      auto quitter = f.loop->submit(request(t, 9));
      std::vector<int32_t> first;
      quitter->read(first);
      quitter->close();
      for (auto& s : streams) {
        got[t].push_back(s->read_all());
        EXPECT_EQ(s->finish_reason(), fs::FinishReason::kLength);
      }
      quitter->read_all();
      aborted += quitter->finish_reason() == fs::FinishReason::kAbort;
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kPerThread; ++i)
      EXPECT_EQ(got[t][i], want[t][i]) << "thread " << t << " request " << i;
  // A quitter may have finished (14 tokens at most) before its close arrived; most do not.
  EXPECT_GE(aborted.load(), 1);
  f.loop->stop();
  EXPECT_EQ(f.engine->blocks().num_free(), f.engine->blocks().num_blocks());
  EXPECT_FALSE(f.engine->has_work());
}

// One reader of several streams (an HTTP request's n choices) waits on one StreamSignal: every
// push raises it, so waiting past the count read before looking at the streams never misses a
// token, and the reader gets every token of every stream without polling.
TEST(FrontDoor, OneSignalWakesTheReaderOfSeveralStreams) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  Fixture f = start(64);
  auto signal = std::make_shared<fe::StreamSignal>();
  std::vector<std::shared_ptr<fe::TokenStream>> streams;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(f.loop->submit(request(5, i)));
    streams.back()->raise_on_push(signal);
  }
  std::vector<std::vector<int32_t>> got(streams.size());
  std::vector<bool> ended(streams.size(), false);
  int waits = 0;
  while (std::find(ended.begin(), ended.end(), false) != ended.end()) {
    const uint64_t seen = signal->count();
    bool any = false;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (ended[i] || !streams[i]->wait(std::chrono::milliseconds(0))) continue;
      any = true;
      if (!streams[i]->read(got[i])) ended[i] = true;
    }
    if (any) continue;
    // Nothing ready: the next push must come within the wait (a step takes milliseconds here).
    ASSERT_TRUE(signal->wait_past(seen, std::chrono::seconds(10))) << "a push was missed";
    ++waits;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(static_cast<int64_t>(got[i].size()), request(5, i).max_tokens) << i;
    EXPECT_EQ(streams[i]->finish_reason(), fs::FinishReason::kLength) << i;
  }
  EXPECT_GT(waits, 0);
  EXPECT_GE(signal->count(), 3u);
}

TEST(FrontDoor, DroppedStreamsAbortAndRefusalsAreSynchronous) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  Fixture f = start(64);
  fe::NewRequest too_long = request(0, 0);
  too_long.max_tokens = 1000;
  EXPECT_THROW(f.loop->submit(too_long), Error);
  fe::NewRequest bad_sampling = request(0, 0);
  bad_sampling.sampling.top_p = 2;
  EXPECT_THROW(f.loop->submit(bad_sampling), Error);
  for (int i = 0; i < 8; ++i) {
    fe::NewRequest r = request(1, i);
    r.max_tokens = 100;
    f.loop->submit(r);  // dropped at once: aborted by the stream's destructor
  }
  auto kept = f.loop->submit(request(2, 1));
  const auto tokens = kept->read_all();
  EXPECT_EQ(static_cast<int64_t>(tokens.size()), request(2, 1).max_tokens);
  // The dropped requests were aborted, not run: the loop goes idle long before the 100 decode
  // steps they would take.
  int64_t steps = -1;
  for (int i = 0; i < 50 && steps != f.loop->steps(); ++i) {
    steps = f.loop->steps();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_LT(steps, 60);
  // Stopping with a request running ends its stream.
  fe::NewRequest longer = request(3, 2);
  longer.max_tokens = 200;
  auto running = f.loop->submit(longer);
  std::vector<int32_t> some;
  running->read(some);
  f.loop->stop();
  running->read_all();
  EXPECT_EQ(running->finish_reason(), fs::FinishReason::kAbort);
  EXPECT_EQ(f.loop->failure(), "");  // stopped, not failed
  EXPECT_EQ(f.engine->blocks().num_free(), f.engine->blocks().num_blocks());
  EXPECT_THROW(f.loop->submit(request(0, 0)), Error);
}

// An executor whose third step fails, as a device error would. It holds its first step until `go`
// so that both requests are in before anything runs.
class FailingExecutor final : public fe::Executor {
 public:
  explicit FailingExecutor(const std::atomic<bool>& go) : go_(go) {}
  std::vector<int32_t> execute(const fs::Batch& batch) override {
    while (!go_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (++steps_ == 3) throw Error(flashserve::ErrorKind::kInternal, "device", "lost");
    return std::vector<int32_t>(batch.entries.size(), 7);
  }
  double now() const override { return static_cast<double>(steps_); }
  void wait_until(double) override {}
  std::string describe() const override { return "failing"; }

 private:
  const std::atomic<bool>& go_;
  int steps_ = 0;
};

TEST(FrontDoor, AFailedStepEndsEveryStreamAndSaysWhy) {
  fe::EngineConfig ec;
  ec.scheduler.max_model_len = 64;
  ec.num_blocks = 32;
  std::atomic<bool> go{false};
  fe::EngineLoop loop(std::make_unique<fe::Engine>(ec, std::make_unique<FailingExecutor>(go)));
  fe::NewRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 20;
  auto a = loop.submit(r), b = loop.submit(r);
  EXPECT_EQ(loop.failure(), "");
  go = true;
  const auto got = a->read_all();
  EXPECT_LT(got.size(), 3u);  // two steps ran at most
  EXPECT_EQ(a->finish_reason(), fs::FinishReason::kAbort);
  b->read_all();
  EXPECT_EQ(b->finish_reason(), fs::FinishReason::kAbort);
  try {
    loop.submit(r);
    ADD_FAILURE() << "a stopped loop took a request";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stopped: device: lost"), std::string::npos) << e.what();
  }
  // What the server reads to tell a failed engine from a stopped one (stop() leaves it empty).
  EXPECT_EQ(loop.failure(), "device: lost");
}

}  // namespace
