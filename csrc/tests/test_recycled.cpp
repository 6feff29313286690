// The recycled candidates: the table (rows, growth, bounds), the selection with them (rescoring,
// normalization, candidates added as it reaches them), and the drafter's intake and drafting with them.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "core/drafter.h"
#include "core/recycled.h"

namespace {

// A tree of the root `root` and the given (parent, token, p, source) nodes, with f = f(parent) * p.
struct Node {
  int32_t parent, token;
  float p;
  int8_t source;
};
sssd::CandidateTree make_tree(int32_t root, const std::vector<Node>& nodes, int32_t extra) {
  sssd::CandidateTree t;
  t.reset(root, static_cast<int32_t>(nodes.size()) + 1 + extra);
  for (const Node& n : nodes) {
    const int32_t v = t.new_child(n.parent, n.token);
    t.p[v] = n.p;
    t.f[v] = t.f[n.parent] * n.p;
    t.source[v] = n.source;
  }
  return t;
}

}  // namespace

TEST(recycled_table_rows) {
  sssd::RecycledTable table(2, 10);
  const int32_t tokens[] = {3, 4, 3};
  const int32_t ids[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};  // width 3: only the first 2 are kept
  const float probs[] = {0.5f, 0.25f, 0.1f, 0.6f, 0.3f, 0.1f, 0.7f, 0.2f, 0.1f};
  table.update(tokens, 3, ids, probs, 3);
  const sssd::RecycledCandidate* row = nullptr;
  CHECK_EQ(table.lookup(3, &row), 2);  // the later row of token 3 won
  CHECK_EQ(row[0].id, 7);
  CHECK_EQ(row[1].id, 8);
  CHECK(row[1].prob == 0.2f);
  CHECK_EQ(reinterpret_cast<uintptr_t>(row - 3 * 2) % 64, 0u);  // the table starts on a cache line
  CHECK_EQ(table.lookup(4, &row), 2);
  CHECK_EQ(table.lookup(5, &row), 0);
  CHECK_EQ(table.lookup(-1, &row), 0);
  CHECK_EQ(table.lookup(1 << 30, &row), 0);
  CHECK_EQ(table.rows_recorded(), 2);
  const int32_t past[] = {10, 1 << 30};  // at or past the vocabulary: not recorded
  table.update(past, 2, ids, probs, 3);
  CHECK_EQ(table.rows_recorded(), 2);
  sssd::RecycledTable unsized(4, 0);
  const int32_t huge[] = {static_cast<int32_t>(sssd::kMaxUnsizedRows), 7};
  unsized.update(huge, 2, ids, probs, 1);
  CHECK_EQ(unsized.rows_recorded(), 1);
  CHECK_THROWS(sssd::RecycledTable(0, 10), std::invalid_argument);
  CHECK_THROWS(sssd::RecycledTable(sssd::kMaxRecycledK + 1, 10), std::invalid_argument);
}

TEST(recycled_pair_rows) {
  sssd::RecycledTable table(2, 10, 4);
  const int32_t tokens[] = {3, 3, 4};
  const int32_t prev[] = {1, -1, 3};
  const int32_t ids[] = {5, 6, 7, 8, 9, 9};  // width 2; row 2 repeats 9: kept once
  const float probs[] = {0.5f, 0.25f, 0.6f, 0.3f, 0.7f, 0.2f};
  table.update(tokens, 3, ids, probs, 2, prev);
  const sssd::RecycledCandidate* row = nullptr;
  CHECK_EQ(table.lookup_pair(1, 3, &row), 2);  // (1, 3): the first row (the second had no prev)
  CHECK_EQ(row[0].id, 5);
  CHECK_EQ(table.lookup(3, &row), 2);  // token 3: the later row
  CHECK_EQ(row[0].id, 7);
  CHECK_EQ(table.lookup_pair(3, 4, &row), 1);
  table.update(tokens + 2, 1, ids, probs, 2, prev + 2);  // (3, 4) again, two distinct ids: the row grows
  CHECK_EQ(table.lookup_pair(3, 4, &row), 2);
  table.update(tokens + 2, 1, ids + 4, probs + 4, 2, prev + 2);  // and shrinks back (no stale entry)
  CHECK_EQ(table.lookup_pair(3, 4, &row), 1);
  CHECK_EQ(table.lookup_pair(2, 3, &row), 0);
  CHECK_EQ(table.lookup_pair(-1, 3, &row), 0);
  sssd::RecycledTable none(2, 10);  // no pair slots: no pair rows
  none.update(tokens, 3, ids, probs, 2, prev);
  CHECK_EQ(none.lookup_pair(1, 3, &row), 0);
  sssd::RecycledTable one(2, 10, 1);  // one slot: the latest pair holds it
  one.update(tokens, 3, ids, probs, 2, prev);
  CHECK_EQ(one.lookup_pair(1, 3, &row), 0);
  CHECK_EQ(one.lookup_pair(3, 4, &row), 1);
  CHECK_THROWS(sssd::RecycledTable(2, 10, 3), std::invalid_argument);
  CHECK_THROWS(sssd::RecycledTable(2, 10, -1), std::invalid_argument);
  CHECK_EQ(sssd::recycled_match(0, false), 1);
  CHECK_EQ(sssd::recycled_match(0, true), sssd::kPairRankBase + 1);
  CHECK_EQ(sssd::recycled_match(31, true), 2 * sssd::kPairRankBase);
}

