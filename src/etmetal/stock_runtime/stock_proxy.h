// The stock backend's proxy executor (stock_proxy.cpp): extern-node tables parsed by the
// proxy library loaded with etm_stock_configure_proxy.
#ifndef ETMETAL_STOCK_PROXY_H
#define ETMETAL_STOCK_PROXY_H

#include <cstddef>
#include <string>

#include "proxy_host.h"

namespace etm_stock {
// the table's calls, or NULL with *error saying why (no proxy library, a refused table)
etm_proxy* parse_extern_nodes(const void* data, size_t n, std::string* error);
void free_extern_nodes(etm_proxy* p);
}  // namespace etm_stock

extern "C" int etm_stock_proxy_call(void* handle, int64_t index, int64_t num_ints,
                                    const int64_t* ints, int64_t num_tensors, void* const* tensors);

#endif  // ETMETAL_STOCK_PROXY_H
