// Element-wise reduction kernels of the shared-memory fabric (plain loops GCC vectorizes).
#pragma once

#include <cstddef>
#include <cstdint>

namespace halshm {

// Whether reduce_n handles this dtype x op. Integer and bool AVG are refused (as gloo does);
// bitwise ops exist for integers and bool only.
bool reduce_supported(int32_t dtype, int32_t op);

// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], always in rank order so that the same
// inputs give the same bits on every rank. AVG is the sum divided by n. float16/bfloat16 accumulate
// in float32 and round once. `dst2`, if not null, receives the same values. dst and dst2 may alias a
// source exactly (same address): each block is read completely before it is written.
void reduce_n(void* dst, void* dst2, const void* const* srcs, int n, size_t count, int32_t dtype,
              int32_t op);

}  // namespace halshm
