// The native proxy executor (proxy_native.h; shims/proxy_native.py explains the design).
// Parse: each node of the table becomes a Node: its operator (a dispatcher handle found
// by name, checked against the allow-list of proxy_rules.h) and, per schema argument,
// where its value comes from (the table, the flattened ints or tensors, its default).
// Call: the tensors become ATen tensors over the caller's memory (no copy), the operator
// runs boxed through the dispatcher, and each result is handed to the caller's output
// handle as a storage libtorch owns, as shims/proxy_executor.py does in Python.
#include "proxy_native.h"

#include <ATen/ATen.h>
#include <ATen/core/stack.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <cctype>
#include <cstring>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "proxy_json.h"
#include "proxy_rules.h"

using etm_json::Value;

extern "C" {
ETM_EXPORT uint64_t etm_proxy_calls = 0;
}

namespace {

thread_local std::string last_error;

const size_t kMaxTableBytes = 64u << 20;

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
               int64_t n_custom) {
  Names out;
  for (int64_t i = 0; allowed && i < n_allowed; i++)
    if (allowed[i]) out.allowed.insert(allowed[i]);
  for (int64_t i = 0; custom && i < n_custom; i++)
    if (custom[i]) out.custom.insert(custom[i]);
  return out;
}

bool in(const char* const* items, size_t n, const std::string& s) {
  for (size_t i = 0; i < n; i++)
    if (s == items[i]) return true;
  return false;
}

const std::regex& denied_pattern() {
  static const std::regex re(etm_rule_denied_pattern);
  return re;
}

// extern_ops.refusal, over the same generated rules: "" when the table may call the op
std::string refusal(const std::string& ns, const std::string& name, const std::string& overload,
                    const c10::FunctionSchema& schema, const Names& names) {
  std::string qualname = ns + "::" + name;
  std::string full = overload.empty() || overload == "default" ? qualname : qualname + "." + overload;
  if (names.allowed.count(qualname) || names.allowed.count(full)) return "";
  if (ns == "aten") {
    if (in(etm_rule_denied_aten, etm_rule_denied_aten_count, name) ||
        std::regex_search(name, denied_pattern(), std::regex_constants::match_continuous))
      return etm_reason_denied;
    bool writes = false;
    for (const auto& a : schema.arguments()) {
      if (a.type()->annotation_str().find("Storage") != std::string::npos) return etm_reason_storage;
      if (a.alias_info() && a.alias_info()->isWrite()) writes = true;
    }
    if (schema.returns().empty() && !writes) return etm_reason_side_effect;
    return "";
  }
  if (in(etm_rule_torch_namespaces, etm_rule_torch_namespaces_count, ns)) {
    std::string r = etm_reason_torch_namespace;
    size_t at = r.find("{namespace}");
    if (at != std::string::npos) r.replace(at, std::strlen("{namespace}"), ns);
    return r;
  }
  if (!names.custom.count(qualname)) return etm_reason_not_defined;
  return "";
}

bool identifier(const std::string& s) {
  if (s.empty() || std::isdigit((unsigned char)s[0])) return false;
  for (char c : s)
    if (!(std::isalnum((unsigned char)c) || c == '_')) return false;
  return s.compare(0, 2, "__") != 0;  // no dunders: Python looks names up as attributes
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// the operator target names, if the allow-list lets a table call it; throws Fault
std::shared_ptr<torch::jit::Operator> resolve(const std::string& target, const std::string& where, const Names& names) {
  size_t sep = target.find("::");
  std::string ns = sep == std::string::npos ? "" : target.substr(0, sep);
  std::string rest = sep == std::string::npos ? "" : target.substr(sep + 2);
  size_t dot = rest.find('.');
  std::string name = rest.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : rest.substr(dot + 1);
  bool ok = sep != std::string::npos && identifier(ns) && identifier(name) &&
            (dot == std::string::npos || identifier(overload));
  if (!ok)
    throw Fault(where + ": target " + quoted(target) +
                " is not 'namespace::name[.overload]' of identifiers");
  // the registry torch._C._get_schema reads: nothing is interned for a malformed name
  std::shared_ptr<torch::jit::Operator> op;
  for (const auto& cand : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(ns + "::" + name)))
    if (cand->schema().overload_name() == overload) op = cand;
  if (!op)
    throw Fault(where + ": operator " + target + " is not registered in this process; import the "
                "module that defines it (torch.library) before loading the model");
  std::string why = refusal(ns, name, overload, op->schema(), names);
  if (!why.empty())
    throw Fault(where + ": operator " + target + " is not on the proxy executor's allow-list: " + why);
  if (!op->hasOperation()) throw Fault(where + ": operator " + target + " has no callable overload");
  return op;
}

