// Builds a message from pieces without iostreams. The library is loaded into processes that may
// carry another libstdc++ (Python with PyTorch): there, formatting through std::ostream crashed in
// the locale's facets (seen on the device, numpy 2.5 + torch 2.11), while std::to_string and
// snprintf do not touch the C++ locale at all.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

namespace flashserve {

namespace detail {
inline void append(std::string& s, std::string_view piece) {
  s.append(piece);
}
inline void append(std::string& s, const char* piece) {
  s.append(piece ? piece : "(null)");
}
inline void append(std::string& s, char c) {
  s.push_back(c);
}
template <typename T>
requires std::is_integral_v<T> &&
    (!std::is_same_v<T, char>)&&(!std::is_same_v<T, bool>)void append(std::string& s, T value) {
  s.append(std::to_string(value));
}
inline void append(std::string& s, bool value) {
  s.append(value ? "true" : "false");
}
inline void append(std::string& s, double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", value);
  s.append(buf);
}
}  // namespace detail

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::string s;
  (detail::append(s, args), ...);
  return s;
}

}  // namespace flashserve
