#include "runner_options.h"

#include <cstdio>
#include <cstdlib>

namespace etmetal_runner {

namespace {

void usage() {
  std::fprintf(
      stderr,
      "usage: etmetal_runner PROGRAM.pte [--data FILE.ptd]... [--backend-lib LIB.so]...\n"
      "  [--method NAME] [--input FILE]... [--generate-inputs ones|seed:N]\n"
      "  [--iterations N] [--output-dir DIR] [--etdump FILE] [--dump-maps FILE]\n"
      "  [--loader file|mmap] [--list-operators] [--list-backends] [--describe]\n"
      "  [--libtorch-cpu PATH] [--proxy-lib PATH]\n"
      "--input files hold the raw bytes of each tensor input, in order, laid out as the\n"
      "method's input spec says; without them inputs are generated (default: ones).\n"
      "--describe prints the method's input specs as JSON and runs nothing.\n"
      "--libtorch-cpu names the libtorch_cpu a backend library's native fallbacks call\n"
      "(handed to each --backend-lib exporting etm_stock_configure).\n"
      "--proxy-lib names etmetal's proxy library (libetmetal_proxy.so), which runs the\n"
      "operators of a delegate's extern-node table (handed to each --backend-lib exporting\n"
      "etm_stock_configure_proxy).\n");
}

} // namespace

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "etmetal_runner: %s\n", message.c_str());
  return code;
}

// Parses argv into `o`; returns kOk or kUsage (with the reason printed).
int parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) {
        return false;
      }
      *out = argv[++i];
      return true;
    };
    std::string v;
    bool ok = true;
    if (a == "--list-operators") {
      o->list_operators = true;
    } else if (a == "--list-backends") {
      o->list_backends = true;
    } else if (a == "--describe") {
      o->describe = true;
    } else if (a.rfind("--", 0) != 0) {
      if (!o->program.empty()) {
        return fail(ExitCode::kUsage, "two programs given: " + o->program + " and " + a);
      }
      o->program = a;
    } else if (!(ok = value(&v))) {
      // falls through to the error below
    } else if (a == "--data") {
      o->data_files.push_back(v);
    } else if (a == "--backend-lib") {
      o->backend_libs.push_back(v);
    } else if (a == "--libtorch-cpu") {
      o->libtorch_cpu = v;
    } else if (a == "--proxy-lib") {
      o->proxy_lib = v;
    } else if (a == "--method") {
      o->method = v;
    } else if (a == "--input") {
      o->inputs.push_back(v);
    } else if (a == "--output-dir") {
      o->output_dir = v;
    } else if (a == "--etdump") {
      o->etdump = v;
    } else if (a == "--dump-maps") {
      o->dump_maps = v;
    } else if (a == "--loader") {
      ok = v == "file" || v == "mmap";
      o->mmap = v == "mmap";
    } else if (a == "--iterations") {
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      ok = *end == '\0' && n >= 1 && n <= 1000000000L;
      o->iterations = static_cast<int>(n);
    } else if (a == "--generate-inputs") {
      etmetal_runner::Generator g;
      if (v.rfind("seed:", 0) == 0) {
        char* end = nullptr;
        g.ones = false;
        g.seed = std::strtoull(v.c_str() + 5, &end, 10);
        ok = v.size() > 5 && *end == '\0';
      } else {
        ok = v == "ones";
      }
      o->generator = g;
    } else {
      usage();
      return fail(ExitCode::kUsage, "unknown option " + a);
    }
    if (!ok) {
      usage();
      return fail(ExitCode::kUsage, "bad or missing value for " + a);
    }
  }
  if (o->program.empty() && !o->list_operators && !o->list_backends) {
    usage();
    return fail(ExitCode::kUsage, "no program given");
  }
  if (o->generator && !o->inputs.empty()) {
    return fail(ExitCode::kUsage, "give --input files or --generate-inputs, not both");
  }
  return ExitCode::kOk;
}

} // namespace etmetal_runner
