// flashserve: parses the subcommand and hands the rest of the arguments to it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "cli/command.h"
#include "flashserve/error.h"

namespace flashserve::cli {
std::vector<Command>& commands() {
  static std::vector<Command> table;
  return table;
}
}  // namespace flashserve::cli

namespace {
void usage() {
  std::printf("usage: flashserve <command> [options]\n\ncommands:\n");
  auto table = flashserve::cli::commands();
  std::sort(table.begin(), table.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (const auto& c : table) std::printf("  %-12s %s\n", c.name.c_str(), c.help.c_str());
  std::printf("\n'flashserve <command> --help' shows a command's options.\n");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : flashserve::cli::commands()) {
    if (c.name != argv[1]) continue;
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "flashserve %s: error: %s\n", argv[1], e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "flashserve: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
