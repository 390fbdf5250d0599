// An on/off switch read from an environment variable, strictly: unset or empty keeps `fallback`,
// "0" is off, "1" is on, and anything else is refused naming the variable (a flag we do not
// understand is never guessed).
#pragma once

#include <cstring>
#include <string>

#include "flashserve/error.h"

namespace flashserve {

inline bool env_switch(const char* value, const char* variable, bool fallback) {
  if (value == nullptr || *value == '\0') return fallback;
  if (std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  throw Error(ErrorKind::kInvalidArgument, variable,
              std::string("must be 0 or 1, got \"") + value + "\"");
}

}  // namespace flashserve