const Value& field(const Value& v, const char* key, Value::Kind kind, const std::string& where) {
  if (v.kind != Value::Object) throw Fault(where + ": not an object");
  const Value* f = v.get(key);
  if (!f) throw Fault(where + ": no field '" + key + "'");
  if (f->kind != kind)
    throw Fault(where + ": field '" + key + "' is " + etm_json::kind_name(f->kind) + ", not " +
                etm_json::kind_name(kind));
  return *f;
}

// the single (key, value) of a serialized argument
const std::pair<std::string, Value>& single(const Value& v, const std::string& where) {
  if (v.kind != Value::Object || v.fields.size() != 1)
    throw Fault(where + ": not an object with exactly one kind");
  return v.fields[0];
}

bool floating_type(const c10::TypePtr& t) {
  c10::TypePtr base = t;
  if (auto o = t->cast<c10::OptionalType>()) base = o->getElementType();
  if (auto l = base->cast<c10::ListType>()) base = l->getElementType();
  return base->kind() == c10::TypeKind::FloatType;
}

double number(const Value& v, const std::string& where) {
  if (v.kind != Value::Number) throw Fault(where + ": " + etm_json::kind_name(v.kind) + " is not a number");
  return v.is_int() ? (double)v.integer : v.number;
}

c10::Layout layout_named(const std::string& n) {
  if (n == "Strided") return c10::kStrided;
  if (n == "Sparse") return c10::kSparse;
  if (n == "SparseCsr") return c10::kSparseCsr;
  if (n == "SparseCsc") return c10::kSparseCsc;
  if (n == "SparseBsr") return c10::kSparseBsr;
  if (n == "SparseBsc") return c10::kSparseBsc;
  return c10::kMkldnn;
}

c10::MemoryFormat memory_format_named(const std::string& n) {
  if (n == "Contiguous") return c10::MemoryFormat::Contiguous;
  if (n == "ChannelsLast") return c10::MemoryFormat::ChannelsLast;
  if (n == "ChannelsLast3d") return c10::MemoryFormat::ChannelsLast3d;
  return c10::MemoryFormat::Preserve;
}

int64_t serialized_int(const Value& v, const std::string& where) {
  if (!v.is_int()) throw Fault(where + ": " + etm_json::kind_name(v.kind) + " is not an integer code");
  return v.integer;
}

