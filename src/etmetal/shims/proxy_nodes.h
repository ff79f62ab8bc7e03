// The native proxy executor's calls, as proxy_parse.cpp reads them from a table and
// proxy_native.cpp runs them (C++ only: the parts of the library share it, nothing else).
#ifndef ETMETAL_PROXY_NODES_H
#define ETMETAL_PROXY_NODES_H

#include <ATen/ATen.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace etm_proxy_impl {

struct Fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Kind { Static, Tensor, Tensors, OptionalTensors, Int, Ints };
enum class Ret { Tensor, Tensors, None, Int };

struct Arg {
  Kind kind = Kind::Static;
  c10::IValue value;               // Static: the table's value, converted for the schema
  int64_t length = 1;              // elements taken from the flattened arrays
  std::vector<bool> present;       // OptionalTensors: which items are tensors
  bool floating = false;           // Int(s) passed to a float argument
};

struct Node {
  std::string target;
  // the operator as torch's registry has it (the one torch.ops resolves names in: the
  // dispatcher's operators and the JIT-only ones), and its callable
  std::shared_ptr<torch::jit::Operator> op;
  mutable std::optional<torch::jit::Operation> run;  // calling it is not const
  std::vector<Arg> args;  // one per schema argument, in schema order
  int64_t n_ints = 0, n_tensors = 0, n_inputs = 0;
  std::vector<std::pair<Ret, int64_t>> returns;
  std::vector<int32_t> dtypes;  // per flattened tensor (inputs, then outputs); -1: unchecked
  std::vector<std::string> names;
  std::string describe(int64_t index) const {
    return "extern node " + std::to_string(index) + " (" + target + ")";
  }
};

struct Names {
  std::set<std::string> allowed, custom;
};


Names names_of(const char* const* allowed, int64_t n_allowed, const char* const* custom,
               int64_t n_custom);
// the operator target names, if the allow-list lets a table call it; throws Fault
std::shared_ptr<torch::jit::Operator> resolve(const std::string& target, const std::string& where,
                                              const Names& names);
// every node of the table; throws Fault naming the node and field at the first fault
std::vector<Node> parse_table(const char* text, int64_t n, const Names& names);
// torch's name of a dtype code ("float32"), as the reference's messages print it
std::string dtype_name(int32_t code);

}  // namespace etm_proxy_impl

#endif  // ETMETAL_PROXY_NODES_H
