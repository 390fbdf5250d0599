#include "serve/length_table.h"

#include <charconv>
#include <fstream>
#include <sstream>

#include "flashserve/error.h"

namespace flashserve::serve {

namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream ss(line);
  for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
  return cells;
}

int column(const std::vector<std::string>& header, const std::string& name) {
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return static_cast<int>(i);
  return -1;
}

}  // namespace

LengthTable read_length_table(std::istream& in, const std::string& name) {
  auto bad = [&](int64_t line, const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, "workload",
                name + ":" + std::to_string(line) + ": " + what);
  };
  std::string line;
  if (!std::getline(in, line)) bad(1, "empty");
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const std::vector<std::string> header = split(line);
  const int pc = column(header, "num_prefill_tokens"), oc = column(header, "num_decode_tokens");
  if (pc < 0 || oc < 0) bad(1, "the header lacks num_prefill_tokens or num_decode_tokens");
  LengthTable t;
  t.name = name;
  for (int64_t lineno = 2; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<std::string> cells = split(line);
    auto cell = [&](int k) {
      if (k >= static_cast<int>(cells.size())) bad(lineno, "too few cells");
      const std::string& c = cells[k];
      int64_t v = 0;
      const auto [ptr, ec] = std::from_chars(c.data(), c.data() + c.size(), v);
      if (ec != std::errc() || ptr != c.data() + c.size() || v < 1 || v > (int64_t{1} << 31) - 1)
        bad(lineno, "'" + c + "' is not a token count in [1, 2^31 - 1]");
      return v;
    };
    t.prompt.push_back(cell(pc));
    t.output.push_back(cell(oc));
  }
  if (t.prompt.empty()) bad(2, "no rows");
  return t;
}

LengthTable load_length_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kInvalidArgument, "workload", "cannot open '" + path + "'");
  return read_length_table(in, path);
}

bool is_length_table(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  return line.find("num_prefill_tokens") != std::string::npos;
}

}  // namespace flashserve::serve