// a value the table holds (proxy_executor._static), converted for the schema argument
c10::IValue static_value(const std::string& key, const Value& v, const c10::Argument& a,
                         const std::string& where) {
  if (key == "as_none") return c10::IValue();
  if (key == "as_float") return c10::IValue(number(v, where));
  if (key == "as_bool") {
    if (v.kind != Value::Bool) throw Fault(where + ": as_bool holds " + etm_json::kind_name(v.kind));
    return c10::IValue(v.b);
  }
  if (key == "as_string") {
    if (v.kind != Value::String) throw Fault(where + ": as_string holds " + etm_json::kind_name(v.kind));
    return c10::IValue(v.s);
  }
  if (key == "as_floats" || key == "as_bools" || key == "as_strings") {
    if (v.kind != Value::Array) throw Fault(where + ": " + key + " holds " + etm_json::kind_name(v.kind));
    if (key == "as_floats") {
      std::vector<double> out;
      for (const auto& x : v.items) out.push_back(number(x, where));
      return c10::IValue(out);
    }
    if (key == "as_bools") {
      c10::List<bool> out;
      for (const auto& x : v.items) {
        if (x.kind != Value::Bool) throw Fault(where + ": as_bools holds " + etm_json::kind_name(x.kind));
        out.push_back(x.b);
      }
      return c10::IValue(out);
    }
    c10::List<std::string> out;
    for (const auto& x : v.items) {
      if (x.kind != Value::String) throw Fault(where + ": as_strings holds " + etm_json::kind_name(x.kind));
      out.push_back(x.s);
    }
    return c10::IValue(out);
  }
  if (key == "as_scalar_type") {
    int64_t code = serialized_int(v, where);
    for (const auto& row : etm_serde_dtypes)
      if (row.serialized == code) return c10::IValue(static_cast<c10::ScalarType>(row.code));
    throw Fault(where + ": " + std::to_string(code) + " is not a serialized dtype");
  }
  if (key == "as_layout") {
    int64_t code = serialized_int(v, where);
    for (const auto& row : etm_serde_layouts)
      if (row.serialized == code) return c10::IValue(layout_named(row.name));
    throw Fault(where + ": " + std::to_string(code) + " is not a serialized layout");
  }
  if (key == "as_memory_format") {
    int64_t code = serialized_int(v, where);
    for (const auto& row : etm_serde_memory_formats)
      if (row.serialized == code) return c10::IValue(memory_format_named(row.name));
    throw Fault(where + ": " + std::to_string(code) + " is not a serialized memory format");
  }
  // the operator runs on ATen's CPU kernels over the caller's memory, whatever the graph named
  if (key == "as_device") return c10::IValue(c10::Device(c10::kCPU));
  (void)a;
  throw Fault(where + ": argument kind '" + key + "' is not supported by the proxy executor");
}

// the tensor names a serialized tensor argument passes (proxy_executor._names)
void tensor_names(const std::string& key, const Value& v, const std::string& where,
                  std::vector<std::string>* out, std::vector<bool>* present) {
  auto name_of = [&](const Value& t) -> const std::string& {
    return field(t, "name", Value::String, where).s;
  };
  if (key == "as_tensor") {
    out->push_back(name_of(v));
    return;
  }
  if (v.kind != Value::Array) throw Fault(where + ": " + key + " holds " + etm_json::kind_name(v.kind));
  for (const auto& item : v.items) {
    if (key == "as_tensors") {
      out->push_back(name_of(item));
      continue;
    }
    if (item.kind != Value::Object) throw Fault(where + ": an as_optional_tensors item is not an object");
    const Value* t = item.get("as_tensor");
    if (t) out->push_back(name_of(*t));
    present->push_back(t != nullptr);
  }
}

int32_t dtype_code(const Value& v, const std::string& where) {
  if (v.kind == Value::String)
    for (const auto& row : etm_dtype_names)
      if (v.s == row.name) return row.code;
  throw Fault(where + ": " + (v.kind == Value::String ? quoted(v.s) : std::string(etm_json::kind_name(v.kind))) +
              " is not a torch dtype");
}

