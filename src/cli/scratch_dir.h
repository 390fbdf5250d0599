// A temporary directory that removes itself: where bench-serve and profile write the random
// checkpoint of a --shape.
#pragma once

#include <unistd.h>
#include <filesystem>
#include <string>
#include <system_error>

#include "flashserve/error.h"

namespace flashserve::cli {

struct ScratchDir {
  std::string path;
  explicit ScratchDir(bool make) {
    if (!make) return;
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "flashserve-bench-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      throw Error(ErrorKind::kInternal, "scratch", "cannot make a temporary directory");
    path = tmpl;
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

}  // namespace flashserve::cli