TEST(recycled_selection_rescores_and_adds) {
  sssd::RecycledTable table(2, 0);
  const int32_t tokens[] = {5, 7};
  const int32_t ids[] = {7, 8, 9, 3};
  const float probs[] = {0.75f, 0.25f, 0.5f, 0.5f};
  table.update(tokens, 2, ids, probs, 2);
  // root 5 with a retrieval child 7 (p 0.5) and 6 (p 0.25)
  sssd::CandidateTree t = make_tree(5, {{0, 7, 0.5f, 0}, {0, 6, 0.25f, 1}}, 4);
  sssd::RecycleScratch scratch;
  sssd::RecycleParams params;
  params.cap = 4;
  std::vector<int32_t> seq;
  sssd::select_recycled(table, nullptr, params, t, seq, scratch);
  CHECK_EQ(t.source[1], sssd::kRescoredSource);  // 7: rank 0 after 5
  CHECK_EQ(t.match_len[1], 1);
  CHECK_EQ(t.source[2], 1);  // 6: absent from the row, keeps its retrieval score
  CHECK_EQ(t.match_len[2], 0);
  CHECK(t.p[2] == 0.25f);
  // 7 (0.5); then four at f 0.25, ties to the lower node: 8 after 5 (the room 7 and 6 leave), 9 after 7,
  // 3 after 7 (pushed when 9 is taken), and node 6 (2), which four nodes leave out
  CHECK_EQ(seq.size(), size_t{4});
  CHECK_EQ(t.size(), 6);
  const std::vector<int32_t> want_seq = {1, 3, 4, 5}, want_tokens = {8, 9, 3};
  CHECK(seq == want_seq);
  for (int32_t v = 3; v < t.size(); ++v) CHECK_EQ(t.tokens[v], want_tokens[static_cast<size_t>(v - 3)]);
  for (int32_t v = 3; v < t.size(); ++v) {
    CHECK_EQ(t.source[v], sssd::kRecycledSource);
    CHECK(t.f[v] == 0.25);
  }
}

// The depth bounds a scratch keeps are the calibration's of the call: another table, or the same one
// changed, is read again (a stale bound of 0.1 would keep the candidate of p 0.75 out).
TEST(recycled_bounds_follow_the_calibration) {
  sssd::RecycledTable table(1, 0);
  const int32_t tokens[] = {5};
  const int32_t ids[] = {7};
  const float probs[] = {0.75f};
  table.update(tokens, 1, ids, probs, 1);
  sssd::Calibration low, identity;
  const auto size = static_cast<size_t>(low.table_size());
  const uint64_t before = low.version();
  low.set(std::vector<float>(size, 0.1f), std::vector<double>(size, 1.0));
  CHECK(low.version() != before && low.version() != identity.version());
  sssd::Calibration copy = low;
  CHECK_EQ(copy.version(), low.version());
  sssd::RecycleScratch scratch;
  sssd::RecycleParams params;
  params.cap = 4;
  params.min_f = 0.3;
  std::vector<int32_t> seq;
  auto added = [&](const sssd::Calibration& cal) {
    sssd::CandidateTree t = make_tree(5, {}, 4);
    sssd::select_recycled(table, &cal, params, t, seq, scratch);
    return t.size() - 1;
  };
  CHECK_EQ(added(low), 0);  // p 0.1 < min_f
  CHECK_EQ(added(identity), 1);
  CHECK_EQ(added(low), 0);
  const uint64_t was = low.version();
  low.set(identity.values(), std::vector<double>(size, 1.0));
  CHECK(low.version() != was);
  CHECK_EQ(added(low), 1);
  const uint64_t fitted = low.version();
  low.observe(sssd::kRecycledSource, 1, 1, 0.75f, 0.0f, 1e6);  // rejected, heavily: p falls below min_f
  low.refit_dirty();
  CHECK(low.version() != fitted);
  CHECK_EQ(added(low), 0);
}

