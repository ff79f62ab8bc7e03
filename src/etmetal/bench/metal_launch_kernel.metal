// `etmetal bench metal`'s trivial kernel: the least work a launch can carry.
#include <metal_stdlib>
using namespace metal;

kernel void add_one(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                    constant long& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  if (i < n) out[i] = in[i] + 1.0f;
}
