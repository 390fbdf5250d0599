// What the CPU benchmarks share: wall and CPU clocks and the median time of repeated calls, with
// the CPU time of all threads beside it (on a machine shared with other jobs, that still says
// what the code does per core-second). (Each benchmark is one translation unit: inline.)
#pragma once

#include <algorithm>
#include <chrono>
#include <ctime>
#include <vector>

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double cpu_now() {  // CPU time of every thread of the process
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Median wall time of the calls made in at least min_s seconds (at least min_calls, at most
// max_calls); *cpu_s (if given) gets the median CPU time of all threads, which on a machine shared
// with other jobs still says what the code does per core-second.
template <typename F>
double median_seconds(F&& f, double min_s = 0.3, int min_calls = 3, double* cpu_s = nullptr,
                      int max_calls = 50) {
  f();  // warm-up
  std::vector<double> t, c;
  const double start = now();
  while (static_cast<int>(t.size()) < min_calls || now() - start < min_s) {
    const double t0 = now(), c0 = cpu_now();
    f();
    t.push_back(now() - t0);
    c.push_back(cpu_now() - c0);
    if (static_cast<int>(t.size()) >= max_calls) break;
  }
  std::sort(t.begin(), t.end());
  std::sort(c.begin(), c.end());
  if (cpu_s) *cpu_s = c[c.size() / 2];
  return t[t.size() / 2];
}
