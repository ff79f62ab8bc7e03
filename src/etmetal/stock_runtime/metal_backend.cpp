// etmetal's MetalBackend for the stock ExecuTorch runtime (stock_runtime/__init__.py
// explains the design): a BackendInterface registered as "MetalBackend" when this library
// is loaded, running a host delegate's AOTI .so through the native shims linked into the
// same library, with no Python call.
#include <dlfcn.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/event_tracer_hooks_delegate.h>
#include <executorch/runtime/platform/log.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>

#include "etmetal_stock.h"
#include "itemsizes.inc"  // etm_stock_itemsizes: c10 code -> bytes (build.py, from abi_codes)
#include "native_fallbacks.h"
#include "stock_constants.h"
#include "mps_rules.inc"  // etm_stock_conv_rule, etm_stock_int4_* (build.py)
#include "stock_events.h"
#include "stock_mps.h"
#include "stock_proxy.h"
#include "stock_tensors.h"

extern "C" {
extern int64_t etm_native_limit, etm_native_cache_limit, etm_native_views, etm_native_borrows;
extern int64_t etm_native_mps_limit, etm_mps_conv_rule[4], etm_int4_dot_rows,
    etm_int4_tile_bytes;
extern const char* etm_last_unbound;
// the emulated Metal device's libtorch entry points (mps_fallbacks.cpp: the dispatcher)
extern const etm_lt_entry etm_lt_mps_table[];
extern const int64_t etm_lt_mps_count;
extern char etm_check_message[1024];
int32_t etm_run(etm_call* c);
int32_t etm_native_delete_handle(void* h);
}

namespace et = executorch::runtime;
using executorch::aten::Tensor;

namespace etm_stock {
namespace {

std::mutex lock;  // the record table and the caches are process-global: one call at a time
char last_error_text[4096] = {0};
bool configured = false;
const int64_t kNativeLimit = int64_t(1) << 40;  // every allocation is native: no Python here
const int64_t kCacheLimit = int64_t(64) << 20;  // freed allocations kept for reuse

// the event tracer of the execute in progress (the lock makes it one), for the fallbacks'
// events (stock_events.h); fallbacks do not nest, a short stack keeps that an assumption
et::EventTracer* current_tracer = nullptr;
std::vector<et::EventTracerEntry> open_events;

struct Delegate {
  std::string where, dir;
  void* lib = nullptr;
  Aoti api{};
  void* container = nullptr;
  size_t n_in = 0, n_out = 0;
  Constants constants;
  std::vector<etm_rec> images;
  std::vector<void*> in_handles, out_handles;
  std::vector<etm_out> outs;
  std::vector<int64_t> dsts;
  etm_proxy* proxy = nullptr;  // the extern-node table's calls (the delegate is their handle)
  int32_t device = 0;  // the c10 device its tensors are on: 0, or 13 (the emulated Metal device)
};
std::list<Delegate*> live;  // in creation order (etm_stock_describe)
// at exit, delegates nobody destroyed still take their private directories with them
// (the containers are left to the process's end: their .so may already be unloading)
struct RemoveDirsAtExit {
  ~RemoveDirsAtExit() {
    for (Delegate* d : live) remove_private_dir(d->dir);
  }
} remove_dirs_at_exit;

void destroy_delegate(Delegate* d) {
  if (d->container) d->api.remove(d->container);  // its constants' aliases stay ours
  d->container = nullptr;
  d->constants.release();
  if (d->proxy) {
    etm_proxy_bind(d, nullptr);
    free_extern_nodes(d->proxy);
  }
  // the .so stays mapped: AOTI's .so has STB_GNU_UNIQUE symbols, which make dlclose a no-op
  remove_private_dir(d->dir);
  live.remove(d);
  delete d;
}

et::Error fail(const std::string& where, const std::string& what, et::Error code) {
  set_error(where + ": " + what);
  return code;
}

bool spec_target(et::ArrayRef<et::CompileSpec> specs, std::vector<Spec>* all, std::string* target) {
  *target = "host";  // no target key: host, as lowered without the partitioner
  for (const et::CompileSpec& s : specs) {
    all->push_back({s.key ? s.key : "", std::string((const char*)s.value.buffer, s.value.nbytes)});
    if (s.key && !std::strcmp(s.key, "target")) *target = all->back().value;
  }
  return true;
}

bool named_blob(const et::NamedDataMap* named, const std::string& key, const char* what,
                std::unique_ptr<et::FreeableBuffer>* out, std::string* error) {
  auto data = named->get_data(key.c_str());
  if (!data.ok()) {
    *error = "named data '" + key + "' (the " + what + ") is in neither the program nor its " +
             "data files; if the program was exported with external data, pass its .ptd";
    return false;
  }
  *out = std::make_unique<et::FreeableBuffer>(std::move(data.get()));
  std::string actual = sha256_hex((*out)->data(), (*out)->size());
  if (actual != key_digest(key)) {
    *error = std::string("the ") + what + " blob does not match its key: sha256 " + actual +
             ", key '" + key + "' (" + std::to_string((*out)->size()) + " bytes); the program " +
             "was altered or corrupted after export";
    return false;
  }
  return true;
}

class MetalBackend final : public et::BackendInterface {
 public:
  bool is_available() const override { return true; }

