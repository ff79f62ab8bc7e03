// The processed bytes of a Metal delegate and its weights index, read in C
// (formats: common/delegate_blobs.py, common/weights_index.py). Neither the executorch
// wheel nor torch's headers ship a JSON parser, so the index is read by a small strict one:
// integers only (the index has no other numbers), bounded in size and depth, and every
// field checked as weights_index.decode_index checks it.
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "stock_backend.h"

namespace etm_stock {
namespace {

const size_t kMaxIndexBytes = 64u << 20;
const int kMaxDepth = 8;

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

struct Value {
  enum Kind { Null, Bool, Int, String, Array, Object } kind = Null;
  bool b = false;
  int64_t i = 0;
  std::string s;
  std::vector<Value> items;
  std::map<std::string, Value> fields;
};

class Parser {
 public:
  Parser(const char* p, size_t n) : p_(p), end_(p + n) {}

  bool document(Value* out, std::string* error) {
    if (!value(out, 0) || (skip(), p_ != end_)) {
      if (error_.empty()) error_ = "trailing bytes";
      *error = "weights index is not JSON: " + error_ + " at byte " + std::to_string(pos());
      return false;
    }
    return true;
  }

 private:
  const char *p_, *end_, *begin_ = p_;
  std::string error_;

  size_t pos() const { return (size_t)(p_ - begin_); }
  bool fail(const char* what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  void skip() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) p_++;
  }
  bool literal(const char* word) {
    size_t n = std::strlen(word);
    if ((size_t)(end_ - p_) < n || std::memcmp(p_, word, n)) return fail("unexpected token");
    p_ += n;
    return true;
  }
  static void utf8(uint32_t c, std::string* s) {
    if (c < 0x80) {
      s->push_back((char)c);
    } else if (c < 0x800) {
      s->push_back((char)(0xC0 | (c >> 6)));
      s->push_back((char)(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      s->push_back((char)(0xE0 | (c >> 12)));
      s->push_back((char)(0x80 | ((c >> 6) & 0x3F)));
      s->push_back((char)(0x80 | (c & 0x3F)));
    } else {
      s->push_back((char)(0xF0 | (c >> 18)));
      s->push_back((char)(0x80 | ((c >> 12) & 0x3F)));
      s->push_back((char)(0x80 | ((c >> 6) & 0x3F)));
      s->push_back((char)(0x80 | (c & 0x3F)));
    }
  }
  bool hex4(uint32_t* out) {
    if (end_ - p_ < 4) return fail("short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
      char c = *p_++;
      int d = (c >= '0' && c <= '9') ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) return fail("bad \\u escape");
      v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return true;
  }
  bool string(std::string* s) {
    p_++;  // the opening quote
    while (p_ < end_ && *p_ != '"') {
      unsigned char c = (unsigned char)*p_++;
      if (c < 0x20) return fail("control character in a string");
      if (c != '\\') {
        s->push_back((char)c);
        continue;
      }
      if (p_ == end_) return fail("unterminated escape");
      char e = *p_++;
      const char* plain = "\"\\/bfnrt";
      const char* real = "\"\\/\b\f\n\r\t";
      const char* at = std::strchr(plain, e);
      if (at && e) {
        s->push_back(real[at - plain]);
        continue;
      }
      if (e != 'u') return fail("bad escape");
      uint32_t cp;
      if (!hex4(&cp)) return false;
      if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
        uint32_t lo;
        if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return fail("lone surrogate");
        p_ += 2;
        if (!hex4(&lo) || lo < 0xDC00 || lo >= 0xE000) return fail("bad surrogate pair");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      } else if (cp >= 0xDC00 && cp < 0xE000) {
        return fail("lone surrogate");
      }
      utf8(cp, s);
    }
    if (p_ == end_) return fail("unterminated string");
    p_++;
    return true;
  }
  bool integer(int64_t* out) {
    bool neg = p_ < end_ && *p_ == '-';
    if (neg) p_++;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return fail("bad number");
    if (*p_ == '0' && p_ + 1 < end_ && p_[1] >= '0' && p_[1] <= '9')
      return fail("leading zero");
    int64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *p_ - '0', &v))
        return fail("integer out of range");
      p_++;
    }
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E'))
      return fail("only integers are expected");
    *out = neg ? -v : v;
    return true;
  }
  bool value(Value* v, int depth) {
    skip();
    if (p_ == end_) return fail("unexpected end");
    if (depth > kMaxDepth) return fail("nested too deeply");
    char c = *p_;
    if (c == '{') {
      v->kind = Value::Object;
      p_++;
      skip();
      if (p_ < end_ && *p_ == '}') return p_++, true;
      while (true) {
        skip();
        std::string key;
        if (p_ == end_ || *p_ != '"' || !string(&key)) return fail("expected a key");
        skip();
        if (p_ == end_ || *p_++ != ':') return fail("expected ':'");
        if (v->fields.count(key)) return fail("duplicate key");
        if (!value(&v->fields[key], depth + 1)) return false;
        skip();
        if (p_ < end_ && *p_ == ',') { p_++; continue; }
        if (p_ < end_ && *p_ == '}') return p_++, true;
        return fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v->kind = Value::Array;
      p_++;
      skip();
      if (p_ < end_ && *p_ == ']') return p_++, true;
      while (true) {
        v->items.emplace_back();
        if (!value(&v->items.back(), depth + 1)) return false;
        skip();
        if (p_ < end_ && *p_ == ',') { p_++; continue; }
        if (p_ < end_ && *p_ == ']') return p_++, true;
        return fail("expected ',' or ']'");
      }
    }
    if (c == '"') return v->kind = Value::String, string(&v->s);
    if (c == 't') return v->kind = Value::Bool, v->b = true, literal("true");
    if (c == 'f') return v->kind = Value::Bool, v->b = false, literal("false");
    if (c == 'n') return v->kind = Value::Null, literal("null");
    return v->kind = Value::Int, integer(&v->i);
  }
};

