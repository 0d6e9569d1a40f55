// Reduction kernels: one templated loop nest per dtype x op, accumulated block by block in a small
// on-stack buffer that stays in L1. Written as simple indexed loops over non-aliasing pointers so
// GCC vectorizes them at -O3; where the compiler supports it, the dispatcher is also cloned for AVX2
// and picked at load time (no -march=native: the wheel must run on any x86-64).
#include "shm_reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shm_common.h"

namespace halshm {
namespace {

#define HAL_INLINE inline __attribute__((always_inline))

HAL_INLINE uint32_t f2u(float f) { return __builtin_bit_cast(uint32_t, f); }
HAL_INLINE float u2f(uint32_t u) { return __builtin_bit_cast(float, u); }

// IEEE half <-> float without branches or F16C (so it vectorizes on baseline x86-64 and ARM):
// the exponent is rebased with integer arithmetic and normals/subnormals are told apart by a
// select. Rounding is to nearest even, matching torch's c10::Half.
HAL_INLINE float f16_to_f32(uint16_t h) {
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // normal numbers: shift the exponent+mantissa into float position and rescale by 2^-112
  const float normalized = u2f((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // subnormals: build 0.5 + m*2^-24 style value and subtract the magic bias
  const float denormalized = u2f((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = sign | (two_w < (1u << 27) ? f2u(denormalized) : f2u(normalized));
  return u2f(r);
}

HAL_INLINE uint16_t f32_to_f16(float f) {
  // Scaling up then down lets the FPU do round-to-nearest-even at half precision.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = f2u(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = u2f((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = f2u(base);
  const uint32_t nonsign = ((b >> 13) & 0x00007C00u) + (b & 0x00000FFFu);
  return uint16_t((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));  // NaN -> qNaN
}

HAL_INLINE float bf16_to_f32(uint16_t h) { return u2f(uint32_t(h) << 16); }

HAL_INLINE uint16_t f32_to_bf16(float f) {
  // Round to nearest even as c10::BFloat16 does; NaN becomes the canonical quiet NaN.
  const uint32_t u = f2u(f);
  const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
  return f != f ? uint16_t(0x7FC0) : uint16_t(rounded);
}

// ---- element conversions: storage type T <-> accumulator A ----
template <class T, class A>
struct Same {
  using Acc = A;
  static HAL_INLINE A load(T x) { return A(x); }
  static HAL_INLINE T store(A a) { return T(a); }
};
struct Half {
  using Acc = float;
  static HAL_INLINE float load(uint16_t x) { return f16_to_f32(x); }
  static HAL_INLINE uint16_t store(float a) { return f32_to_f16(a); }
};
struct BHalf {
  using Acc = float;
  static HAL_INLINE float load(uint16_t x) { return bf16_to_f32(x); }
  static HAL_INLINE uint16_t store(float a) { return f32_to_bf16(a); }
};
struct Bool {  // any non-zero byte is true; results are 0/1
  using Acc = uint8_t;
  static HAL_INLINE uint8_t load(uint8_t x) { return uint8_t(x != 0); }
  static HAL_INLINE uint8_t store(uint8_t a) { return a; }
};

// ---- ops. MAX/MIN propagate NaN and, on ties (+0 vs -0), keep the first operand, as
// torch.maximum/minimum do. ----
struct Sum { template <class A> static HAL_INLINE A f(A a, A b) { return A(a + b); } };
struct Prod { template <class A> static HAL_INLINE A f(A a, A b) { return A(a * b); } };
struct Max { template <class A> static HAL_INLINE A f(A a, A b) { return (b > a || b != b) ? b : a; } };
struct Min { template <class A> static HAL_INLINE A f(A a, A b) { return (b < a || b != b) ? b : a; } };
struct Band { template <class A> static HAL_INLINE A f(A a, A b) { return A(a & b); } };
struct Bor { template <class A> static HAL_INLINE A f(A a, A b) { return A(a | b); } };
struct Bxor { template <class A> static HAL_INLINE A f(A a, A b) { return A(a ^ b); } };

constexpr size_t kBlockBytes = 8192;

template <class T, class Cvt, class Op, bool Avg>
HAL_INLINE void reduce_impl(void* dst_v, void* dst2_v, const void* const* srcs_v, int n, size_t count) {
  using A = typename Cvt::Acc;
  constexpr size_t B = kBlockBytes / sizeof(A);
  alignas(64) A acc[B];
  T* dst = static_cast<T*>(dst_v);
  T* dst2 = static_cast<T*>(dst2_v);
  for (size_t base = 0; base < count; base += B) {
    const size_t m = std::min(B, count - base);
    {
      const T* __restrict s0 = static_cast<const T*>(srcs_v[0]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = Cvt::load(s0[i]);
    }
    for (int r = 1; r < n; ++r) {
      const T* __restrict s = static_cast<const T*>(srcs_v[r]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = Op::f(acc[i], Cvt::load(s[i]));
    }
    if (Avg) {
      const A dn = A(n);
      for (size_t i = 0; i < m; ++i) acc[i] = acc[i] / dn;
    }
    {
      T* __restrict d = dst + base;
      for (size_t i = 0; i < m; ++i) d[i] = Cvt::store(acc[i]);
    }
    if (dst2 && dst2 != dst) std::memcpy(dst2 + base, dst + base, m * sizeof(T));
  }
}

template <class T, class Cvt>
HAL_INLINE bool float_ops(int32_t op, void* d, void* d2, const void* const* s, int n, size_t c) {
  switch (op) {
    case kSum: reduce_impl<T, Cvt, Sum, false>(d, d2, s, n, c); return true;
    case kAvg: reduce_impl<T, Cvt, Sum, true>(d, d2, s, n, c); return true;
    case kProd: reduce_impl<T, Cvt, Prod, false>(d, d2, s, n, c); return true;
    case kMax: reduce_impl<T, Cvt, Max, false>(d, d2, s, n, c); return true;
    case kMin: reduce_impl<T, Cvt, Min, false>(d, d2, s, n, c); return true;
    default: return false;
  }
}

// Integers: SUM and PRODUCT run in the unsigned type of the same width, so overflow wraps as in
// torch (and without signed-overflow undefined behaviour); MAX/MIN compare in the signed type.
template <class T, class U>
HAL_INLINE bool int_ops(int32_t op, void* d, void* d2, const void* const* s, int n, size_t c) {
  switch (op) {
    case kSum: reduce_impl<T, Same<T, U>, Sum, false>(d, d2, s, n, c); return true;
    case kProd: reduce_impl<T, Same<T, U>, Prod, false>(d, d2, s, n, c); return true;
    case kMax: reduce_impl<T, Same<T, T>, Max, false>(d, d2, s, n, c); return true;
    case kMin: reduce_impl<T, Same<T, T>, Min, false>(d, d2, s, n, c); return true;
    case kBand: reduce_impl<T, Same<T, U>, Band, false>(d, d2, s, n, c); return true;
    case kBor: reduce_impl<T, Same<T, U>, Bor, false>(d, d2, s, n, c); return true;
    case kBxor: reduce_impl<T, Same<T, U>, Bxor, false>(d, d2, s, n, c); return true;
    default: return false;
  }
}

HAL_INLINE bool bool_ops(int32_t op, void* d, void* d2, const void* const* s, int n, size_t c) {
  switch (op) {  // logical: sum/max/bor = any, product/min/band = all
    case kSum: case kMax: case kBor: reduce_impl<uint8_t, Bool, Bor, false>(d, d2, s, n, c); return true;
    case kProd: case kMin: case kBand: reduce_impl<uint8_t, Bool, Band, false>(d, d2, s, n, c); return true;
    case kBxor: reduce_impl<uint8_t, Bool, Bxor, false>(d, d2, s, n, c); return true;
    default: return false;
  }
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(HAL_SHM_NO_CLONES)
#define HAL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HAL_CLONES
#endif

HAL_CLONES bool dispatch(void* d, void* d2, const void* const* s, int n, size_t c, int32_t dtype,
                         int32_t op) {
  switch (dtype) {
    case kF32: return float_ops<float, Same<float, float>>(op, d, d2, s, n, c);
    case kF64: return float_ops<double, Same<double, double>>(op, d, d2, s, n, c);
    case kF16: return float_ops<uint16_t, Half>(op, d, d2, s, n, c);
    case kBF16: return float_ops<uint16_t, BHalf>(op, d, d2, s, n, c);
    case kI8: return int_ops<int8_t, uint8_t>(op, d, d2, s, n, c);
    case kU8: return int_ops<uint8_t, uint8_t>(op, d, d2, s, n, c);
    case kI16: return int_ops<int16_t, uint16_t>(op, d, d2, s, n, c);
    case kI32: return int_ops<int32_t, uint32_t>(op, d, d2, s, n, c);
    case kI64: return int_ops<int64_t, uint64_t>(op, d, d2, s, n, c);
    case kBool: return bool_ops(op, d, d2, s, n, c);
    default: return false;
  }
}

}  // namespace

bool reduce_supported(int32_t dtype, int32_t op) {
  const bool is_float = dtype == kF32 || dtype == kF64 || dtype == kF16 || dtype == kBF16;
  const bool is_int = dtype == kI8 || dtype == kU8 || dtype == kI16 || dtype == kI32 || dtype == kI64;
  switch (op) {
    case kSum: case kMax: case kMin: case kProd: return is_float || is_int || dtype == kBool;
    case kAvg: return is_float;
    case kBand: case kBor: case kBxor: return is_int || dtype == kBool;
    default: return false;
  }
}

void reduce_n(void* dst, void* dst2, const void* const* srcs, int n, size_t count, int32_t dtype,
              int32_t op) {
  if (count == 0) return;
  if (!reduce_supported(dtype, op) || !dispatch(dst, dst2, srcs, n, count, dtype, op)) {
    throw ShmFailure(kUnsupported, std::string("shm reduce: op ") + redop_name(op) + " is not supported for dtype " +
                                       dtype_name(dtype));
  }
}

}  // namespace halshm
