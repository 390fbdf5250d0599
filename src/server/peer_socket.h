// The socket of the connection a request came on, to tell whether its client has hung up.
// httplib 0.11 hands a handler neither the socket nor an is_connection_closed(), and a
// non-streamed response writes nothing until its end: without this, a client that hangs up on a
// non-streamed request goes unnoticed while its request runs to max_tokens.
#pragma once

#include <string>

namespace flashserve::server {

class PeerSocket {
 public:
  // The descriptor among this process's sockets whose peer and local addresses are these (as
  // httplib writes them: numeric host, port); none found: closed() is always false.
  static PeerSocket find(const std::string& remote_addr, int remote_port,
                         const std::string& local_addr, int local_port);
  // Whether the client has closed its end (EOF, or an error, on a peek that does not wait). A
  // client that half-closes (shutdown(SHUT_WR)) while it waits for the answer reads as gone, as
  // in servers that abort on EOF.
  bool closed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace flashserve::server