Node parse_node(int64_t index, const Value& entry, const Names& names) {
  std::string where = "extern node " + std::to_string(index);
  if (entry.kind != Value::Object || !entry.get("node") || entry.get("node")->kind != Value::Object)
    throw Fault(where + ": not a serialized extern kernel node");
  const Value& node = *entry.get("node");
  const Value* target = node.get("target");
  if (!target || !node.get("inputs") || !node.get("outputs"))
    throw Fault(where + ": not a serialized extern kernel node");
  if (target->kind != Value::String)
    throw Fault(where + ": target is " + std::string(etm_json::kind_name(target->kind)) + ", not a string");
  Node n;
  n.target = target->s;
  where += " (" + n.target + ")";
  n.op = resolve(n.target, where, names);
  n.run = n.op->getOperation();
  const c10::FunctionSchema& schema = n.op->schema();
  const auto& params = schema.arguments();
  const Value& inputs = field(node, "inputs", Value::Array, where);
  const Value& outputs = field(node, "outputs", Value::Array, where);
  // the arguments the table names, by schema position
  std::vector<std::optional<Arg>> given(params.size());
  for (size_t i = 0; i < inputs.items.size(); i++) {
    std::string at = where + " input " + std::to_string(i);
    const Value& item = inputs.items[i];
    const Value* name = item.kind == Value::Object ? item.get("name") : nullptr;
    const Value* arg = item.kind == Value::Object ? item.get("arg") : nullptr;
    size_t pos = params.size();
    for (size_t p = 0; name && name->kind == Value::String && p < params.size(); p++)
      if (params[p].name() == name->s) pos = p;
    if (pos == params.size() || !arg || arg->kind != Value::Object || arg->fields.size() != 1)
      throw Fault(at + ": " + (name && name->kind == Value::String ? quoted(name->s) : "its name") +
                  " does not match the schema " + c10::toString(schema));
    at += " (" + name->s + ")";
    const auto& kv = single(*arg, at);
    Arg a;
    if (kv.first == "as_tensor" || kv.first == "as_tensors" || kv.first == "as_optional_tensors") {
      std::vector<std::string> found;
      tensor_names(kv.first, kv.second, at, &found, &a.present);
      a.kind = kv.first == "as_tensor" ? Kind::Tensor
               : kv.first == "as_tensors" ? Kind::Tensors : Kind::OptionalTensors;
      a.length = (int64_t)found.size();
      n.names.insert(n.names.end(), found.begin(), found.end());
    } else if (kv.first == "as_int" || kv.first == "as_sym_int") {
      a.kind = Kind::Int;
      a.floating = floating_type(params[pos].type());
      n.n_ints += 1;
    } else if (kv.first == "as_ints" || kv.first == "as_sym_ints") {
      if (kv.second.kind != Value::Array)
        throw Fault(at + ": " + kv.first + " holds " + etm_json::kind_name(kv.second.kind));
      a.kind = Kind::Ints;
      a.length = (int64_t)kv.second.items.size();
      a.floating = floating_type(params[pos].type());
      n.n_ints += a.length;
    } else {
      a.value = static_value(kv.first, kv.second, params[pos], at);
      if (a.value.isDouble() && !floating_type(params[pos].type()) &&
          params[pos].type()->kind() == c10::TypeKind::IntType)
        throw Fault(at + ": a float for the integer argument " + params[pos].name());
    }
    given[pos] = std::move(a);
  }
  for (size_t p = 0; p < params.size(); p++) {
    if (given[p]) {
      n.args.push_back(std::move(*given[p]));
      continue;
    }
    if (!params[p].default_value())
      throw Fault(where + ": the table gives no value for argument '" + params[p].name() +
                  "', which has no default in the schema " + c10::toString(schema));
    Arg a;
    a.value = *params[p].default_value();
    n.args.push_back(std::move(a));
  }
  n.n_inputs = (int64_t)n.names.size();
  if (outputs.items.size() != schema.returns().size())
    throw Fault(where + ": " + std::to_string(outputs.items.size()) + " serialized outputs, the schema " +
                c10::toString(schema) + " returns " + std::to_string(schema.returns().size()));
  for (size_t i = 0; i < outputs.items.size(); i++) {
    std::string at = where + " output " + std::to_string(i);
    const std::pair<std::string, Value>* kv = &single(outputs.items[i], at);
    if (kv->first == "as_optional_tensor") kv = &single(kv->second, at);
    std::vector<bool> unused;
    if (kv->first == "as_tensor" || kv->first == "as_tensors") {
      size_t before = n.names.size();
      tensor_names(kv->first, kv->second, at, &n.names, &unused);
      n.returns.push_back({kv->first == "as_tensor" ? Ret::Tensor : Ret::Tensors,
                           (int64_t)(n.names.size() - before)});
    } else if (kv->first == "as_none") {
      n.returns.push_back({Ret::None, 0});
    } else if (kv->first == "as_int") {
      n.n_ints += 1;
      n.returns.push_back({Ret::Int, 1});
    } else {
      throw Fault(at + ": output kind '" + kv->first + "' is not supported");
    }
  }
  n.n_tensors = (int64_t)n.names.size();
  // the dtypes etmetal's compile recorded (a JSON object inside a string field)
  Value dtypes;
  const Value* metadata = node.get("metadata");
  if (metadata && metadata->kind != Value::Null) {
    if (metadata->kind != Value::Object) throw Fault(where + ": metadata is not an object");
    const Value* text = metadata->get(etm_dtypes_metadata_key);
    if (text) {
      std::string at = where + " metadata " + etm_dtypes_metadata_key;
      if (text->kind != Value::String) throw Fault(at + ": not a string");
      std::string error;
      if (!etm_json::parse(text->s.data(), text->s.size(), &dtypes, &error, 4))
        throw Fault(at + ": not JSON: " + error);
      if (dtypes.kind != Value::Object) throw Fault(at + ": not an object");
    }
  }
  for (const auto& name : n.names) {
    const Value* d = dtypes.kind == Value::Object ? dtypes.get(name.c_str()) : nullptr;
    n.dtypes.push_back(d ? dtype_code(*d, where + " tensor " + quoted(name)) : -1);
  }
  return n;
}

