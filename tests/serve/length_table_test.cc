// Real request-length traces as workloads: the CSV reader (columns by name, every malformed kind
// refused naming file and line), sampling rows with the seed (only the table's rows, uniformly,
// prompts cut to max_model_len), and the checked-in ShareGPT trace's statistics as its README
// states them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "flashserve/error.h"
#include "serve/length_table.h"
#include "serve/workload.h"

namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

fs::LengthTable read(const std::string& text) {
  std::istringstream in(text);
  return fs::read_length_table(in, "t.csv");
}

TEST(LengthTable, ReadsColumnsByNameInAnyOrder) {
  const fs::LengthTable t =
      read("pd_ratio,num_decode_tokens,x,num_prefill_tokens\r\n0.5,20,a,40\n2,7,b,3\n\n");
  EXPECT_EQ(t.prompt, (std::vector<int64_t>{40, 3}));
  EXPECT_EQ(t.output, (std::vector<int64_t>{20, 7}));
}

TEST(LengthTable, RefusesMalformedFilesNamingTheLine) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "t.csv:1"},
      {"num_prefill_tokens,other\n1,2\n", "lacks"},
      {"num_prefill_tokens,num_decode_tokens\n", "no rows"},
      {"num_prefill_tokens,num_decode_tokens\n5,0\n", "t.csv:2"},
      {"num_prefill_tokens,num_decode_tokens\n5,6\n5.5,6\n", "t.csv:3"},
      {"num_prefill_tokens,num_decode_tokens\n5\n", "too few cells"},
      {"num_prefill_tokens,num_decode_tokens\n99999999999,6\n", "not a token count"},
  };
  for (const auto& [text, what] : bad) {
    try {
      read(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

TEST(LengthTable, WorkloadSamplesTheRowsUniformlyWithTheSeed) {
  auto table = std::make_shared<const fs::LengthTable>(
      read("num_prefill_tokens,num_decode_tokens\n100,10\n200,20\n5000,30\n"));
  fs::WorkloadSpec spec;
  spec.lengths = fs::LengthKind::kTable;
  spec.table = table;
  spec.num_requests = 3000;
  spec.max_model_len = 1000;
  spec.seed = 3;
  const auto reqs = fs::generate_workload(spec);
  std::map<int64_t, int64_t> by_output;
  for (const auto& r : reqs) {
    ++by_output[r.output_tokens];
    // Rows only; the 5000-token prompt is cut so that prompt + output fits.
    const int64_t want = r.output_tokens == 10 ? 100 : r.output_tokens == 20 ? 200 : 970;
    EXPECT_EQ(r.prompt_tokens, want);
  }
  ASSERT_EQ(by_output.size(), 3u);
  for (const auto& [out, n] : by_output) EXPECT_NEAR(n, 1000, 120) << "row with output " << out;
  EXPECT_EQ(fs::generate_workload(spec)[17].output_tokens, reqs[17].output_tokens);
  spec.seed = 4;
  const auto other = fs::generate_workload(spec);
  int64_t same = 0;
  for (size_t i = 0; i < reqs.size(); ++i) same += other[i].output_tokens == reqs[i].output_tokens;
  EXPECT_LT(same, 1300);  // independent draws agree a third of the time
  spec.table = nullptr;
  EXPECT_THROW(fs::generate_workload(spec), Error);
}

TEST(LengthTable, TheShareGptTraceHasTheStatisticsItsReadmeStates) {
  const std::string path =
      std::string(FLASHSERVE_SOURCE_DIR) + "/data/workloads/sharegpt-8k-llama2-tokens.csv";
  ASSERT_TRUE(fs::is_length_table(path));
  const fs::LengthTable t = fs::load_length_table(path);
  ASSERT_EQ(t.prompt.size(), 30731u);
  auto median = [](std::vector<int64_t> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  EXPECT_EQ(median(t.prompt), 1730);
  EXPECT_EQ(median(t.output), 415);
  EXPECT_EQ(*std::max_element(t.prompt.begin(), t.prompt.end()), 8141);
}

}  // namespace