  et::Result<et::DelegateHandle*> init(et::BackendInitContext& context,
                                       et::FreeableBuffer* processed,
                                       et::ArrayRef<et::CompileSpec> compile_specs) const override {
    std::lock_guard<std::mutex> guard(lock);
    const char* method = context.get_method_name();
    std::string where = std::string("method '") + (method ? method : "?") + "': MetalBackend delegate";
    std::string error, target;
    if (!configured)
      return fail(where, "etmetal's stock backend is not configured (call "
                         "etmetal.stock_runtime.register(), or etm_stock_configure from C)",
                  et::Error::InvalidState);
    std::vector<Spec> specs;
    spec_target(compile_specs, &specs, &target);
    bool mps = target == "mps_emulated";  // Inductor's Metal program, on the emulated device
    if (target != "host" && !mps)
      return fail(where, "compiled for target '" + target + "'; etmetal's backend for the " +
                             "stock runtime runs 'host' and 'mps_emulated' delegates (run an " +
                             "'mps' program on macOS with ExecuTorch's Metal runtime, or lower " +
                             "it for 'mps_emulated' to run it here)",
                  et::Error::NotSupported);
    Keys keys;
    if (!parse_keys(processed->data(), processed->size(), &keys, &error))
      return fail(where, error, et::Error::InvalidProgram);
    const et::NamedDataMap* named = context.get_named_data_map();
    if (!named) return fail(where, "the program has no named data", et::Error::InvalidProgram);
    std::unique_ptr<et::FreeableBuffer> so, weights, externs;
    if (!named_blob(named, keys.so, ".so", &so, &error) ||
        !named_blob(named, keys.weights, keys.shared_weights ? "weights index" : "weights", &weights,
                    &error) ||
        (!keys.extern_nodes.empty() &&
         !named_blob(named, keys.extern_nodes, "extern-node table", &externs, &error)))
      return fail(where, error, et::Error::InvalidProgram);
    std::vector<IndexEntry> index;
    if (mps && keys.shared_weights)  // as etmetal's runtime: the index is written for host only
      return fail(where, "an 'mps_emulated' delegate names a weights index; the shared-weights "
                         "layout is written for host delegates only", et::Error::InvalidProgram);
    if (keys.shared_weights && !parse_index((const char*)weights->data(), weights->size(), &index, &error))
      return fail(where, error, et::Error::InvalidProgram);
    std::string digest = delegate_digest(processed->data(), processed->size(), specs);
    std::string so_digest = key_digest(keys.so);
    // a bare .so digest vouches only for a host delegate nothing else steers (the target
    // chooses the device its code runs on, as in etmetal's runtime)
    bool so_alone = keys.extern_nodes.empty() && !mps;
    if (!is_trusted(digest, so_alone ? so_digest : ""))
      return fail(where, "the program contains native code (an AOTI .so, sha256 " + so_digest +
                             ") and running it gives the file your process's privileges. Load it "
                             "only if you trust where it came from, by one of: "
                             "etmetal.stock_runtime.register(trust_native_code=True); "
                             "etmetal.stock_runtime.register(trusted_blob_hashes=['" + digest +
                             "']) (this delegate's digest); ETMETAL_TRUSTED_BLOBS=" + digest +
                             "; ETMETAL_TRUST_NATIVE_CODE=1" +
                             (so_alone ? "" : "; the .so's own sha256 is not enough for this "
                                              "delegate: its extern-node table or target steers what the .so runs"),
                  et::Error::AccessFailed);
    // the table is parsed (and checked against the allow-list) before the .so is mapped: a
    // refused table never runs the .so's constructors
    etm_proxy* proxy = nullptr;
    if (externs) {
      proxy = parse_extern_nodes(externs->data(), externs->size(), &error);
      externs.reset();
      if (!proxy) return fail(where, error, et::Error::InvalidProgram);
    }
    processed->Free();
    Delegate* d = new Delegate();
    d->where = where;
    d->proxy = proxy;
    d->device = mps ? ETM_DEVICE_MPS : 0;
    if (proxy) etm_proxy_bind(d, proxy);
    live.push_back(d);
    std::string so_path;
    bool written = make_private_dir(&d->dir, &error) &&
                   write_private_file(d->dir, "delegate.so", so->data(), so->size(), &so_path, &error);
    so.reset();
    if (!written || !(d->lib = load_model(d->dir, so_path, &error)) ||
        !bind_aoti(d->lib, &d->api, &error)) {
      destroy_delegate(d);
      return fail(where, error, et::Error::AccessFailed);
    }
    etm_last_unbound = nullptr;  // what the container's creation reports is its own
    etm_check_message[0] = '\0';
    take_mps_error();
    int32_t rc = d->api.create(&d->container, 1, mps ? "mps" : "cpu", nullptr);
    if (rc) {
      d->container = nullptr;
      error = container_error(d->api, rc, "creating the model container");
    } else if ((rc = d->api.num_inputs(d->container, &d->n_in)) ||
               (rc = d->api.num_outputs(d->container, &d->n_out))) {
      error = container_error(d->api, rc, "reading the inputs and outputs");
    }
    bool ok = !rc;
    if (ok && keys.shared_weights) {
      ok = d->constants.lend_index(d->api, d->container, named, index, &error);
    } else if (ok && mps) {
      // one device image per program for the methods that name this blob; a layout the
      // probe cannot read keeps the container's own copy (upstream's behaviour)
      std::string why;
      bool share_buffers = false;
      for (const Spec& s : specs) share_buffers |= s.key == "share_mutable_buffers" && s.value == "1";
      ok = d->constants.share_device_blob(d->api, d->container, named, keys.weights, &weights,
                                          share_buffers, &why) ||
           (weights && d->constants.load_blob(d->api, d->container, std::move(weights), &error));
      if (!ok && error.empty()) error = why;
      else if (!why.empty()) ET_LOG(Info, "%s: weights not shared: %s", where.c_str(), why.c_str());
    } else if (ok) {
      ok = d->constants.load_blob(d->api, d->container, std::move(weights), &error);
    }
    // the Metal wrapper ignores the return codes of its mps calls (the constants' copies)
    std::string device_error = take_mps_error();
    if (ok && mps && (!device_error.empty() || etm_last_unbound)) {
      ok = false;
      error = "loading the constants on the emulated Metal device failed (" +
              (device_error.empty() ? std::string("shim ") + etm_last_unbound + " is not served natively"
                                    : device_error) + ")";
    }
    if (!ok) {
      destroy_delegate(d);
      return fail(where, error, et::Error::InvalidProgram);
    }
    d->images.resize(d->n_in);
    d->in_handles.resize(d->n_in);
    d->out_handles.resize(d->n_out);
    d->outs.resize(d->n_out);
    d->dsts.resize(d->n_out);
    return d;
  }

