// Prometheus text exposition (format 0.0.4): counters, gauges and histograms written as
//   # HELP name help
//   # TYPE name histogram
//   name_bucket{le="0.01"} 3 ... name_bucket{le="+Inf"} n, name_sum s, name_count n
// Histograms are thread-safe (handlers observe from many threads); the text is rendered on demand.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace flashserve::server {

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, increasing (+Inf is implied).
  Histogram(std::string name, std::string help, std::vector<double> bounds);
  void observe(double value);
  void render(std::string& out) const;
  // The same histogram under another name, each sample with `labels` (`model_name="m"`): vLLM's
  // names beside ours, from one count.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  int64_t count() const;

 private:
  std::string name_, help_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// One sample of a counter or gauge with its HELP and TYPE lines.
void render_metric(std::string& out, const std::string& name, const char* type,
                   const std::string& help, double value, const std::string& labels = {});

}  // namespace flashserve::server