bool ints(const Value& v, std::vector<int64_t>* out) {
  if (v.kind != Value::Array) return false;
  for (const Value& item : v.items) {
    if (item.kind != Value::Int) return false;
    out->push_back(item.i);
  }
  return true;
}

bool entry(size_t i, const Value& raw, IndexEntry* e, std::string* error) {
  std::string where = "weights index: constant " + std::to_string(i);
  if (raw.kind != Value::Object) return *error = where + " is not an object", false;
  for (const char* f : {"name", "fqn", "dtype", "shape", "stride", "offset", "nbytes", "key"})
    if (!raw.fields.count(f)) return *error = where + " lacks '" + f + "'", false;
  const Value& name = raw.fields.at("name");
  where += name.kind == Value::String ? " ('" + name.s + "')" : "";
  std::string* strings[] = {&e->name, &e->fqn, &e->key};
  const char* string_fields[] = {"name", "fqn", "key"};
  for (int k = 0; k < 3; k++) {
    const Value& v = raw.fields.at(string_fields[k]);
    if (v.kind != Value::String || v.s.empty())
      return *error = where + ": " + string_fields[k] + " must be a non-empty string", false;
    *strings[k] = v.s;
  }
  int64_t* numbers[] = {&e->dtype, &e->offset, &e->nbytes};
  const char* number_fields[] = {"dtype", "offset", "nbytes"};
  for (int k = 0; k < 3; k++) {
    const Value& v = raw.fields.at(number_fields[k]);
    if (v.kind != Value::Int || v.i < 0)
      return *error = where + ": " + number_fields[k] + " must be an integer >= 0", false;
    *numbers[k] = v.i;
  }
  if (!ints(raw.fields.at("shape"), &e->shape) || !ints(raw.fields.at("stride"), &e->stride) ||
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
    auto it = raw.fields.find(flags[k]);
    if (it == raw.fields.end()) continue;
    if (it->second.kind != Value::Bool)
      return *error = where + ": " + flags[k] + " must be true or false", false;
    *targets[k] = it->second.b;
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
  if (!Parser(data, n).document(&doc, error)) return false;
  auto format = doc.kind == Value::Object ? doc.fields.find("format") : doc.fields.end();
  if (format == doc.fields.end() || format->second.kind != Value::String ||
      format->second.s != "etmetal-weights-index/1") {
    *error = "weights index has another format, expected 'etmetal-weights-index/1'";
    return false;
  }
  auto constants = doc.fields.find("constants");
  if (constants == doc.fields.end() || constants->second.kind != Value::Array) {
    *error = "weights index has no 'constants' list";
    return false;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < constants->second.items.size(); i++) {
    IndexEntry e;
    if (!entry(i, constants->second.items[i], &e, error)) return false;
    if (!names.insert(e.name).second) {
      *error = "weights index names constant '" + e.name + "' twice";
      return false;
    }
    out->push_back(std::move(e));
  }
  return true;
}

}  // namespace etm_stock
