// The strict JSON reader of json_reader.h. Accepts what Python's json.loads accepts for
// the documents Inductor writes, including NaN and +-Infinity (json.dumps writes them for
// non-finite floats), and refuses anything else with the offset of the fault.
#include "json_reader.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace etm_json {

const Value* Value::get(const char* key) const {
  const Value* found = nullptr;
  for (const auto& kv : fields)
    if (kv.first == key) found = &kv.second;  // the last one wins
  return found;
}

const std::string* Value::repeated_key() const {
  for (size_t i = 0; i < fields.size(); i++)
    for (size_t j = 0; j < i; j++)
      if (fields[j].first == fields[i].first) return &fields[i].first;
  return nullptr;
}

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Null: return "null";
    case Value::Bool: return "a boolean";
    case Value::Number: return "a number";
    case Value::String: return "a string";
    case Value::Array: return "an array";
    case Value::Object: return "an object";
  }
  return "?";
}

namespace {

class Parser {
 public:
  Parser(const char* p, size_t n, int max_depth) : begin_(p), p_(p), end_(p + n), max_(max_depth) {}

  bool document(Value* out, std::string* error) {
    bool ok = value(out, 0);
    if (ok) {
      skip();
      if (p_ != end_) ok = fail("trailing characters after the document");
    }
    if (!ok) *error = error_ + " at byte " + std::to_string((size_t)(p_ - begin_));
    return ok;
  }

 private:
  const char *begin_, *p_, *end_;
  int max_;
  std::string error_;

  bool fail(const char* what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  void skip() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) p_++;
  }
  bool word(const char* w) {
    size_t n = std::strlen(w);
    if ((size_t)(end_ - p_) < n || std::memcmp(p_, w, n) != 0) return false;
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
    if (end_ - p_ < 4) return fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
      char c = *p_++;
      v <<= 4;
      if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
      else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
      else return fail("bad \\u escape");
    }
    *out = v;
    return true;
  }
  bool string(std::string* s) {
    p_++;  // the opening quote
    while (true) {
      if (p_ >= end_) return fail("unterminated string");
      unsigned char c = (unsigned char)*p_++;
      if (c == '"') return true;
      if (c < 0x20) return fail("control character in a string");
      if (c != '\\') {
        s->push_back((char)c);
        continue;
      }
      if (p_ >= end_) return fail("unterminated escape");
      char e = *p_++;
      switch (e) {
        case '"': s->push_back('"'); break;
        case '\\': s->push_back('\\'); break;
        case '/': s->push_back('/'); break;
        case 'b': s->push_back('\b'); break;
        case 'f': s->push_back('\f'); break;
        case 'n': s->push_back('\n'); break;
        case 'r': s->push_back('\r'); break;
        case 't': s->push_back('\t'); break;
        case 'u': {
          uint32_t c1;
          if (!hex4(&c1)) return false;
          if (c1 >= 0xD800 && c1 < 0xDC00 && end_ - p_ >= 6 && p_[0] == '\\' && p_[1] == 'u') {
            const char* back = p_;
            p_ += 2;
            uint32_t c2;
            if (!hex4(&c2)) return false;
            if (c2 >= 0xDC00 && c2 < 0xE000) c1 = 0x10000 + ((c1 - 0xD800) << 10) + (c2 - 0xDC00);
            else p_ = back;  // a lone surrogate, kept as Python keeps it
          }
          utf8(c1, s);
          break;
        }
        default: return fail("bad escape in a string");
      }
    }
  }
  bool number(Value* out) {
    const char* start = p_;
    if (p_ < end_ && *p_ == '-') p_++;
    if (word("Infinity")) {
      out->kind = Value::Number;
      out->number = *start == '-' ? -INFINITY : INFINITY;
      return true;
    }
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') return fail("bad number");
    if (*p_ == '0') p_++;
    else while (p_ < end_ && *p_ >= '0' && *p_ <= '9') p_++;
    bool integral = true;
    if (p_ < end_ && *p_ == '.') {
      integral = false;
      p_++;
      if (p_ >= end_ || *p_ < '0' || *p_ > '9') return fail("bad number");
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') p_++;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      integral = false;
      p_++;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) p_++;
      if (p_ >= end_ || *p_ < '0' || *p_ > '9') return fail("bad number");
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') p_++;
    }
    std::string text(start, (size_t)(p_ - start));
    out->kind = Value::Number;
    out->number = std::strtod(text.c_str(), nullptr);
    out->integer_text = integral;
    if (integral) {
      errno = 0;
      long long v = std::strtoll(text.c_str(), nullptr, 10);
      out->integral = errno == 0;  // a larger integer stays a (rounded) number
      out->integer = (int64_t)v;
    }
    return true;
  }
  bool value(Value* out, int depth) {
    if (depth > max_) return fail("nested too deeply");
    skip();
    if (p_ >= end_) return fail("unexpected end of the document");
    char c = *p_;
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out->kind = Value::String;
      return string(&out->s);
    }
    if (word("true")) { out->kind = Value::Bool; out->b = true; return true; }
    if (word("false")) { out->kind = Value::Bool; out->b = false; return true; }
    if (word("null")) { out->kind = Value::Null; return true; }
    if (word("NaN")) { out->kind = Value::Number; out->number = NAN; return true; }
    if (c == '-' || (c >= '0' && c <= '9') || c == 'I') return number(out);
    return fail("unexpected character");
  }
  bool array(Value* out, int depth) {
    out->kind = Value::Array;
    p_++;
    skip();
    if (p_ < end_ && *p_ == ']') { p_++; return true; }
    while (true) {
      out->items.emplace_back();
      if (!value(&out->items.back(), depth + 1)) return false;
      skip();
      if (p_ >= end_) return fail("unterminated array");
      if (*p_ == ',') { p_++; continue; }
      if (*p_ == ']') { p_++; return true; }
      return fail("expected ',' or ']'");
    }
  }
  bool object(Value* out, int depth) {
    out->kind = Value::Object;
    p_++;
    skip();
    if (p_ < end_ && *p_ == '}') { p_++; return true; }
    while (true) {
      skip();
      if (p_ >= end_ || *p_ != '"') return fail("expected a string key");
      std::string key;
      if (!string(&key)) return false;
      skip();
      if (p_ >= end_ || *p_ != ':') return fail("expected ':'");
      p_++;
      Value v;
      if (!value(&v, depth + 1)) return false;
      out->fields.emplace_back(std::move(key), std::move(v));
      skip();
      if (p_ >= end_) return fail("unterminated object");
      if (*p_ == ',') { p_++; continue; }
      if (*p_ == '}') { p_++; return true; }
      return fail("expected ',' or '}'");
    }
  }
};

}  // namespace

bool parse(const char* text, size_t n, Value* out, std::string* error, int max_depth) {
  *out = Value();
  return Parser(text, n, max_depth).document(out, error);
}

}  // namespace etm_json
