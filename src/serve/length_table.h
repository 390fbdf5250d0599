// Request lengths of a real trace (prompt and output tokens per request, no arrival times), read
// from a CSV with the columns num_prefill_tokens and num_decode_tokens (the Sarathi-Serve and
// Vidur processed traces, data/workloads/). A workload samples its rows with its seed.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace flashserve::serve {

struct LengthTable {
  std::string name;
  std::vector<int64_t> prompt, output;  // one entry per row
};

// Throws Error(kInvalidArgument) naming the file and line: missing columns, cells that are not
// whole numbers in [1, 2^31 - 1], no rows.
LengthTable read_length_table(std::istream& in, const std::string& name);
LengthTable load_length_table(const std::string& path);

// Whether a CSV's header names the columns of a length table (so a caller can tell it from an
// arrival trace, serve/workload.h's read_trace).
bool is_length_table(const std::string& path);

}  // namespace flashserve::serve