std::vector<Node> parse_table(const char* text, int64_t n, const Names& names) {
  if (!text || n < 0 || (size_t)n > kMaxTableBytes)
    throw Fault("the extern-node table is missing or larger than " + std::to_string(kMaxTableBytes) + " bytes");
  Value doc;
  std::string error;
  if (!etm_json::parse(text, (size_t)n, &doc, &error))
    throw Fault("the extern-node table is not valid JSON with 'nodes': " + error);
  const Value* nodes = doc.kind == Value::Object ? doc.get("nodes") : nullptr;
  if (!nodes) throw Fault("the extern-node table is not valid JSON with 'nodes': no 'nodes' object field");
  if (nodes->kind != Value::Array) throw Fault("the extern-node table's 'nodes' is not a list");
  std::vector<Node> out;
  for (size_t i = 0; i < nodes->items.size(); i++) {
    try {
      out.push_back(parse_node((int64_t)i, nodes->items[i], names));
    } catch (const Fault&) {
      throw;
    } catch (const std::exception& e) {  // c10 refused a value while it was converted
      throw Fault("extern node " + std::to_string(i) + ": malformed entry (" + e.what() + ")");
    }
  }
  return out;
}

void write(const std::string& s, char* out, int64_t len) {
  if (!out || len <= 0) return;
  size_t n = std::min(s.size(), (size_t)len - 1);
  std::memcpy(out, s.data(), n);
  out[n] = '\0';
}

const char* dtype_name(int32_t code) {
  for (const auto& row : etm_dtype_names)  // torch's canonical names come first in sorted order
    if (row.code == code) return row.name;
  return "?";
}

at::Tensor lend_tensor(const etm_rec& r) {
  return at::from_blob((void*)(intptr_t)r.data_ptr, c10::IntArrayRef(r.sizes, (size_t)r.dim),
                       c10::IntArrayRef(r.strides, (size_t)r.dim),
                       at::TensorOptions().dtype(static_cast<c10::ScalarType>(r.dtype)));
}

