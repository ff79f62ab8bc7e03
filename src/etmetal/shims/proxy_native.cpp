// Running the native proxy executor's calls (proxy_native.h; shims/proxy_native.py explains
// the design; proxy_parse.cpp reads the table). A call lends the caller's records to ATen as
// tensors over their memory (no copy), runs the operator boxed, and hands each result to
// the caller's output handle as a storage libtorch owns, as shims/proxy_executor.py does.
#include "proxy_native.h"

#include <ATen/core/stack.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "proxy_nodes.h"

using namespace etm_proxy_impl;

extern "C" {
ETM_EXPORT uint64_t etm_proxy_calls = 0;
}

namespace {

thread_local std::string last_error;

void write(const std::string& s, char* out, int64_t len) {
  if (!out || len <= 0) return;
  size_t n = std::min(s.size(), (size_t)len - 1);
  std::memcpy(out, s.data(), n);
  out[n] = '\0';
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
