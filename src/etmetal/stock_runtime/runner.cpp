// etmetal_runner: runs one method of a .pte in ExecuTorch's own C++ runtime, with no Python
// in the process. The shape of ExecuTorch's examples/portable/executor_runner: load the
// program, plan memory from the method's metadata, set inputs, execute, write outputs.
// The stock kernels come from libexecutorch_kernels_optimized.so, linked so its static
// registrations run at start-up; delegates come from --backend-lib libraries, which
// register themselves when dlopen runs their constructors.
//
// Usage and exit codes: see usage() below and ExitCode in runner_io.h.

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <executorch/devtools/etdump/etdump_flatcc.h>
#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/extension/named_data_map/merged_data_map.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/exec_aten/util/dim_order_util.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/runtime.h>

#include "runner_io.h"
#include "runner_options.h"

namespace et = executorch::runtime;
namespace ext = executorch::extension;
using etmetal_runner::ExitCode;
using etmetal_runner::fail;
using etmetal_runner::Options;

namespace {

// One tensor input: its bytes and the metadata a TensorImpl points at, kept alive together.
struct InputTensor {
  size_t index = 0;
  std::vector<int32_t> sizes;
  std::vector<uint8_t> dim_order;
  std::vector<int32_t> strides;
  std::unique_ptr<uint8_t, decltype(&std::free)> data{nullptr, &std::free};
  std::unique_ptr<executorch::aten::TensorImpl> impl;
};

std::string spec_text(const et::TensorInfo& info) {
  std::string s = executorch::runtime::toString(info.scalar_type());
  s += " [";
  for (size_t d = 0; d < info.sizes().size(); ++d) {
    s += (d ? ", " : "") + std::to_string(info.sizes()[d]);
  }
  return s + "] = " + std::to_string(info.nbytes()) + " bytes";
}

// Sets every input of `method`; returns kOk or an exit code with the message printed.
int set_inputs(
    et::Method& method,
    const et::MethodMeta& meta,
    const Options& o,
    std::vector<InputTensor>* tensors,
    std::string* manifest) {
  std::vector<size_t> tensor_inputs;
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    auto tag = meta.input_tag(i);
    if (tag.ok() && tag.get() == et::Tag::Tensor) {
      tensor_inputs.push_back(i);
    }
  }
  if (!o.inputs.empty() && o.inputs.size() != tensor_inputs.size()) {
    return fail(
        ExitCode::kBadInput,
        std::to_string(o.inputs.size()) + " --input file(s) given, method '" + o.method +
            "' has " + std::to_string(tensor_inputs.size()) + " tensor input(s)");
  }
  etmetal_runner::Generator generator = o.generator.value_or(etmetal_runner::Generator{});
  tensors->resize(tensor_inputs.size());
  for (size_t k = 0; k < tensor_inputs.size(); ++k) {
    size_t index = tensor_inputs[k];
    et::TensorInfo info = meta.input_tensor_meta(index).get();
    InputTensor& t = (*tensors)[k];
    t.index = index;
    t.sizes.assign(info.sizes().begin(), info.sizes().end());
    t.dim_order.assign(info.dim_order().begin(), info.dim_order().end());
    t.strides.resize(t.sizes.size());
    if (!t.sizes.empty() &&
        et::dim_order_to_stride(
            t.sizes.data(), t.dim_order.data(), t.sizes.size(), t.strides.data()) !=
            et::Error::Ok) {
      return fail(ExitCode::kBadInput, "input " + std::to_string(index) + ": bad dim order");
    }
    size_t nbytes = info.nbytes();
    t.data.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64)));
    std::string file;
    if (!o.inputs.empty()) {
      file = o.inputs[k];
      std::vector<uint8_t> bytes;
      std::string error;
      if (!etmetal_runner::read_file(file, &bytes, &error)) {
        return fail(ExitCode::kMissingFile, "input " + std::to_string(index) + ": " + error);
      }
      if (bytes.size() != nbytes) {
        return fail(
            ExitCode::kBadInput,
            "input " + std::to_string(index) + " (" + file + "): " +
                std::to_string(bytes.size()) + " bytes, the method's input " +
                std::to_string(index) + " is " + spec_text(info));
      }
      std::memcpy(t.data.get(), bytes.data(), nbytes);
    } else {
      if (!etmetal_runner::generate(info.scalar_type(), t.data.get(), nbytes, &generator, k)) {
        return fail(
            ExitCode::kBadInput,
            "input " + std::to_string(index) + ": cannot generate " + spec_text(info));
      }
      if (!o.output_dir.empty()) {  // so a caller can run the same inputs elsewhere
        file = o.output_dir + "/input_" + std::to_string(index) + ".bin";
        std::string error;
        if (!etmetal_runner::write_file_atomically(file, t.data.get(), nbytes, &error)) {
          return fail(ExitCode::kWriteFailed, error);
        }
      }
    }
    t.impl = std::make_unique<executorch::aten::TensorImpl>(
        info.scalar_type(),
        static_cast<ssize_t>(t.sizes.size()),
        t.sizes.data(),
        t.data.get(),
        t.dim_order.data(),
        t.strides.data());
    et::EValue value{executorch::aten::Tensor(t.impl.get())};
    et::Error err = method.set_input(value, index);
    if (err != et::Error::Ok) {
      return fail(
          ExitCode::kBadInput,
          "set_input " + std::to_string(index) + " failed: " + et::to_string(err));
    }
    *manifest += std::string(k ? ", " : "") + "{\"index\": " + std::to_string(index) +
        ", \"value\": " + etmetal_runner::describe_evalue(value, file) + "}";
  }
  return ExitCode::kOk;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