  et::Error execute(et::BackendExecutionContext& context, et::DelegateHandle* handle,
                    et::Span<et::EValue*> args) const override {
    std::lock_guard<std::mutex> guard(lock);
    Delegate* d = static_cast<Delegate*>(handle);
    if (!d || !d->container) return fail("MetalBackend", "executed after destroy", et::Error::InvalidState);
    if (args.size() != d->n_in + d->n_out)
      return fail(d->where, "called with " + std::to_string(args.size()) + " values, the .so takes " +
                                std::to_string(d->n_in) + " inputs and " + std::to_string(d->n_out) +
                                " outputs",
                  et::Error::InvalidArgument);
    std::string error;
    for (size_t i = 0; i < args.size(); i++)
      if (!describe_value(args[i], i, i < d->n_in ? &d->images[i] : nullptr,
                    i < d->n_in ? nullptr : &d->outs[i - d->n_in],
                    i < d->n_in ? nullptr : &d->dsts[i - d->n_in], &error))
        return fail(d->where, error, et::Error::InvalidArgument);
    for (size_t i = 0; i < d->n_in; i++) d->images[i].device_type = d->device;
    et::EventTracerEntry event =
        et::event_tracer_start_profiling_delegate(context.event_tracer(), "MetalBackend.execute",
                                                  et::kUnsetDelegateDebugIntId);
    etm_call call{reinterpret_cast<etm_container_run>(d->api.run), d->container, d->images.data(),
                  (int64_t)d->n_in, d->in_handles.data(), d->out_handles.data(), (int64_t)d->n_out,
                  d->outs.data(), d->dsts.data(), 0, 0, d->proxy ? (void*)d : nullptr};
    etm_last_unbound = nullptr;
    etm_check_message[0] = '\0';
    take_mps_error();
    current_tracer = context.event_tracer();
    int32_t rc = etm_run(&call);
    current_tracer = nullptr;
    open_events.clear();
    bool ok = rc == 0;
    // a failed Metal launch returns 1 to a wrapper that ignores it: the run must fail
    std::string device_error = d->device ? take_mps_error() : std::string();
    if (rc == ETM_NO_SLOT) error = "no native record is free for the inputs" + shim_context();
    else if (rc) error = container_error(d->api, rc, "running the model container");
    if (d->device && (!device_error.empty() || etm_last_unbound)) {
      ok = false;
      error = (rc ? error + "; " : std::string()) + "the emulated Metal device failed (" +
              (device_error.empty() ? std::string("shim ") + etm_last_unbound + " is not served natively"
                                    : device_error) + ")";
    }
    for (size_t j = 0; j < d->n_out; j++) {  // outputs etm_run could not copy as predicted
      void* h = d->out_handles[j];
      if (!h) continue;
      if (ok) ok = place_output(j, h, args[d->n_in + j]->toTensor(), d->device, &error);
      if (etm_native_delete_handle(h) != 0 && ok) {
        ok = false;
        error = "output " + std::to_string(j) + " (handle " + handle_hex(h) + ") is not a native tensor";
      }
      d->out_handles[j] = nullptr;
    }
    et::event_tracer_end_profiling_delegate(context.event_tracer(), event);
    return ok ? et::Error::Ok : fail(d->where, error, et::Error::Internal);
  }

