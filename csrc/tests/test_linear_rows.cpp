// linear_rows: y = x · wᵀ (+ bias) against the double-accumulating reference, for every instruction set
// this CPU runs, at row counts around the kernel's blocks (4 rows, 4 weight rows) and depths that are not
// a multiple of the vector width, with and without bias, strided x and y, one and several threads.
#include <cmath>
#include <string>
#include <vector>

#include "check.h"
#include "core/linear_rows.h"

namespace {

float uniform(sssd_test::Rng& rng) { return static_cast<float>(rng.below(2001)) / 1000.0f - 1.0f; }

// Largest |y - ref| relative to the sum of |x|·|w| of the dot product (the scale of rounding errors).
double worst_error(sssd::Isa isa, int64_t rows, int64_t depth, int64_t cols, bool bias, int threads,
                   uint64_t seed) {
  sssd_test::Rng rng(seed);
  const int64_t xs = depth + 3, ys = cols + 5;  // strided rows: the kernel must honour the strides
  std::vector<float> x(rows * xs), w(cols * depth), b(cols), y(rows * ys, -7.0f), ref(rows * ys, -7.0f);
  for (auto& v : x) v = uniform(rng);
  for (auto& v : w) v = uniform(rng);
  for (auto& v : b) v = uniform(rng);
  sssd::LinearRows a{x.data(), w.data(), bias ? b.data() : nullptr, y.data(), rows, depth, cols, xs, ys};
  sssd::linear_rows(a, threads, isa);
  sssd::LinearRows r = a;
  r.y = ref.data();
  sssd::linear_rows_reference(r);
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < ys; ++c) {
      const double got = y[i * ys + c], want = ref[i * ys + c];
      if (c >= cols) {  // past the row's columns: untouched
        if (got != -7.0) return 1e9;
        continue;
      }
      double scale = bias ? std::fabs(b[c]) : 0.0;
      for (int64_t k = 0; k < depth; ++k) scale += std::fabs(x[i * xs + k] * w[c * depth + k]);
      worst = std::max(worst, std::fabs(got - want) / std::max(scale, 1e-30));
    }
  }
  return worst;
}

}  // namespace

TEST(linear_rows_matches_the_reference) {
  const sssd::Isa isas[] = {sssd::Isa::kBest, sssd::Isa::kGeneric, sssd::Isa::kAvx2,
                                  sssd::Isa::kAvx512};
  uint64_t seed = 1;
  for (sssd::Isa isa : isas) {
    if (!sssd::isa_supported(isa)) continue;
    for (int64_t rows : {1, 2, 3, 4, 5, 8, 9, 17}) {
      for (int64_t depth : {1, 15, 16, 17, 64, 100}) {
        for (int64_t cols : {1, 3, 4, 7, 33}) {
          for (int threads : {1, 3}) {
            const double err = worst_error(isa, rows, depth, cols, (rows + cols) % 2 == 0, threads, seed++);
            if (!(err < 1e-5)) {
              sssd_test::fail(__FILE__, __LINE__,
                              "isa " + std::to_string(int(isa)) + " rows " + std::to_string(rows) + " depth " +
                                  std::to_string(depth) + " cols " + std::to_string(cols) + ": relative error " +
                                  std::to_string(err));
            }
          }
        }
      }
    }
  }
}

TEST(linear_rows_large_layers_split_into_tiles) {
  // more weight rows than one tile holds, on several threads: every tile written once, correctly
  CHECK(worst_error(sssd::Isa::kBest, 6, 576, 1000, true, 4, 99) < 1e-5);
}

TEST(linear_rows_empty_inputs_write_nothing) {
  std::vector<float> y(4, 3.0f);
  const float x = 1.0f, w = 1.0f;
  sssd::linear_rows({&x, &w, nullptr, y.data(), 0, 1, 1, 1, 1}, 1);
  sssd::linear_rows({&x, &w, nullptr, y.data(), 1, 1, 0, 1, 1}, 1);
  for (float v : y) CHECK(v == 3.0f);
}

TEST(linear_rows_isa_support) {
  CHECK(sssd::isa_supported(sssd::Isa::kBest));
  CHECK(sssd::isa_supported(sssd::Isa::kGeneric));
  if (sssd::isa_supported(sssd::Isa::kAvx512)) CHECK(sssd::isa_supported(sssd::Isa::kAvx2));
}
