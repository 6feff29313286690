// Checks the tree attention kernel's decomposition (host emulation: row tiles, 64-key tiles, context
// splits, online softmax, log-sum-exp merge) against a float64 reference, on random packed batches with
// real ancestor masks, padded strides, permuted cache slots and odd sizes. Plain main(): no framework.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/tree_attention_emulate.h"
#include "cuda/tree_attention_math.h"

using namespace sssd_cuda;

static int g_failures = 0;
#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      ++g_failures;                                         \
      std::fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);  \
      std::fprintf(stderr, __VA_ARGS__);                    \
      std::fprintf(stderr, "\n");                           \
    }                                                       \
  } while (0)

struct Case {
  std::vector<int> nodes, ctx;
  int hq, hkv, d;
  bool force_small_chunks;
  bool empty_masks;  // rows with no tree key at all (tests the empty-row guards)
};

struct Batch {
  int64_t n = 0, max_ctx = 0, slots = 0, rows = 0, pad = 0;
  std::vector<int64_t> offsets;
  std::vector<int32_t> ctx, slot;
  std::vector<uint64_t> masks;
  std::vector<float> q, kt, vt, kc, vc, out;
};

static Batch make_batch(const Case& c, std::mt19937& rng) {
  Batch b;
  std::normal_distribution<float> nd(0.f, 1.f);
  const int B = static_cast<int>(c.nodes.size());
  b.offsets.push_back(0);
  for (int i = 0; i < B; ++i) b.offsets.push_back(b.offsets.back() + c.nodes[i]);
  b.n = b.offsets.back();
  for (int x : c.ctx) b.max_ctx = std::max<int64_t>(b.max_ctx, x);
  b.ctx.assign(c.ctx.begin(), c.ctx.end());
  b.slots = B + 2;
  b.rows = b.max_ctx + 3;
  b.pad = 8;  // extra elements per token row: strides are not the dense ones
  for (int i = 0; i < B; ++i) b.slot.push_back((i * 5 + 1) % static_cast<int>(b.slots));
  // a permutation of slots when B + 2 is not a multiple of 5; otherwise distinct anyway for the sizes used
  b.masks.assign(b.n * kMaskWords, 0);
  for (int i = 0; i < B; ++i) {
    std::vector<int> parent(c.nodes[i], -1);
    for (int j = 1; j < c.nodes[i]; ++j) parent[j] = static_cast<int>(rng() % j);
    for (int j = 0; j < c.nodes[i]; ++j) {
      uint64_t* m = &b.masks[(b.offsets[i] + j) * kMaskWords];
      if (c.empty_masks && j % 3 == 1) continue;
      for (int a = j; a >= 0; a = parent[a]) m[a >> 6] |= 1ull << (a & 63);
    }
  }
  auto fill = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    for (auto& x : v) x = nd(rng);
  };
  fill(b.q, b.n * (c.hq * c.d + b.pad));
  fill(b.kt, b.n * (c.hkv * c.d + b.pad));
  fill(b.vt, b.n * (c.hkv * c.d + b.pad));
  fill(b.kc, b.slots * b.rows * c.hkv * c.d);
  fill(b.vc, b.slots * b.rows * c.hkv * c.d);
  b.out.assign(b.n * c.hq * c.d, std::nanf(""));  // poisoned: every element must be written
  return b;
}

static TreeAttentionArgs make_args(const Case& c, Batch& b) {
  TreeAttentionArgs a;
  a.batch = static_cast<int>(c.nodes.size());
  a.total_nodes = b.n;
  a.q_heads = c.hq;
  a.kv_heads = c.hkv;
  a.head_dim = c.d;
  for (int x : c.nodes) a.max_nodes = std::max(a.max_nodes, x);
  a.max_ctx = b.max_ctx;
  a.scale = 1.f / std::sqrt(static_cast<float>(c.d));
  a.dtype = DType::kFloat32;
  a.q = b.q.data();
  a.q_stride_token = c.hq * c.d + b.pad;
  a.q_stride_head = c.d;
  a.out = b.out.data();
  a.out_stride_token = c.hq * c.d;
  a.out_stride_head = c.d;
  a.k_cache = b.kc.data();
  a.v_cache = b.vc.data();
  a.cache_stride_slot = b.rows * c.hkv * c.d;
  a.cache_stride_row = c.hkv * c.d;
  a.cache_stride_head = c.d;
  a.k_tree = b.kt.data();
  a.v_tree = b.vt.data();
  a.tree_stride_token = c.hkv * c.d + b.pad;
  a.tree_stride_head = c.d;
  a.offsets = b.offsets.data();
  a.ctx_lens = b.ctx.data();
  a.slots = b.slot.data();
  a.masks = b.masks.data();
  return a;
}