int32_t call(etm_proxy* p, const etm_proxy_host* host, int64_t index, int64_t num_ints,
             const int64_t* ints, int64_t num_tensors, void* const* tensors);

}  // namespace

struct etm_proxy {
  std::vector<Node> nodes;
};

namespace {

void check_dtype(const Node& n, int64_t index, size_t i, int32_t got, bool produced) {
  int32_t expected = i < n.dtypes.size() ? n.dtypes[i] : -1;
  if (expected < 0 || got == expected) return;
  throw Fault(n.describe(index) + ": tensor " + std::to_string(i) + " (" + n.names[i] + ") " +
              (produced ? "produced" : "was passed") + " with dtype " + dtype_name(got) +
              ", the compiled model expects " + dtype_name(expected));
}

int32_t call(etm_proxy* p, const etm_proxy_host* host, int64_t index, int64_t num_ints,
             const int64_t* ints, int64_t num_tensors, void* const* tensors) {
  if (!p || !host || index < 0 || index >= (int64_t)p->nodes.size() || num_ints < 0 ||
      num_tensors < 0 || (num_ints && !ints) || (num_tensors && !tensors))
    return 0;  // the reference words each of these (index range, NULL arrays)
  const Node& n = p->nodes[(size_t)index];
  if (num_ints != n.n_ints || num_tensors != n.n_tensors) return 0;
  std::vector<etm_rec> recs((size_t)num_tensors);
  for (int64_t i = 0; i < num_tensors; i++) {
    if (!tensors[i] || !host->lend(tensors[i], &recs[(size_t)i])) return 0;
    if (i >= n.n_inputs && !host->placeholder(tensors[i])) return 0;
  }
  // everything is the host's to serve: from here on a failure is this call's error
  for (int64_t i = 0; i < n.n_inputs; i++) check_dtype(n, index, (size_t)i, recs[(size_t)i].dtype, false);
  std::vector<at::Tensor> inputs;
  for (int64_t i = 0; i < n.n_inputs; i++) inputs.push_back(lend_tensor(recs[(size_t)i]));
  torch::jit::Stack stack;
  size_t ti = 0, ii = 0;
  for (const Arg& a : n.args) {
    switch (a.kind) {
      case Kind::Static: stack.push_back(a.value); break;
      case Kind::Tensor: stack.emplace_back(inputs[ti++]); break;
      case Kind::Tensors: {
        c10::List<at::Tensor> list;
        for (int64_t k = 0; k < a.length; k++) list.push_back(inputs[ti++]);
        stack.emplace_back(list);
        break;
      }
      case Kind::OptionalTensors: {
        c10::List<std::optional<at::Tensor>> list;
        for (bool present : a.present) list.push_back(present ? std::optional<at::Tensor>(inputs[ti++]) : std::nullopt);
        stack.emplace_back(list);
        break;
      }
      case Kind::Int:
        if (a.floating) stack.emplace_back((double)ints[ii]);
        else stack.emplace_back(ints[ii]);
        ii++;
        break;
      case Kind::Ints: {
        if (a.floating) {
          std::vector<double> v(ints + ii, ints + ii + a.length);
          stack.emplace_back(v);
        } else {
          std::vector<int64_t> v(ints + ii, ints + ii + a.length);
          stack.emplace_back(v);
        }
        ii += (size_t)a.length;
        break;
      }
    }
  }
  {
    at::NoGradGuard no_grad;
    (*n.run)(stack);
  }
  std::vector<at::Tensor> results;
  for (size_t r = 0; r < n.returns.size() && r < stack.size(); r++) {
    Ret kind = n.returns[r].first;
    const c10::IValue& v = stack[r];
    if (kind == Ret::Tensor && n.returns[r].second) {
      if (!v.isTensor()) throw Fault(n.describe(index) + " returned " + v.tagKind() + ", not a tensor");
      results.push_back(v.toTensor());
    } else if (kind == Ret::Tensors) {
      if (!v.isTensorList()) throw Fault(n.describe(index) + " returned " + v.tagKind() + ", not tensors");
      for (const at::Tensor& t : v.toTensorVector()) results.push_back(t);
    }
  }
  int64_t n_out = num_tensors - n.n_inputs;
  if ((int64_t)results.size() != n_out)
    throw Fault(n.describe(index) + " returned " + std::to_string(results.size()) + " tensor(s) for " +
                std::to_string(n_out) + " output handle(s)");
  for (int64_t i = 0; i < n_out; i++) {
    at::Tensor r = results[(size_t)i];
    size_t flat = (size_t)(n.n_inputs + i);
    check_dtype(n, index, flat, (int32_t)r.scalar_type(), true);
    const etm_rec& current = recs[flat];
    bool same = (intptr_t)r.data_ptr() == current.data_ptr && (int32_t)r.scalar_type() == current.dtype &&
                r.dim() == current.dim &&
                std::equal(r.sizes().begin(), r.sizes().end(), current.sizes) &&
                std::equal(r.strides().begin(), r.strides().end(), current.strides);
    if (same) continue;  // an in-place op returned the very tensor the handle names
    bool aliases = false;  // an output in an argument's memory gets its own (as the reference)
    for (const at::Tensor& t : inputs) aliases = aliases || r.storage().is_alias_of(t.storage());
    if (aliases || !r.storage().data()) r = r.clone();
    if (!r.is_cpu()) throw Fault(n.describe(index) + " output " + std::to_string(i) + " is not on the cpu");
    at::Tensor* owner = new at::Tensor(r);
    const c10::Storage& st = r.storage();
    char* data = (char*)const_cast<void*>(st.data());
    if (!host->rebind(tensors[flat], owner, data, (int64_t)st.nbytes(), r.dim(), r.sizes().data(),
                      r.strides().data(), r.storage_offset(), (int32_t)r.scalar_type())) {
      delete owner;
      throw Fault(n.describe(index) + " output " + std::to_string(i) + ": the handle could not take the result");
    }
  }
  __atomic_fetch_add(&etm_proxy_calls, 1, __ATOMIC_RELAXED);
  return 1;
}

}  // namespace

