// Subcommands of the flashserve CLI register themselves here, one file each (demo.cc, simulate.cc,
// ...), so main.cc stays a table lookup.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace flashserve::cli {

struct Command {
  std::string name;
  std::string help;
  std::function<int(int argc, char** argv)> run;  // argv[0] is the subcommand's name
};

std::vector<Command>& commands();

struct Register {
  Register(std::string name, std::string help, std::function<int(int, char**)> run) {
    commands().push_back({std::move(name), std::move(help), std::move(run)});
  }
};

}  // namespace flashserve::cli
