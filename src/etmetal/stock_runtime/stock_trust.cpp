// Integrity and trust of a Metal delegate, as etmetal's Python runtime decides them
// (runtime/metal_delegate.py): every blob is checked against the sha256 in its key, and
// native code runs only when trusted through the delegate digest, or through the bare
// .so digest for a host delegate without an extern-node table.
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "etmetal_stock.h"
#include "stock_backend.h"

namespace etm_stock {
namespace {

const char kDigestDomain[] = "etmetal MetalBackend delegate v1";  // + its NUL, as Python's

std::string hex(const unsigned char* d, unsigned n) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (unsigned i = 0; i < n; i++) {
    out[2 * i] = digits[d[i] >> 4];
    out[2 * i + 1] = digits[d[i] & 15];
  }
  return out;
}

void put(EVP_MD_CTX* ctx, const void* data, size_t n) {
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));  // little-endian
  EVP_DigestUpdate(ctx, len, 8);
  EVP_DigestUpdate(ctx, data, n);
}

std::string lower_stripped(std::string s) {
  auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && space(s.back())) s.pop_back();
  size_t i = 0;
  while (i < s.size() && space(s[i])) i++;
  s = s.substr(i);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// a trusted entry as given ("<digest>", or a blob key naming one) -> the digest
std::string normalized(const std::string& raw) {
  std::string h = lower_stripped(raw);
  std::string d = key_digest(h);
  return d.empty() ? h : d;
}

std::mutex policy_lock;
bool policy_trust_all = false;
std::set<std::string> policy_hashes;

}  // namespace

std::string sha256_hex(const void* data, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr)) return "";
  return hex(md, len);
}

std::string key_digest(const std::string& key) {
  if (key.size() <= 64 || key[64] != '_') return "";
  for (size_t i = 0; i < 64; i++) {
    char c = key[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return "";
  }
  return key.substr(0, 64);
}

std::string delegate_digest(const void* processed, size_t n, const std::vector<Spec>& specs) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx) return "";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  bool ok = EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) &&
            EVP_DigestUpdate(ctx, kDigestDomain, sizeof(kDigestDomain));
  if (ok) {
    put(ctx, processed, n);
    for (const Spec& s : specs) {
      put(ctx, s.key.data(), s.key.size());
      put(ctx, s.value.data(), s.value.size());
    }
    ok = EVP_DigestFinal_ex(ctx, md, &len);
  }
  EVP_MD_CTX_free(ctx);
  return ok ? hex(md, len) : "";
}

bool is_trusted(const std::string& digest, const std::string& so_digest) {
  std::set<std::string> allowed;
  {
    std::lock_guard<std::mutex> guard(policy_lock);
    if (policy_trust_all) return true;
    allowed = policy_hashes;
  }
  if (const char* env = std::getenv("ETMETAL_TRUSTED_BLOBS")) {
    std::string raw(env);
    size_t start = 0;
    while (start <= raw.size()) {
      size_t comma = raw.find(',', start);
      std::string item = raw.substr(start, comma == std::string::npos ? std::string::npos
                                                                      : comma - start);
      if (!item.empty()) allowed.insert(normalized(item));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (allowed.count(digest) || (!so_digest.empty() && allowed.count(so_digest))) return true;
  const char* all = std::getenv("ETMETAL_TRUST_NATIVE_CODE");
  if (!all) return false;
  std::string v = lower_stripped(all);
  return v == "1" || v == "true" || v == "yes";
}

}  // namespace etm_stock

// the policy etmetal.stock_runtime.register sets (each call replaces the previous one);
// hashes: comma-separated delegate or .so digests (or blob keys naming them)
extern "C" ETM_EXPORT void etm_stock_set_policy(int32_t trust_native_code, const char* hashes) {
  std::set<std::string> parsed;
  std::string raw(hashes ? hashes : "");
  size_t start = 0;
  while (start <= raw.size()) {
    size_t comma = raw.find(',', start);
    std::string item =
        raw.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) parsed.insert(etm_stock::normalized(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::lock_guard<std::mutex> guard(etm_stock::policy_lock);
  etm_stock::policy_trust_all = trust_native_code != 0;
  etm_stock::policy_hashes.swap(parsed);
}