// A scratch reused across trees of every size (the drafter keeps one per thread) gives what a fresh one
// gives: nothing a call leaves in it (node slots, opened rows, the heap, the widths) leaks into the next.
TEST(recycled_scratch_reused_across_trees) {
  uint64_t state = 12345;
  auto next = [&](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  const int32_t vocab = 40, k = 4;
  sssd::RecycledTable table(k, vocab, 64);
  std::vector<int32_t> tokens, ids, prev;
  std::vector<float> probs;
  for (int32_t t = 0; t < vocab; ++t) {
    tokens.push_back(t);
    prev.push_back(static_cast<int32_t>(next(vocab)));
    float q = 0.9f;
    for (int32_t j = 0; j < k; ++j, q *= 0.5f) {
      ids.push_back(static_cast<int32_t>(next(vocab)));
      probs.push_back(q);
    }
  }
  table.update(tokens.data(), vocab, ids.data(), probs.data(), k, prev.data());
  const float ps[] = {0.5f, 0.25f, 0.9f, 0.3f, 0.05f, 0.7f, 0.125f};
  sssd::RecycleScratch reused;
  std::vector<int32_t> seq_a, seq_b;
  for (int32_t round = 0; round < 60; ++round) {
    const auto n = static_cast<int32_t>(1 + next(round % 3 == 0 ? 300 : 40));
    std::vector<Node> nodes;
    for (int32_t i = 1; i < n; ++i) {
      nodes.push_back({static_cast<int32_t>(next(static_cast<uint64_t>(i))), static_cast<int32_t>(next(vocab)),
                       ps[next(7)], static_cast<int8_t>(next(3))});
    }
    sssd::RecycleParams params;
    params.cap = static_cast<int32_t>(next(40));
    params.max_depth = static_cast<int32_t>(1 + next(8));
    params.max_width = round % 4 == 0 ? 3 : 0;
    params.min_f = round % 2 == 0 ? 0.0 : 1e-4;
    params.root_prev = static_cast<int32_t>(next(vocab));
    sssd::CandidateTree a = make_tree(static_cast<int32_t>(next(vocab)), nodes, params.cap);
    sssd::CandidateTree b = a;
    sssd::RecycleScratch fresh;
    sssd::select_recycled(table, nullptr, params, a, seq_a, fresh);
    sssd::select_recycled(table, nullptr, params, b, seq_b, reused);
    CHECK(seq_a == seq_b);
    CHECK(static_cast<int32_t>(seq_a.size()) <= params.cap);
    CHECK_EQ(a.size(), b.size());
    for (int32_t v = 0; v < a.size(); ++v) {
      CHECK_EQ(a.tokens[v], b.tokens[v]);
      CHECK_EQ(a.parents[v], b.parents[v]);
      CHECK_EQ(a.source[v], b.source[v]);
      CHECK(a.f[v] == b.f[v]);
      CHECK(a.p[v] == b.p[v]);
    }
  }
}

TEST(recycled_drafter_intake_and_drafting) {
  sssd::DrafterParams p;
  p.use_recycled = true;
  p.use_input = p.use_pool = false;
  p.calibrated = false;
  p.vocab_size = 20;
  sssd::Drafter d(p, {});
  const int32_t prompt[] = {1, 5};
  d.add_request(0, prompt, 2);
  const int32_t tokens[] = {5};
  const int32_t ids[] = {7, 8};
  const float probs[] = {0.75f, 0.25f};
  const float bad_probs[] = {0.75f, 1.5f};
  const int32_t bad_ids[] = {7, 20};
  CHECK_THROWS(d.recycle(tokens, 1, ids, bad_probs, 2), std::invalid_argument);
  CHECK_THROWS(d.recycle(tokens, 1, bad_ids, probs, 2), std::invalid_argument);
  CHECK_EQ(d.recycled_rows(), 0);
  d.recycle(tokens, 1, ids, probs, 2);
  CHECK_EQ(d.recycled_rows(), 1);
  const int64_t rid = 0, budget = 8;
  sssd::ProposeOutput out;
  d.propose(&rid, 1, &budget, false, nullptr, 0.02, 0.0, out);
  CHECK_EQ(out.tokens.size(), size_t{3});  // the root, 7, 8
  CHECK_EQ(out.tokens[1], 7);
  CHECK_EQ(out.source[1], sssd::kRecycledSource);
  p.recycle_k = 0;
  CHECK_THROWS(sssd::Drafter(p, {}), std::invalid_argument);
}
