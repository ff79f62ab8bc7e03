#include "runner_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <unistd.h>

#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/executor/method_meta.h>

namespace etmetal_runner {

using executorch::aten::ScalarType;
using executorch::runtime::EValue;

bool read_file(const std::string& path, std::vector<uint8_t>* out, std::string* error) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  out->clear();
  uint8_t chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) {
    out->insert(out->end(), chunk, chunk + n);
  }
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) {
    *error = "cannot read " + path;
    return false;
  }
  return true;
}

bool write_file_atomically(
    const std::string& path,
    const void* data,
    size_t size,
    std::string* error) {
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    *error = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot write " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

namespace {

// splitmix64: a tiny, well-mixed generator; the same seed gives the same bytes anywhere.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Only multiples of 1/8 in [-1, 1] are generated, so half and bfloat16 hold them exactly
// and the conversions below need no rounding.
uint16_t to_half(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if ((bits & 0x7FFFFFFFu) == 0) {
    return sign;
  }
  int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (exponent << 10) | ((bits >> 13) & 0x3FF));
}

uint16_t to_bfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
void store(uint8_t* data, size_t i, T value) {
  std::memcpy(data + i * sizeof(T), &value, sizeof(T));
}

} // namespace

bool generate(
    ScalarType dtype,
    uint8_t* data,
    size_t size,
    Generator* generator,
    uint64_t tensor_index) {
  size_t item = executorch::runtime::elementSize(dtype);
  size_t count = size / item;
  for (size_t i = 0; i < count; ++i) {
    uint64_t r = mix(generator->seed ^ mix(tensor_index * 0x100000001B3ull + i));
    // floats: k/8 - 1 for k in [0, 16]; integers: [0, 8), valid as small indices
    float f = generator->ones ? 1.0f : static_cast<float>(r % 17) / 8.0f - 1.0f;
    int64_t n = generator->ones ? 1 : static_cast<int64_t>(r % 8);
    switch (dtype) {
      case ScalarType::Float:
        store<float>(data, i, f);
        break;
      case ScalarType::Double:
        store<double>(data, i, f);
        break;
      case ScalarType::Half:
        store<uint16_t>(data, i, to_half(f));
        break;
      case ScalarType::BFloat16:
        store<uint16_t>(data, i, to_bfloat16(f));
        break;
      case ScalarType::Bool:
        store<uint8_t>(data, i, static_cast<uint8_t>(n % 2 == 1));
        break;
      case ScalarType::Byte:
        store<uint8_t>(data, i, static_cast<uint8_t>(n));
        break;
      case ScalarType::Char:
        store<int8_t>(data, i, static_cast<int8_t>(n));
        break;
      case ScalarType::Short:
        store<int16_t>(data, i, static_cast<int16_t>(n));
        break;
      case ScalarType::Int:
        store<int32_t>(data, i, static_cast<int32_t>(n));
        break;
      case ScalarType::Long:
        store<int64_t>(data, i, n);
        break;
      default:
        return false;
    }
  }
  return true;
}

std::string json_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string describe_evalue(const EValue& value, const std::string& file) {
  std::ostringstream s;
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    s << "{\"kind\": \"tensor\", \"dtype\": \""
      << executorch::runtime::toString(t.scalar_type())
      << "\", \"scalar_type\": " << static_cast<int>(t.scalar_type())
      << ", \"sizes\": [";
    for (ssize_t d = 0; d < t.dim(); ++d) {
      s << (d ? ", " : "") << t.size(d);
    }
    s << "], \"dim_order\": [";
    for (ssize_t d = 0; d < t.dim(); ++d) {
      s << (d ? ", " : "") << static_cast<int>(t.dim_order()[d]);
    }
    s << "], \"nbytes\": " << t.nbytes() << ", \"file\": \"" << json_escape(file)
      << "\"}";
  } else if (value.isInt()) {
    s << "{\"kind\": \"int\", \"value\": " << value.toInt() << "}";
  } else if (value.isDouble()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", value.toDouble());
    s << "{\"kind\": \"double\", \"value\": " << buf << "}";
  } else if (value.isBool()) {
    s << "{\"kind\": \"bool\", \"value\": " << (value.toBool() ? "true" : "false") << "}";
  } else if (value.isNone()) {
    s << "{\"kind\": \"none\"}";
  } else {
    s << "{\"kind\": \"unsupported\", \"tag\": " << static_cast<int>(value.tag) << "}";
  }
  return s.str();
}

std::string describe_inputs(const executorch::runtime::MethodMeta& meta) {
  std::string s = "{\"method\": \"" + json_escape(meta.name()) +
      "\", \"inputs\": [";
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    s += i ? ", " : "";
    auto tag = meta.input_tag(i);
    if (!tag.ok() || tag.get() != executorch::runtime::Tag::Tensor) {
      s += "{\"kind\": \"scalar\", \"tag\": " +
          std::to_string(tag.ok() ? static_cast<int>(tag.get()) : -1) + "}";
      continue;
    }
    executorch::runtime::TensorInfo info = meta.input_tensor_meta(i).get();
    s += "{\"kind\": \"tensor\", \"dtype\": \"";
    s += executorch::runtime::toString(info.scalar_type());
    s += "\", \"scalar_type\": " + std::to_string(static_cast<int>(info.scalar_type()));
    s += ", \"sizes\": [";
    for (size_t d = 0; d < info.sizes().size(); ++d) {
      s += (d ? ", " : "") + std::to_string(info.sizes()[d]);
    }
    s += "], \"dim_order\": [";
    for (size_t d = 0; d < info.dim_order().size(); ++d) {
      s += (d ? ", " : "") + std::to_string(info.dim_order()[d]);
    }
    s += "], \"nbytes\": " + std::to_string(info.nbytes()) + "}";
  }
  return s + "]}";
}


} // namespace etmetal_runner
