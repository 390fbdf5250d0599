// What a call that should refuse a command line says: its UsageError's text, or "accepted".
#pragma once

#include <string>

#include "cli/options.h"

namespace flashserve::cli {

inline std::string error_of(auto&& call) {
  try {
    call();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace flashserve::cli
