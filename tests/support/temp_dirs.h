// Directories a test binary makes under gtest's temporary directory are removed when it exits:
// a fresh name per run (the pid) kept runs apart, but every run left its checkpoints behind
// (4.3 GB of /tmp on the development machine after a few hundred runs).
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace flashserve::testing {

class TempDirs {
 public:
  static TempDirs& instance() {
    static TempDirs dirs;
    return dirs;
  }
  // `path` (made or about to be made by the caller) goes when the binary exits.
  void remove_at_exit(const std::filesystem::path& path) {
    const std::lock_guard<std::mutex> lock(mu_);
    paths_.push_back(path);
  }
  ~TempDirs() {
    // A death test's child re-runs the binary and registers its own paths: only the process that
    // made a path removes it.
    if (::getpid() != owner_) return;
    std::error_code ec;
    for (const auto& p : paths_) std::filesystem::remove_all(p, ec);
  }

 private:
  TempDirs() : owner_(::getpid()) {}
  std::mutex mu_;
  std::vector<std::filesystem::path> paths_;
  pid_t owner_;
};

// An empty directory `name` under gtest's temporary directory (whatever was there is removed),
// removed again when the binary exits.
inline std::string temp_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  TempDirs::instance().remove_at_exit(p);
  return p.string();
}

}  // namespace flashserve::testing