int write_outputs(et::Method& method, const Options& o, const std::string& inputs_json,
                  double load_ms, const std::vector<double>& times) {
  std::string outputs_json;
  std::vector<std::string> written;
  auto give_up = [&](const std::string& error) {
    for (const auto& path : written) {  // a run's outputs are all there, or none is
      std::remove(path.c_str());
    }
    return fail(ExitCode::kWriteFailed, error);
  };
  for (size_t i = 0; i < method.outputs_size(); ++i) {
    const et::EValue& value = method.get_output(i);
    std::string file;
    if (value.isTensor()) {
      file = o.output_dir + "/output_" + std::to_string(i) + ".bin";
      const auto& t = value.toTensor();
      std::string error;
      if (!etmetal_runner::write_file_atomically(file, t.const_data_ptr(), t.nbytes(), &error)) {
        return give_up(error);
      }
      written.push_back(file);
    }
    outputs_json += std::string(i ? ", " : "") + etmetal_runner::describe_evalue(value, file);
  }
  std::string times_json;
  for (size_t i = 0; i < times.size(); ++i) {
    times_json += (i ? ", " : "") + std::to_string(times[i]);
  }
  std::string manifest = "{\"program\": \"" + etmetal_runner::json_escape(o.program) +
      "\", \"method\": \"" + etmetal_runner::json_escape(o.method) +
      "\", \"iterations\": " + std::to_string(o.iterations) +
      ", \"load_method_ms\": " + std::to_string(load_ms) + ", \"execute_ms\": [" +
      times_json + "], \"inputs\": [" + inputs_json + "], \"outputs\": [" + outputs_json +
      "]}\n";
  std::string error;
  if (!etmetal_runner::write_file_atomically(
          o.output_dir + "/manifest.json", manifest.data(), manifest.size(), &error)) {
    return give_up(error);
  }
  return ExitCode::kOk;
}

// A backend library's full account of its last failure (ExecuTorch's log cuts long lines).
using LastError = const char* (*)();
std::vector<std::pair<std::string, LastError>> backend_errors;

std::string backend_messages() {
  std::string text;
  for (const auto& [lib, last_error] : backend_errors) {
    const char* message = last_error();
    if (message != nullptr && *message != '\0') {
      text += "\n  " + std::filesystem::path(lib).filename().string() + ": " + message;
    }
  }
  return text;
}

