// tree_attention_cpu against its double-precision reference: several requests of different context lengths
// and tree shapes (random ancestor masks), grouped-query heads, head dims that are and are not a multiple
// of the vector width, strided queries and outputs, every instruction set this CPU runs, 1 and 3 threads.
#include <cmath>
#include <string>
#include <vector>

#include "check.h"
#include "core/tree_attention_cpu.h"

namespace {

float uniform(sssd_test::Rng& rng) { return static_cast<float>(rng.below(2001)) / 1000.0f - 1.0f; }

double worst_error(sssd::Isa isa, int64_t heads, int64_t kv_heads, int64_t dim, int threads, uint64_t seed) {
  sssd_test::Rng rng(seed);
  const std::vector<int64_t> sizes{1, 5, 3, 70};
  const std::vector<int32_t> ctx{7, 0, 40, 13}, slots{2, 0, 3, 1};
  std::vector<int64_t> offsets{0};
  for (int64_t s : sizes) offsets.push_back(offsets.back() + s);
  const int64_t n = offsets.back(), cache_slots = 4, rows = 48, batch = 4;
  const int64_t q_head = dim + 2, q_node = heads * q_head;  // padded rows: strides honoured
  std::vector<float> q(n * q_node), kt(n * kv_heads * dim), vt(n * kv_heads * dim);
  std::vector<float> kc(cache_slots * kv_heads * rows * dim), vc(kc.size());
  for (auto* v : {&q, &kt, &vt, &kc, &vc}) {
    for (auto& x : *v) x = uniform(rng);
  }
  std::vector<uint64_t> masks(n * 2, 0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < sizes[b]; ++t) {  // a random tree: the parent of node t is a node before it
      uint64_t* row = &masks[(offsets[b] + t) * 2];
      row[t >> 6] |= uint64_t(1) << (t & 63);
      if (t > 0) {
        const int64_t parent = static_cast<int64_t>(rng.below(t));
        const uint64_t* up = &masks[(offsets[b] + parent) * 2];
        row[0] |= up[0];
        row[1] |= up[1];
      }
    }
  }
  const int64_t out_node = heads * dim + 3;
  std::vector<float> out(n * out_node, -5.0f), ref(n * out_node, -5.0f);
  sssd::TreeAttentionCpu a{q.data(), q_node, q_head, out.data(), out_node, dim,
                           kt.data(), kv_heads * dim, dim, vt.data(), kv_heads * dim, dim,
                           kc.data(), vc.data(), kv_heads * rows * dim, rows * dim, dim,
                           offsets.data(), ctx.data(), slots.data(), masks.data(),
                           batch, heads, kv_heads, dim, 1.0f / std::sqrt(float(dim))};
  sssd::tree_attention_cpu(a, threads, isa);
  sssd::TreeAttentionCpu r = a;
  r.out = ref.data();
  sssd::tree_attention_cpu_reference(r);
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(double(out[i]) - ref[i]));
  return worst;
}

}  // namespace

TEST(tree_attention_cpu_matches_the_reference) {
  for (sssd::Isa isa : {sssd::Isa::kBest, sssd::Isa::kGeneric, sssd::Isa::kAvx2, sssd::Isa::kAvx512}) {
    if (!sssd::isa_supported(isa)) continue;
    uint64_t seed = 7;
    for (int64_t dim : {64, 8, 20, 128}) {
      for (auto heads : {std::pair<int64_t, int64_t>{4, 4}, {6, 2}, {9, 3}}) {
        for (int threads : {1, 3}) {
          const double err = worst_error(isa, heads.first, heads.second, dim, threads, seed++);
          if (!(err < 2e-5)) {
            sssd_test::fail(__FILE__, __LINE__, "isa " + std::to_string(int(isa)) + " dim " + std::to_string(dim) +
                                                    " heads " + std::to_string(heads.first) + ": error " +
                                                    std::to_string(err));
          }
        }
      }
    }
  }
}
