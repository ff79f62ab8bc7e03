// etmetal_runner's command line: what it was asked to do, parsed from argv.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runner_io.h"

namespace etmetal_runner {

struct Options {
  std::string program;
  std::vector<std::string> data_files;
  std::vector<std::string> backend_libs;
  std::string libtorch_cpu;
  std::string proxy_lib;
  std::string method = "forward";
  std::vector<std::string> inputs;
  std::optional<etmetal_runner::Generator> generator;
  int iterations = 1;
  std::string output_dir;
  std::string etdump;
  std::string dump_maps;
  bool mmap = false;
  bool list_operators = false;
  bool list_backends = false;
  bool describe = false;
};


// Prints "etmetal_runner: <message>" to stderr and returns `code`.
int fail(int code, const std::string& message);

// Parses argv into `o`; returns kOk or kUsage (with the reason printed).
int parse(int argc, char** argv, Options* o);

} // namespace etmetal_runner
