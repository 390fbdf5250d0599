#include "server/stop_strings.h"

#include <algorithm>
#include <utility>

namespace flashserve::server {

std::string StopStrings::feed(const std::string& piece) {
  if (stopped_) return {};
  held_ += piece;
  if (stops_.empty()) return std::exchange(held_, {});
  // The earliest stop string (the first listed of those starting there).
  size_t first = std::string::npos, length = 0;
  for (const std::string& s : stops_)
    if (const size_t at = held_.find(s); at < first) first = at, length = s.size();
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, include_ ? first + length : first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail of held_ that is a proper prefix of a stop string.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::flush() {
  return stopped_ ? std::string() : std::exchange(held_, {});
}

}  // namespace flashserve::server