  void destroy(et::DelegateHandle* handle) const override {
    std::lock_guard<std::mutex> guard(lock);
    if (handle) destroy_delegate(static_cast<Delegate*>(handle));
  }

};

MetalBackend backend;
const et::Error registered = et::register_backend({"MetalBackend", &backend});

}  // namespace

void set_error(const std::string& message) {
  // messages quote keys and names from the program, which may be any bytes; the pybind
  // module's log sink decodes each message as UTF-8 and aborts the process on bad bytes,
  // so only printable ASCII leaves here (anything else as \xNN)
  std::string text;
  for (unsigned char c : message) {
    if (c >= 0x20 && c < 0x7f) {
      text += (char)c;
    } else {
      char esc[5];
      std::snprintf(esc, sizeof(esc), "\\x%02x", c);
      text += esc;
    }
  }
  std::snprintf(last_error_text, sizeof(last_error_text), "%s", text.c_str());
  ET_LOG(Error, "%s", text.c_str());
}

std::string shim_context() {
  std::string out;
  if (etm_last_unbound) out += std::string("shim ") + etm_last_unbound + " is not served natively";
  if (etm_check_message[0]) out += (out.empty() ? "" : "; ") + std::string(etm_check_message);
  return out.empty() ? out : " (" + out + ")";
}

}  // namespace etm_stock

