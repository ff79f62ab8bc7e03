// A small strict JSON reader for the program's JSON data: the extern-node table
// (shims/proxy_parse.cpp) and the weights index (stock_runtime/stock_index.cpp). Neither
// torch's nor the executorch wheel's headers ship a JSON parser, and both documents are
// untrusted, so this one is bounded in size and depth and names where it failed.
#ifndef ETMETAL_JSON_READER_H
#define ETMETAL_JSON_READER_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace etm_json {

struct Value {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  double number = 0;
  bool integer_text = false;  // written without fraction or exponent
  bool integral = false;      // ... and fits int64
  int64_t integer = 0;
  std::string s;
  std::vector<Value> items;
  // in document order; a repeated key keeps its last value (as Python's json does)
  std::vector<std::pair<std::string, Value>> fields;

  const Value* get(const char* key) const;
  // the first key written twice in this object, or nullptr
  const std::string* repeated_key() const;
  bool is_int() const { return kind == Number && integral; }
};

// the kind's name as error messages write it ("a string", "an object", ...)
const char* kind_name(Value::Kind kind);

// parse text[0, n) into *out; false with *error naming the byte offset on any fault
bool parse(const char* text, size_t n, Value* out, std::string* error, int max_depth = 64);

}  // namespace etm_json

#endif  // ETMETAL_JSON_READER_H
