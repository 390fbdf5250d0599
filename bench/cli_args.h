// The benchmarks' command lines: a named option's value and comma-separated integer lists (no
// CUDA here, so the CPU benchmarks share it too).
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// The value after `name` on the command line, or `fallback`.
inline std::string arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

// "4096,8192" -> {4096, 8192}.
inline std::vector<int> parse_int_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}
