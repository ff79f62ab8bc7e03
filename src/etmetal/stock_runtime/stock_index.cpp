// The processed bytes of a Metal delegate and its weights index, read in C
// (formats: common/delegate_blobs.py, common/weights_index.py). Neither the executorch
// wheel nor torch's headers ship a JSON parser, so the index is read by etmetal's strict one
// (shims/json_reader.h), bounded in size and depth; its numbers must be integers, and every
// field is checked as weights_index.decode_index checks it.
#include <cstring>
#include <memory>
#include <set>

#include "json_reader.h"
#include "stock_backend.h"

namespace etm_stock {
namespace {

const size_t kMaxIndexBytes = 64u << 20;
const int kMaxDepth = 8;

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

using etm_json::Value;

// the index holds no numbers but integers: anything else is refused, not rounded
bool integer(const Value& v, int64_t* out, std::string* error) {
  if (v.kind != Value::Number) return false;
  if (!v.integer_text) return *error = "only integers are expected", false;
  if (!v.integral) return *error = "integer out of range", false;
  *out = v.integer;
  return true;
}

bool ints(const Value& v, std::vector<int64_t>* out) {
  if (v.kind != Value::Array) return false;
  std::string ignored;
  for (const Value& item : v.items) {
    int64_t i;
    if (!integer(item, &i, &ignored)) return false;
    out->push_back(i);
  }
  return true;
}

// Python's json keeps the last of a repeated key; the index is refused instead, so no
// reader can see another value than the one weights_index.encode_index wrote
const std::string* repeated_key(const Value& v) {
  if (v.kind == Value::Object) {
    if (const std::string* k = v.repeated_key()) return k;
    for (const auto& kv : v.fields)
      if (const std::string* k = repeated_key(kv.second)) return k;
  }
  if (v.kind == Value::Array)
    for (const Value& item : v.items)
      if (const std::string* k = repeated_key(item)) return k;
  return nullptr;
}

bool entry(size_t i, const Value& raw, IndexEntry* e, std::string* error) {
  std::string where = "weights index: constant " + std::to_string(i);
  if (raw.kind != Value::Object) return *error = where + " is not an object", false;
  for (const char* f : {"name", "fqn", "dtype", "shape", "stride", "offset", "nbytes", "key"})
    if (!raw.get(f)) return *error = where + " lacks '" + f + "'", false;
  const Value& name = *raw.get("name");
  where += name.kind == Value::String ? " ('" + name.s + "')" : "";
  std::string* strings[] = {&e->name, &e->fqn, &e->key};
  const char* string_fields[] = {"name", "fqn", "key"};
  for (int k = 0; k < 3; k++) {
    const Value& v = *raw.get(string_fields[k]);
    if (v.kind != Value::String || v.s.empty())
      return *error = where + ": " + string_fields[k] + " must be a non-empty string", false;
    *strings[k] = v.s;
  }
  int64_t* numbers[] = {&e->dtype, &e->offset, &e->nbytes};
  const char* number_fields[] = {"dtype", "offset", "nbytes"};
  for (int k = 0; k < 3; k++) {
    const Value& v = *raw.get(number_fields[k]);
    std::string why;
    if (!integer(v, numbers[k], &why) || *numbers[k] < 0)
      return *error = where + ": " + number_fields[k] + " must be an integer >= 0" +
                      (why.empty() ? "" : " (" + why + ")"),
             false;
  }
  if (!ints(*raw.get("shape"), &e->shape) || !ints(*raw.get("stride"), &e->stride) ||
      e->shape.size() != e->stride.size())
    return *error = where + ": shape and stride must be integer lists of one rank", false;
  for (size_t d = 0; d < e->shape.size(); d++)
    if (e->shape[d] < 0 || e->stride[d] < 0)
      return *error = where + ": shape and stride must be non-negative", false;
  if (!ends_with(e->key, "_weight") || key_digest(e->key).empty())
    return *error = where + ": key '" + e->key + "' is not '<sha256>_<fqn>_weight'", false;
  const char* flags[] = {"mutable", "share"};
  bool* targets[] = {&e->mutable_, &e->share};
  for (int k = 0; k < 2; k++) {
    const Value* flag = raw.get(flags[k]);
    if (!flag) continue;
    if (flag->kind != Value::Bool)
      return *error = where + ": " + flags[k] + " must be true or false", false;
    *targets[k] = flag->b;
  }
  return true;
}

}  // namespace

bool parse_keys(const void* processed, size_t n, Keys* out, std::string* error) {
  std::string text((const char*)processed, n);
  std::vector<std::string> lines;
  size_t start = 0;
  while (lines.size() < 4) {
    size_t nl = text.find('\n', start);
    lines.push_back(text.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  bool ok = (lines.size() == 2 || lines.size() == 3) && ends_with(lines[0], "_so_blob") &&
            (ends_with(lines[1], "_weights_blob") || ends_with(lines[1], "_weights_index")) &&
            (lines.size() == 2 || ends_with(lines[2], "_externs_blob"));
  for (const std::string& k : lines) ok = ok && !key_digest(k).empty();
  if (!ok) {
    std::string head = text.substr(0, 120);
    for (char& c : head)
      if ((unsigned char)c < 0x20 || (unsigned char)c > 0x7e) c = '?';
    *error = "processed bytes are not a Metal AOTI blob reference ('<sha256>_so_blob\\n"
             "<sha256>_weights_blob (or _weights_index)[\\n<sha256>_externs_blob]'): '" +
             head + "'";
    return false;
  }
  out->so = lines[0];
  out->weights = lines[1];
  out->extern_nodes = lines.size() == 3 ? lines[2] : "";
  out->shared_weights = ends_with(lines[1], "_weights_index");
  return true;
}

bool parse_index(const char* data, size_t n, std::vector<IndexEntry>* out, std::string* error) {
  if (n > kMaxIndexBytes) {
    *error = "weights index has " + std::to_string(n) + " bytes, more than the " +
             std::to_string(kMaxIndexBytes) + " an index may have";
    return false;
  }
  Value doc;
  std::string why;
  if (!etm_json::parse(data, n, &doc, &why, kMaxDepth)) {
    *error = "weights index is not JSON: " + why;
    return false;
  }
  if (const std::string* key = repeated_key(doc)) {
    *error = "weights index is not JSON that reads one way: key '" + *key + "' is written twice";
    return false;
  }
  const Value* format = doc.kind == Value::Object ? doc.get("format") : nullptr;
  if (!format || format->kind != Value::String || format->s != "etmetal-weights-index/1") {
    *error = "weights index has another format, expected 'etmetal-weights-index/1'";
    return false;
  }
  const Value* constants = doc.get("constants");
  if (!constants || constants->kind != Value::Array) {
    *error = "weights index has no 'constants' list";
    return false;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < constants->items.size(); i++) {
    IndexEntry e;
    if (!entry(i, constants->items[i], &e, error)) return false;
    if (!names.insert(e.name).second) {
      *error = "weights index names constant '" + e.name + "' twice";
      return false;
    }
    out->push_back(std::move(e));
  }
  return true;
}

}  // namespace etm_stock
