// flashserve: parses the subcommand and hands the rest of the arguments to it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "cli/command.h"
#include "cli/options.h"
#include "cli/serving_report.h"
#include "flashserve/error.h"
#include "flashserve/version.h"

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
  std::printf(
      "\n'flashserve <command> --help' shows a command's options, 'flashserve --version' the "
      "version,\n'flashserve --data-dir' the data folder (workload traces) it reads.\n");
}
}  // namespace

int main(int argc, char** argv) {
  using flashserve::cli::kUsageExit;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? kUsageExit : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    // project(VERSION) of the top-level CMakeLists.txt, the same string as fs_version().
    std::printf("flashserve %s\n", FLASHSERVE_VERSION);
    return 0;
  }
  if (!std::strcmp(argv[1], "--data-dir")) {
    // The data folder the workloads are read from (serving_report.h's data_dir): how to check an
    // installed or moved tree finds its own.
    try {
      std::printf("%s\n", flashserve::cli::data_dir().c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "flashserve: error: %s\n", e.what());
      return 1;
    }
  }
  for (const auto& c : flashserve::cli::commands()) {
    if (c.name != argv[1]) continue;
    // Usage errors (an option refused, an argument the library finds malformed) leave with one
    // status, kUsageExit; anything that fails while running leaves with 1.
    auto fail = [&](const char* what, int status) {
      std::fprintf(stderr, "flashserve %s: error: %s\n", argv[1], what);
      return status;
    };
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const flashserve::cli::UsageError& e) {
      return fail(e.what(), kUsageExit);
    } catch (const flashserve::Error& e) {
      return fail(e.what(), e.kind() == flashserve::ErrorKind::kInvalidArgument ? kUsageExit : 1);
    } catch (const std::bad_alloc&) {
      return fail("out of memory (a size option too large for this machine?)", 1);
    } catch (const std::exception& e) {
      return fail(e.what(), 1);
    }
  }
  std::fprintf(stderr, "flashserve: unknown command '%s'\n\n", argv[1]);
  usage();
  return kUsageExit;
}