// float64 reference: softmax over (context rows, allowed tree nodes) of each (token, query head).
static double max_error(const Case& c, const Batch& b, const TreeAttentionArgs& a) {
  double worst = 0;
  const int group = c.hq / c.hkv;
  for (int i = 0; i < a.batch; ++i) {
    for (int64_t t = b.offsets[i]; t < b.offsets[i + 1]; ++t) {
      for (int h = 0; h < c.hq; ++h) {
        const int kvh = h / group;
        const float* qr = &b.q[t * a.q_stride_token + h * c.d];
        std::vector<const float*> ks, vs;
        for (int64_t r = 0; r < b.ctx[i]; ++r) {
          const int64_t off = b.slot[i] * a.cache_stride_slot + r * a.cache_stride_row + kvh * c.d;
          ks.push_back(&b.kc[off]);
          vs.push_back(&b.vc[off]);
        }
        for (int j = 0; j < b.offsets[i + 1] - b.offsets[i]; ++j) {
          if (!((b.masks[t * kMaskWords + j / 64] >> (j % 64)) & 1)) continue;
          ks.push_back(&b.kt[(b.offsets[i] + j) * a.tree_stride_token + kvh * c.d]);
          vs.push_back(&b.vt[(b.offsets[i] + j) * a.tree_stride_token + kvh * c.d]);
        }
        std::vector<double> s(ks.size());
        double mx = -INFINITY;
        for (size_t k = 0; k < ks.size(); ++k) {
          double dot = 0;
          for (int d = 0; d < c.d; ++d) dot += static_cast<double>(qr[d]) * ks[k][d];
          s[k] = dot / std::sqrt(static_cast<double>(c.d));
          mx = std::max(mx, s[k]);
        }
        double z = 0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (int d = 0; d < c.d; ++d) {
          double o = 0;
          for (size_t k = 0; k < ks.size(); ++k) o += s[k] / z * vs[k][d];
          const double got = b.out[t * a.out_stride_token + h * c.d + d];
          const double err = std::isnan(got) ? INFINITY : std::fabs(got - o);
          worst = std::max(worst, err);
        }
      }
    }
  }
  return worst;
}

static void run_case(const Case& c, std::mt19937& rng, const char* name) {
  Batch b = make_batch(c, rng);
  TreeAttentionArgs a = make_args(c, b);
  const int group = c.hq / c.hkv;
  const int warps = block_warps(int64_t{a.max_nodes} * group);
  SplitPlan plan = plan_splits(a.batch, c.hkv, row_tiles(int64_t{a.max_nodes} * group, warps), a.max_ctx, 132, 256);
  if (c.force_small_chunks) plan = {request_splits(a.max_ctx, kKeyTile), kKeyTile};
  a.splits = plan.splits;
  a.chunk = plan.chunk;
  std::vector<float> pout, plse;
  if (a.splits > 1) {
    pout.assign(static_cast<size_t>(a.splits) * b.n * c.hq * c.d, std::nanf(""));
    plse.assign(static_cast<size_t>(a.splits) * b.n * c.hq, std::nanf(""));
    a.partial_out = pout.data();
    a.partial_lse = plse.data();
  }
  tree_attention_emulate(a, /*round_p_to_bf16=*/false);
  const double err = max_error(c, b, a);
  CHECK(err < 2e-5, "%s: max abs error %.3g (splits %d, chunk %lld)", name, err, a.splits,
        static_cast<long long>(a.chunk));
  // With bf16-rounded probabilities the error grows to about the bf16 epsilon, no more.
  std::fill(b.out.begin(), b.out.end(), std::nanf(""));
  tree_attention_emulate(a, /*round_p_to_bf16=*/true);
  const double err16 = max_error(c, b, a);
  CHECK(err16 < 2e-2, "%s (bf16 P): max abs error %.3g", name, err16);
}

static void test_plan() {
  for (int64_t max_ctx : {0, 1, 63, 64, 65, 1000, 4097, 32768, 100000}) {
    for (int64_t batch : {1, 3, 64}) {
      const SplitPlan p = plan_splits(batch, 8, 1, max_ctx, 132, 256);
      CHECK(p.splits >= 1 && p.chunk % kKeyTile == 0 && p.chunk >= kKeyTile, "plan shape");
      CHECK(static_cast<int64_t>(p.splits) * p.chunk >= max_ctx, "plan covers max_ctx %lld", (long long)max_ctx);
      CHECK(p.splits == request_splits(max_ctx, p.chunk), "no empty trailing split");
      for (int64_t ctx : {int64_t{0}, max_ctx / 3, max_ctx}) {  // every key in exactly one split
        int64_t covered = 0, expect_begin = 0;
        const int s_b = request_splits(ctx, p.chunk);
        CHECK(s_b <= p.splits, "request splits within the plan");
        for (int s = 0; s < s_b; ++s) {
          const KeyRange r = split_context_range(s, ctx, p.chunk);
          CHECK(r.begin == expect_begin, "splits are contiguous");
          covered += r.end - r.begin;
          expect_begin = r.end;
        }
        CHECK(covered == ctx, "splits cover the context");
      }
    }
  }
  const int64_t offs[] = {0, 1, 4, 40, 41};
  const int want[] = {0, 1, 1, 1, 2, 2, 3};
  const int64_t toks[] = {0, 1, 2, 3, 4, 39, 40};
  for (int k = 0; k < 7; ++k) CHECK(find_request(offs, 4, toks[k]) == want[k], "find_request(%lld)", (long long)toks[k]);
}

int main() {
  std::mt19937 rng(1234);
  test_plan();
  run_case({{1}, {0}, 4, 1, 64, false, false}, rng, "single root, no context");
  run_case({{1}, {1}, 8, 2, 64, false, false}, rng, "decode step, ctx 1");
  run_case({{3, 1, 37}, {5, 0, 130}, 8, 2, 64, true, false}, rng, "small trees, small chunks");
  run_case({{129 - 1, 2}, {70, 200}, 4, 1, 16, true, false}, rng, "128-node tree, both mask words");
  run_case({{17, 64, 65}, {1000, 3, 64}, 4, 2, 16, false, false}, rng, "planned splits");
  run_case({{5, 9}, {0, 129}, 2, 2, 16, true, true}, rng, "rows with empty masks");
  run_case({{33, 7, 1, 1}, {4097, 1, 0, 64}, 32, 8, 8, false, false}, rng, "GQA 32/8, long context");
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("tree attention emulation: all checks passed\n");
  return 0;
}