int run(const Options& o) {
  for (const auto& lib : o.backend_libs) {
    // RTLD_LOCAL: the library registers its backend from a constructor, nothing else of it
    // needs to be visible to later libraries
    void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return fail(ExitCode::kBackendLib, std::string("cannot load backend library: ") + dlerror());
    }
    // etmetal's MetalBackend is configured by a C call naming the libtorch_cpu its native
    // fallbacks use (the same call etmetal.stock_runtime.register makes)
    using Configure = int32_t (*)(const char*);
    auto configure = reinterpret_cast<Configure>(dlsym(handle, "etm_stock_configure"));
    auto last_error = reinterpret_cast<LastError>(dlsym(handle, "etm_stock_last_error"));
    if (last_error != nullptr) {
      backend_errors.emplace_back(lib, last_error);
    }
    if (configure != nullptr && !o.libtorch_cpu.empty() &&
        configure(o.libtorch_cpu.c_str()) != 0) {
      return fail(ExitCode::kBackendLib, lib + ": " +
                                             (last_error ? last_error() : "etm_stock_configure failed"));
    }
    // the emulated Metal device's compiled shader libraries: where the cache is, what
    // built it, the interpreter that compiles a missing one (run_native sets ETMETAL_MSL_*;
    // without them an mps_emulated delegate fails to create its libraries, by name)
    using ConfigureMsl = int32_t (*)(const char*, const char*, const char*, uint32_t);
    auto msl = reinterpret_cast<ConfigureMsl>(dlsym(handle, "etm_stock_configure_msl"));
    const char* msl_root = std::getenv("ETMETAL_MSL_ROOT");
    const char* msl_chain = std::getenv("ETMETAL_MSL_TOOLCHAIN");
    if (msl != nullptr && msl_root != nullptr && msl_chain != nullptr) {
      const char* workers = std::getenv("ETMETAL_MSL_WORKERS");
      int n = workers != nullptr ? std::atoi(workers) : 0;
      if (msl(msl_root, msl_chain, std::getenv("ETMETAL_MSL_PYTHON"), n > 0 ? (uint32_t)n : 1) != 0) {
        return fail(ExitCode::kBackendLib,
                    lib + ": " + (last_error ? last_error() : "etm_stock_configure_msl failed"));
      }
    }
    // and the proxy library that runs a delegate's extern-node table, when given
    using ConfigureProxy = int32_t (*)(const char*);
    auto proxy = reinterpret_cast<ConfigureProxy>(dlsym(handle, "etm_stock_configure_proxy"));
    if (proxy != nullptr && !o.proxy_lib.empty() && proxy(o.proxy_lib.c_str()) != 0) {
      return fail(ExitCode::kBackendLib,
                  lib + ": " + (last_error ? last_error() : "etm_stock_configure_proxy failed"));
    }
  }
  if (o.list_operators || o.list_backends) {
    if (o.list_operators) {
      for (const auto& k : et::get_registered_kernels()) {
        std::printf("%s\n", k.name_);
      }
    }
    if (o.list_backends) {
      for (size_t i = 0; i < et::get_num_registered_backends(); ++i) {
        std::printf("%s\n", et::get_backend_name(i).get());
      }
    }
    return ExitCode::kOk;
  }
  if (!std::filesystem::is_regular_file(o.program)) {
    return fail(ExitCode::kMissingFile, "no such program file: " + o.program);
  }
  // loaders and data maps live for the whole run: the program and method borrow them
  std::unique_ptr<et::DataLoader> loader;
  if (o.mmap) {
    auto l = ext::MmapDataLoader::from(o.program.c_str());
    if (!l.ok()) {
      return fail(ExitCode::kProgramLoad, "cannot map " + o.program + ": " + et::to_string(l.error()));
    }
    loader = std::make_unique<ext::MmapDataLoader>(std::move(l.get()));
  } else {
    auto l = ext::FileDataLoader::from(o.program.c_str());
    if (!l.ok()) {
      return fail(ExitCode::kProgramLoad, "cannot open " + o.program + ": " + et::to_string(l.error()));
    }
    loader = std::make_unique<ext::FileDataLoader>(std::move(l.get()));
  }
  auto program = et::Program::load(loader.get(), et::Program::Verification::InternalConsistency);
  if (!program.ok()) {
    return fail(ExitCode::kProgramLoad, "Program::load(" + o.program + ") failed: " +
                                            et::to_string(program.error()));
  }
  std::vector<std::unique_ptr<ext::FileDataLoader>> data_loaders;
  std::vector<std::unique_ptr<ext::FlatTensorDataMap>> data_maps;
  std::vector<const et::NamedDataMap*> map_ptrs;
  for (const auto& path : o.data_files) {
    if (!std::filesystem::is_regular_file(path)) {
      return fail(ExitCode::kMissingFile, "no such data file: " + path);
    }
    auto l = ext::FileDataLoader::from(path.c_str());
    if (!l.ok()) {
      return fail(ExitCode::kProgramLoad, "cannot open " + path + ": " + et::to_string(l.error()));
    }
    data_loaders.push_back(std::make_unique<ext::FileDataLoader>(std::move(l.get())));
    auto m = ext::FlatTensorDataMap::load(data_loaders.back().get());
    if (!m.ok()) {
      return fail(ExitCode::kProgramLoad, "data file " + path + " is not a .ptd: " +
                                              et::to_string(m.error()));
    }
    data_maps.push_back(std::make_unique<ext::FlatTensorDataMap>(std::move(m.get())));
    map_ptrs.push_back(data_maps.back().get());
  }
  std::optional<ext::merged_data_map::MergedDataMap> merged;
  if (map_ptrs.size() > 1) {
    auto m = ext::merged_data_map::MergedDataMap::load({map_ptrs.data(), map_ptrs.size()});
    if (!m.ok()) {
      return fail(ExitCode::kProgramLoad, std::string("cannot merge the data files: ") + et::to_string(m.error()));
    }
    merged.emplace(std::move(m.get()));
  }
  const et::NamedDataMap* data_map =
      merged ? &*merged : (map_ptrs.empty() ? nullptr : map_ptrs.front());

  auto meta = program->method_meta(o.method.c_str());
  if (!meta.ok()) {
    std::string names;
    for (size_t i = 0; i < program->num_methods(); ++i) {
      names += std::string(i ? ", " : "") + program->get_method_name(i).get();
    }
    return fail(ExitCode::kNoSuchMethod,
                "no method '" + o.method + "' in " + o.program + " (methods: " + names + ")");
  }
  if (o.describe) {
    std::printf("%s\n", etmetal_runner::describe_inputs(*meta).c_str());
    return ExitCode::kOk;
  }
  // planned memory: one buffer per memory-planned id, sized by the method's metadata
  std::vector<std::vector<uint8_t>> planned;
  std::vector<et::Span<uint8_t>> planned_spans;
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    planned.emplace_back(meta->memory_planned_buffer_size(i).get());
    planned_spans.emplace_back(planned.back().data(), planned.back().size());
  }
  et::HierarchicalAllocator planned_allocator({planned_spans.data(), planned_spans.size()});
  ext::MallocMemoryAllocator method_allocator;
  ext::MallocMemoryAllocator temp_allocator;
  et::MemoryManager memory(&method_allocator, &planned_allocator, &temp_allocator);

  std::unique_ptr<executorch::etdump::ETDumpGen> etdump;
  if (!o.etdump.empty()) {
    etdump = std::make_unique<executorch::etdump::ETDumpGen>();
  }
  auto load_start = std::chrono::steady_clock::now();
  auto method = program->load_method(o.method.c_str(), &memory, etdump.get(), data_map);
  double load_ms = ms_since(load_start);
  if (!method.ok()) {
    return fail(ExitCode::kMethodLoad, "load_method('" + o.method + "') failed: " +
                                           et::to_string(method.error()) + backend_messages());
  }
  if (!o.output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.output_dir, ec);
    if (ec) {
      return fail(ExitCode::kWriteFailed, "cannot create " + o.output_dir + ": " + ec.message());
    }
  }
  std::vector<InputTensor> tensors;
  std::string inputs_json;
  int code = set_inputs(*method, *meta, o, &tensors, &inputs_json);
  if (code != ExitCode::kOk) {
    return code;
  }
  std::vector<double> times;
  for (int i = 0; i < o.iterations; ++i) {
    // the memory plan may reuse an input's buffer once the input is read, so every
    // iteration gets its inputs again (outside the timed part)
    for (size_t k = 0; i > 0 && k < tensors.size(); ++k) {
      et::Error err = method->set_input(
          et::EValue(executorch::aten::Tensor(tensors[k].impl.get())), tensors[k].index);
      if (err != et::Error::Ok) {
        return fail(ExitCode::kBadInput, "set_input " + std::to_string(tensors[k].index) +
                                             " failed: " + et::to_string(err));
      }
    }
    auto start = std::chrono::steady_clock::now();
    et::Error err = method->execute();
    times.push_back(ms_since(start));
    if (err != et::Error::Ok) {
      return fail(ExitCode::kExecute, "execute of '" + o.method + "' failed (iteration " +
                                          std::to_string(i) + "): " + et::to_string(err) +
                                          backend_messages());
    }
  }
  if (!o.output_dir.empty()) {
    code = write_outputs(*method, o, inputs_json, load_ms, times);
    if (code != ExitCode::kOk) {
      return code;
    }
  }
  if (etdump) {
    auto result = etdump->get_etdump_data();
    std::string error;
    if (result.buf == nullptr ||
        !etmetal_runner::write_file_atomically(o.etdump, result.buf, result.size, &error)) {
      return fail(ExitCode::kWriteFailed, "cannot write the ETDump: " +
                                              (error.empty() ? "no data recorded" : error));
    }
    std::free(result.buf);
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  std::printf(
      "etmetal_runner: %s '%s': %zu input(s), %zu output(s), %d iteration(s), "
      "load_method %.3f ms, execute median %.3f ms min %.3f ms\n",
      o.program.c_str(), o.method.c_str(), meta->num_inputs(), method->outputs_size(),
      o.iterations, load_ms, sorted[sorted.size() / 2], sorted.front());
  return ExitCode::kOk;
}

} // namespace

int main(int argc, char** argv) {
  et::runtime_init();
  Options options;
  int code = etmetal_runner::parse(argc, argv, &options);
  if (code == ExitCode::kOk) {
    code = run(options);
  }
  if (!options.dump_maps.empty()) {  // last, so it shows everything the run mapped
    std::vector<uint8_t> maps;
    std::string error;
    if (!etmetal_runner::read_file("/proc/self/maps", &maps, &error) ||
        !etmetal_runner::write_file_atomically(options.dump_maps, maps.data(), maps.size(),
                                               &error)) {
      std::fprintf(stderr, "etmetal_runner: --dump-maps: %s\n", error.c_str());
      return code == ExitCode::kOk ? ExitCode::kWriteFailed : code;
    }
  }
  return code;
}
