#include "server/peer_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace flashserve::server {

namespace {

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// Host and port as httplib writes them (getnameinfo, numeric); the port first, which is cheap
// and rules out all but one connection.
bool address_is(const sockaddr_storage& a, socklen_t len, const std::string& host, int port) {
  if (port_of(a) != port) return false;
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  return host == h && port == std::atoi(p);
}

}  // namespace

PeerSocket PeerSocket::find(const std::string& remote_addr, int remote_port,
                            const std::string& local_addr, int local_port) {
  PeerSocket s;
  if (remote_port < 0 || local_port < 0) return s;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (name.empty() || *end != '\0') continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof peer, local_len = sizeof local;
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        ::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0)
      continue;
    if (address_is(peer, peer_len, remote_addr, remote_port) &&
        address_is(local, local_len, local_addr, local_port)) {
      s.fd_ = static_cast<int>(fd);
      break;
    }
  }
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
