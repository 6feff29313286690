// Portable vectors for the CPU kernels (linear_rows, tree_attention_cpu): GCC vector types of 4, 8 or 16
// floats, helpers that are always inlined into the instruction-set-specific entry points, and the choice
// of the widest instruction set this CPU runs (asked of the CPU itself). A kernel is written once as a
// template over the vector type; each ISA gets an entry point compiled with `target(...)`.
#pragma once
#include <cstdint>
#include <cstring>

// The 32- and 64-byte vector helpers are always inlined into the ISA-specific entry points; GCC still
// notes that passing such vectors to an out-of-line function would depend on the ISA, which never happens.
#pragma GCC diagnostic ignored "-Wpsabi"

#define SSSD_INLINE __attribute__((always_inline)) inline
#if defined(__x86_64__) && defined(__GNUC__)
#define SSSD_X86 1
#define SSSD_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define SSSD_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define SSSD_X86 0
#endif

namespace sssd {

// The instruction sets the CPU kernels have code for; kBest is the widest this CPU runs.
enum class Isa { kBest = 0, kGeneric = 1, kAvx2 = 2, kAvx512 = 3 };

// Whether this CPU runs `isa` (kBest and kGeneric always).
bool isa_supported(Isa isa);

// The widest instruction set this CPU runs (never kBest).
Isa best_isa();

namespace simd {

typedef float vf16 __attribute__((vector_size(64)));  // one AVX-512 register
typedef float vf8 __attribute__((vector_size(32)));   // one AVX2 register
typedef float vf4 __attribute__((vector_size(16)));   // one SSE register
typedef int32_t vi16 __attribute__((vector_size(64)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef int32_t vi4 __attribute__((vector_size(16)));

template <class V>
struct Traits;
template <>
struct Traits<vf16> {
  using Int = vi16;
};
template <>
struct Traits<vf8> {
  using Int = vi8;
};
template <>
struct Traits<vf4> {
  using Int = vi4;
};

template <class V>
constexpr int lanes() {
  return sizeof(V) / sizeof(float);
}

template <class V>
SSSD_INLINE V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class V>
SSSD_INLINE void store(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

template <class V>
SSSD_INLINE V splat(float x) {
  return V{} + x;
}

// Sums of a vector's lanes as a tree of additions (log2(lanes) dependent steps, not lanes).
SSSD_INLINE float hsum(vf4 v) { return (v[0] + v[2]) + (v[1] + v[3]); }
SSSD_INLINE float hsum(vf8 v) {
  return hsum(__builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
SSSD_INLINE float hsum(vf16 v) {
  return hsum(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
              __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

SSSD_INLINE float hmax(vf4 v) {
  const float a = v[0] > v[1] ? v[0] : v[1], b = v[2] > v[3] ? v[2] : v[3];
  return a > b ? a : b;
}
SSSD_INLINE float hmax(vf8 v) {
  const vf4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3), b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return hmax(a > b ? a : b);
}
SSSD_INLINE float hmax(vf16 v) {
  const vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const vf8 b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return hmax(a > b ? a : b);
}

// e^x for x <= 0 (softmax weights after subtracting the row maximum), about 1 ulp: x = n·ln2 + r with
// |r| <= ln2/2, e^r from a degree-6 polynomial, 2^n put into the exponent bits. Below -87.3 (where e^x
// leaves float's normal range) the result is that of -87.3, about 1e-38; callers zero masked entries
// themselves.
template <class V>
SSSD_INLINE V exp_nonpositive(V x) {
  using I = typename Traits<V>::Int;
  x = x < splat<V>(-87.3f) ? splat<V>(-87.3f) : x;
  const V t = x * 1.44269504088896341f + 0.5f;
  V n = __builtin_convertvector(__builtin_convertvector(t, I), V);  // truncation toward zero
  n = n > t ? n - 1.0f : n;                                         // ... made a floor
  const V r = x - n * 0.693359375f - n * -2.12194440e-4f;
  V p = splat<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I e = (__builtin_convertvector(n, I) + 127) << 23;
  V scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

}  // namespace simd
}  // namespace sssd
