// Files in and out of etmetal_runner: raw tensor bytes, generated inputs, the JSON manifest.
// Kept apart from runner.cpp so the program/method flow there reads top to bottom.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/executor/method_meta.h>

namespace etmetal_runner {

// The process exit codes; etmetal.stock_runtime.runner names the same numbers.
enum ExitCode : int {
  kOk = 0,
  kUsage = 2,
  kMissingFile = 3,
  kProgramLoad = 4,
  kNoSuchMethod = 5,
  kMethodLoad = 6,
  kBadInput = 7,
  kExecute = 8,
  kWriteFailed = 9,
  kBackendLib = 10,
};

// How --generate-inputs fills a tensor: all ones, or a reproducible pattern from a seed.
struct Generator {
  bool ones = true;
  uint64_t seed = 0;
};

bool read_file(const std::string& path, std::vector<uint8_t>* out, std::string* error);

// Writes next to `path` first and renames, so no reader ever sees half a file.
bool write_file_atomically(
    const std::string& path,
    const void* data,
    size_t size,
    std::string* error);

// Fills `size` bytes of elements of `dtype`; false if the dtype is not one it can generate.
bool generate(
    executorch::aten::ScalarType dtype,
    uint8_t* data,
    size_t size,
    Generator* generator,
    uint64_t tensor_index);

std::string json_escape(const std::string& text);

// One manifest entry: a tensor written to `file`, or a scalar written inline.
std::string describe_evalue(
    const executorch::runtime::EValue& value,
    const std::string& file);

// The method's inputs as the program declares them (JSON), for a caller that must lay out
// input files: dtype, sizes, dim order and byte count of each tensor input.
std::string describe_inputs(const executorch::runtime::MethodMeta& meta);

} // namespace etmetal_runner
