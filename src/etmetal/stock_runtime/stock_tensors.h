// The stock runtime's tensors as native records and back (stock_tensors.cpp).
#ifndef ETMETAL_STOCK_TENSORS_H
#define ETMETAL_STOCK_TENSORS_H

#include <executorch/runtime/core/evalue.h>

#include <string>

#include "native_tensors.h"

namespace etm_stock {

std::string handle_hex(const void* p);
// value i as a record image (an input: image set) or as the geometry etm_run copies into
// (an output: out and dst set); false with *error naming the value
bool describe_value(executorch::runtime::EValue* v, size_t i, etm_rec* image, etm_out* out,
                    int64_t* dst, std::string* error);
// copy output j's record (handle h) into its planned tensor t, resizing a dynamic output
bool place_output(size_t j, void* h, executorch::aten::Tensor t, int32_t device,
                  std::string* error);

}  // namespace etm_stock

#endif  // ETMETAL_STOCK_TENSORS_H
