#include "server/peer_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace flashserve::server {

namespace {

// One end of the connection as httplib wrote it (numeric host, port), with the host parsed once
// so that most descriptors are ruled out by comparing numbers.
struct Endpoint {
  const std::string& host;
  int port;
  int family = AF_UNSPEC;  // AF_UNSPEC: not parsed (an IPv6 scope, say): compared as text
  unsigned char addr[16] = {};

  Endpoint(const std::string& h, int p) : host(h), port(p) {
    if (::inet_pton(AF_INET, h.c_str(), addr) == 1)
      family = AF_INET;
    else if (::inet_pton(AF_INET6, h.c_str(), addr) == 1)
      family = AF_INET6;
  }

  bool is(const sockaddr_storage& a, socklen_t len) const {
    if (a.ss_family == AF_INET) {
      const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
      if (ntohs(v4.sin_port) != port) return false;
      if (family == AF_INET) return std::memcmp(&v4.sin_addr, addr, 4) == 0;
    } else if (a.ss_family == AF_INET6) {
      const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
      if (ntohs(v6.sin6_port) != port) return false;
      if (family == AF_INET6 && v6.sin6_scope_id == 0)
        return std::memcmp(&v6.sin6_addr, addr, 16) == 0;
    } else {
      return false;
    }
    // The port matches but the host is not comparable as numbers: as httplib formats it.
    char h[NI_MAXHOST];
    if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, nullptr, 0,
                      NI_NUMERICHOST) != 0)
      return false;
    return host == h;
  }
};

// Whether descriptor fd is the connection between these ends (false for anything else: a
// closed number, a file, another socket).
bool connects(int fd, const Endpoint& remote, const Endpoint& local) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !remote.is(a, len))
    return false;
  len = sizeof a;
  return ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && local.is(a, len);
}

}  // namespace

PeerSocket PeerSocket::find(const std::string& remote_addr, int remote_port,
                            const std::string& local_addr, int local_port) {
  PeerSocket s;
  if (remote_port < 0 || local_port < 0) return s;
  const Endpoint remote(remote_addr, remote_port), local(local_addr, local_port);
  // httplib serves a connection on one thread from accept to close, request after request: the
  // descriptor this thread found last is the one to try first (keep-alive clients send all
  // their requests on one connection).
  thread_local int last_fd = -1;
  if (last_fd >= 0 && connects(last_fd, remote, local)) {
    s.fd_ = last_fd;
    return s;
  }
  // Otherwise every descriptor of the process (hundreds: one per open connection) is tried,
  // the peer's port first, which rules out all but one connection.
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return s;
  const int own = ::dirfd(dir);
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    if (connects(static_cast<int>(fd), remote, local)) {
      s.fd_ = last_fd = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return s;
}

bool PeerSocket::closed() const {
  if (fd_ < 0) return false;
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;  // bytes waiting (a pipelined request): still there
  if (n == 0) return true;  // EOF
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace flashserve::server