extern "C" {

etm_proxy* etm_proxy_parse(const char* json, int64_t n, const char* const* allowed, int64_t n_allowed,
                           const char* const* custom, int64_t n_custom, char* error, int64_t error_len) {
  try {
    Names names = names_of(allowed, n_allowed, custom, n_custom);
    auto* p = new etm_proxy();
    try {
      p->nodes = parse_table(json, n, names);
    } catch (...) {
      delete p;
      throw;
    }
    return p;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "the extern-node table could not be parsed";
  }
  write(last_error, error, error_len);
  return nullptr;
}

void etm_proxy_free(etm_proxy* p) { delete p; }

int64_t etm_proxy_node_count(const etm_proxy* p) { return p ? (int64_t)p->nodes.size() : 0; }

int64_t etm_proxy_refusal(const char* target, const char* const* allowed, int64_t n_allowed,
                          const char* const* custom, int64_t n_custom, char* out, int64_t out_len) {
  std::string why;
  try {
    resolve(target ? target : "", "extern node 0 (" + std::string(target ? target : "") + ")",
            names_of(allowed, n_allowed, custom, n_custom));
  } catch (const std::exception& e) {
    why = e.what();
  }
  write(why, out, out_len);
  return (int64_t)why.size();
}

int32_t etm_proxy_call(etm_proxy* p, const etm_proxy_host* host, int64_t index, int64_t num_ints,
                       const int64_t* ints, int64_t num_tensors, void* const* tensors) {
  try {
    return call(p, host, index, num_ints, ints, num_tensors, tensors);
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "extern node " + std::to_string(index) + ": the operator failed";
  }
  return -1;
}

const char* etm_proxy_last_error(void) { return last_error.c_str(); }

}  // extern "C"
