// Reading a whole small file (config.json, an index, tokenizer.json) with errors that say what is
// wrong with the path: a directory, a named pipe or a device is refused before it is read (a pipe
// opened for reading would block forever, and a directory reads as an empty string, which then
// fails later as "not valid JSON"), and every system error carries its errno text.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "flashserve/error.h"

namespace flashserve {

// Throws Error(kInvalidArgument, path, ...) for anything but a readable regular file.
inline std::string read_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw Error(ErrorKind::kInvalidArgument, path,
                std::string("cannot be opened: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    throw Error(ErrorKind::kInvalidArgument, path,
                dir ? "is a directory, not a file" : "is not a regular file");
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw Error(ErrorKind::kInvalidArgument, path, "cannot be read: " + why);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace flashserve