extern "C" {

int etm_stock_event_begin(const char* name) {
  et::EventTracer* tracer = etm_stock::current_tracer;
  if (!tracer) return 0;
  etm_stock::open_events.push_back(
      et::event_tracer_start_profiling_delegate(tracer, name, et::kUnsetDelegateDebugIntId));
  return 1;
}

void etm_stock_event_end(int began) {
  if (!began || !etm_stock::current_tracer || etm_stock::open_events.empty()) return;
  et::event_tracer_end_profiling_delegate(etm_stock::current_tracer, etm_stock::open_events.back());
  etm_stock::open_events.pop_back();
}

// the last failure's message ("" if none)
ETM_EXPORT const char* etm_stock_last_error() { return etm_stock::last_error_text; }

// 0 when "MetalBackend" was registered when this library was loaded
ETM_EXPORT int32_t etm_stock_registration() { return (int32_t)etm_stock::registered; }

// set up the native shims for a process with no Python (and with it): dtype sizes, limits,
// and libtorch's C shims from libtorch_cpu at `libtorch` (dlopen, RTLD_LOCAL); 0 or 1 (message
// in etm_stock_last_error). Repeatable: the same library path is configured again.
ETM_EXPORT int32_t etm_stock_configure(const char* libtorch) {
  std::lock_guard<std::mutex> guard(etm_stock::lock);
  // touch every record page now: handles cycle through the whole table (FIFO reuse), and
  // resident memory should not creep up over the first thousands of executes
  if (!etm_stock::configured) std::memset(etm_recs, 0, sizeof(etm_recs));
  for (const auto& row : etm_stock_itemsizes) etm_itemsize[row[0]] = (int8_t)row[1];
  etm_native_limit = etm_stock::kNativeLimit;
  etm_native_cache_limit = etm_stock::kCacheLimit;
  etm_native_views = etm_native_borrows = etm_native_fallbacks = 1;
  // the emulated Metal device's tensors are native records too (its memory is host memory)
  etm_native_mps_limit = etm_stock::kNativeLimit;
  for (int i = 0; i < 4; i++) etm_mps_conv_rule[i] = etm_stock_conv_rule[i];
  etm_int4_dot_rows = etm_stock_int4_dot_rows;
  etm_int4_tile_bytes = etm_stock_int4_tile_bytes;
  etm_stock::configure_mps_device();
  char real[PATH_MAX];
  void* lt = libtorch ? dlopen(libtorch, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!lt || !realpath(libtorch, real)) {
    const char* why = dlerror();
    etm_stock::set_error(std::string("etm_stock_configure: cannot load libtorch_cpu from ") +
                         (libtorch ? libtorch : "(null)") + ": " + (why ? why : "no such file"));
    return 1;
  }
  // the hand-written fallbacks' table, the one generated from torch's headers, the
  // emulated Metal device's
  const etm_lt_entry* tables[3] = {etm_lt_table, etm_lt_gen_table, etm_lt_mps_table};
  const int64_t counts[3] = {etm_lt_count, etm_lt_gen_count, etm_lt_mps_count};
  for (int k = 0; k < 3; k++)
    for (int64_t i = 0; i < counts[k]; i++) {
      void* fn = dlsym(lt, tables[k][i].name);
      if (!fn) {
        etm_stock::set_error(std::string("etm_stock_configure: ") + libtorch +
                             " does not export " + tables[k][i].name);
        return 1;
      }
      *tables[k][i].slot = fn;
    }
  etm_stock::libtorch_path = real;
  etm_stock::configured = true;
  return 0;
}

// live delegates, entries of the shared constant cache
ETM_EXPORT int64_t etm_stock_live_delegates() { return (int64_t)etm_stock::live.size(); }
ETM_EXPORT int64_t etm_stock_shared_entries() { return etm_stock::shared_entries(); }

// one line per constant lent by a live delegate: "<where>\t<name>\t<key>\t<address>\t<mutable>";
// returns the bytes the whole text needs (written up to cap, NUL-terminated when it fits)
ETM_EXPORT int64_t etm_stock_describe(char* buf, int64_t cap) {
  std::lock_guard<std::mutex> guard(etm_stock::lock);
  std::string text;
  for (etm_stock::Delegate* d : etm_stock::live)
    for (const etm_stock::Lent& c : d->constants.lent())
      text += d->where + "\t" + c.name + "\t" + c.key + "\t" +
              std::to_string((uintptr_t)c.data) + "\t" + (c.mutable_ ? "1" : "0") + "\n";
  if (buf && cap > (int64_t)text.size()) std::memcpy(buf, text.c_str(), text.size() + 1);
  return (int64_t)text.size() + 1;
}

}  // extern "C"
