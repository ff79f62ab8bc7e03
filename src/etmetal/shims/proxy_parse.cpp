// Reading an extern-node table into calls (proxy_nodes.h; shims/proxy_native.py explains
// the design): each node's operator found in torch's registry and checked against the
// allow-list of proxy_rules.h, and each schema argument's source.
#include <cctype>
#include <cstring>
#include <regex>

#include "json_reader.h"
#include "proxy_nodes.h"
#include "proxy_rules.h"

namespace etm_proxy_impl {

using etm_json::Value;

namespace {

const size_t kMaxTableBytes = 64u << 20;

}  // namespace

Names names_of(const char* const* allowed, int64_t n_allowed, const char* const* custom,
               int64_t n_custom) {
  Names out;
  for (int64_t i = 0; allowed && i < n_allowed; i++)
    if (allowed[i]) out.allowed.insert(allowed[i]);
  for (int64_t i = 0; custom && i < n_custom; i++)
    if (custom[i]) out.custom.insert(custom[i]);
  return out;
}

static bool in(const char* const* items, size_t n, const std::string& s) {
  for (size_t i = 0; i < n; i++)
    if (s == items[i]) return true;
  return false;
}

static const std::regex& denied_pattern() {
  static const std::regex re(etm_rule_denied_pattern);
  return re;
}

// extern_ops.refusal, over the same generated rules: "" when the table may call the op
static std::string refusal(const std::string& ns, const std::string& name, const std::string& overload,
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

static bool identifier(const std::string& s) {
  if (s.empty() || std::isdigit((unsigned char)s[0])) return false;
  for (char c : s)
    if (!(std::isalnum((unsigned char)c) || c == '_')) return false;
  return s.compare(0, 2, "__") != 0;  // no dunders: Python looks names up as attributes
}

static std::string quoted(const std::string& s) { return "'" + s + "'"; }

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

static const Value& field(const Value& v, const char* key, Value::Kind kind, const std::string& where) {
  if (v.kind != Value::Object) throw Fault(where + ": not an object");
  const Value* f = v.get(key);
  if (!f) throw Fault(where + ": no field '" + key + "'");
  if (f->kind != kind)
    throw Fault(where + ": field '" + key + "' is " + etm_json::kind_name(f->kind) + ", not " +
                etm_json::kind_name(kind));
  return *f;
}

// the single (key, value) of a serialized argument
static const std::pair<std::string, Value>& single(const Value& v, const std::string& where) {
  if (v.kind != Value::Object || v.fields.size() != 1)
    throw Fault(where + ": not an object with exactly one kind");
  return v.fields[0];
}

static bool floating_type(const c10::TypePtr& t) {
  c10::TypePtr base = t;
  if (auto o = t->cast<c10::OptionalType>()) base = o->getElementType();
  if (auto l = base->cast<c10::ListType>()) base = l->getElementType();
  return base->kind() == c10::TypeKind::FloatType;
}

static double number(const Value& v, const std::string& where) {
  if (v.kind != Value::Number) throw Fault(where + ": " + etm_json::kind_name(v.kind) + " is not a number");
  return v.is_int() ? (double)v.integer : v.number;
}

static c10::Layout layout_named(const std::string& n) {
  if (n == "Strided") return c10::kStrided;
  if (n == "Sparse") return c10::kSparse;
  if (n == "SparseCsr") return c10::kSparseCsr;
  if (n == "SparseCsc") return c10::kSparseCsc;
  if (n == "SparseBsr") return c10::kSparseBsr;
  if (n == "SparseBsc") return c10::kSparseBsc;
  return c10::kMkldnn;
}

static c10::MemoryFormat memory_format_named(const std::string& n) {
  if (n == "Contiguous") return c10::MemoryFormat::Contiguous;
  if (n == "ChannelsLast") return c10::MemoryFormat::ChannelsLast;
  if (n == "ChannelsLast3d") return c10::MemoryFormat::ChannelsLast3d;
  return c10::MemoryFormat::Preserve;
}

static int64_t serialized_int(const Value& v, const std::string& where) {
  if (!v.is_int()) throw Fault(where + ": " + etm_json::kind_name(v.kind) + " is not an integer code");
  return v.integer;
}

// a value the table holds (proxy_executor._static), converted for the schema argument
static c10::IValue static_value(const std::string& key, const Value& v, const c10::Argument& a,
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
static void tensor_names(const std::string& key, const Value& v, const std::string& where,
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

static int32_t dtype_code(const Value& v, const std::string& where) {
  if (v.kind == Value::String)
    for (const auto& row : etm_dtype_names)
      if (v.s == row.name) return row.code;
  throw Fault(where + ": " + (v.kind == Value::String ? quoted(v.s) : std::string(etm_json::kind_name(v.kind))) +
              " is not a torch dtype");
}

static Node parse_node(int64_t index, const Value& entry, const Names& names) {
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

std::string dtype_name(int32_t code) {
  for (const auto& row : etm_dtype_canonical)
    if (row.code == code) return std::string("torch.") + row.name;
  return "dtype code " + std::to_string(code);
}

}  // namespace etm_proxy_impl
