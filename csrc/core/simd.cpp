#include "core/simd.h"

#include <initializer_list>

namespace sssd {

bool isa_supported(Isa isa) {
#if SSSD_X86
  __builtin_cpu_init();
  if (isa == Isa::kAvx512) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }
  if (isa == Isa::kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == Isa::kGeneric || isa == Isa::kBest;
}

Isa best_isa() {
  static const Isa best = [] {
    for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
      if (isa_supported(isa)) return isa;
    }
    return Isa::kGeneric;
  }();
  return best;
}

}  // namespace sssd
