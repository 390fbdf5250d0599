// The one exception type of the library. Its message always names the argument at fault and what
// was wrong with it, e.g. "q: head_dim 96 is not supported by the sm80 kernels (64, 128, 256)".
#pragma once

#include <stdexcept>
#include <string>

namespace flashserve {

enum class ErrorKind : int32_t {
  kInvalidArgument = 1,  // the caller passed something malformed (shape, stride, dtype, length...)
  kUnsupported = 2,      // well-formed, but no kernel implements it (head dim, dtype on a device)
  kCuda = 3,             // the CUDA runtime reported an error
  kInternal = 4,         // a bug in flashserve
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string argument, const std::string& what)
      : std::runtime_error(argument.empty() ? what : argument + ": " + what),
        kind_(kind),
        argument_(std::move(argument)) {}
  ErrorKind kind() const { return kind_; }
  const std::string& argument() const { return argument_; }

 private:
  ErrorKind kind_;
  std::string argument_;
};

}  // namespace flashserve
