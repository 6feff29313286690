#include "core/draft_tree.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <queue>
#include <utility>

#include "core/heap.h"

namespace sssd {

void CandidateTree::reset(int32_t root_token, int32_t max_nodes) {
  const auto cap = static_cast<size_t>(std::max(max_nodes, 1));
  if (tokens.size() < cap) {
    for (auto* v : {&tokens, &parents, &depth, &match_len, &first_child, &next_sibling}) v->resize(cap);
    p.resize(cap);
    raw.resize(cap);
    f.resize(cap);
    source.resize(cap);
    source_mask.resize(cap);
  }
  n_ = 1;
  tokens[0] = root_token;
  parents[0] = -1;
  depth[0] = 0;
  match_len[0] = 0;
  p[0] = 1.0f;
  raw[0] = 1.0f;
  f[0] = 1.0;
  source[0] = -1;
  source_mask[0] = 0;
  first_child[0] = -1;
  next_sibling[0] = -1;
}

void fuse(const CandidateTrie* const tries[kNumTrieSources], const Calibration* cal, const FusionParams& params,
          CandidateTree& out) {
  fuse_merge(tries, cal, params, out);
  fuse_finish(out);
}

namespace {
// Empties `out` to the root of the first non-empty trie, with room for every trie's nodes (each adds at most
// one tree node) and extra_nodes more.
void reset_for(const CandidateTrie* const tries[kNumTrieSources], int32_t extra_nodes, CandidateTree& out) {
  int32_t root = -1, max_nodes = 1 + std::max(extra_nodes, 0);
  for (int32_t s = 0; s < kNumTrieSources; ++s) {
    if (tries[s] != nullptr && tries[s]->size() > 0) {
      root = tries[s]->tokens[0];
      max_nodes += tries[s]->size() - 1;
    }
  }
  out.reset(root, max_nodes);
}

// Raw estimates and calibrated p_s of every node of source s's trie, into out.fuse_raw / out.fuse_ps. This
// loop has no data-dependent branches, so the long division + table lookup of consecutive nodes overlap in
// the pipeline. (Nodes merge_source drops are computed too, harmlessly.)
void source_estimates(const CandidateTrie& t, int32_t s, const Calibration* cal, float alpha, CandidateTree& out) {
  const int32_t n = t.size();
  out.fuse_raw.resize(static_cast<size_t>(n));
  out.fuse_ps.resize(static_cast<size_t>(n));
  for (int32_t i = 1; i < n; ++i) {
    const float raw = static_cast<float>(t.counts[i]) / (static_cast<float>(t.counts[t.parents[i]]) + alpha);
    out.fuse_raw[static_cast<size_t>(i)] = raw;
    out.fuse_ps[static_cast<size_t>(i)] = cal != nullptr ? cal->apply(s, t.depth[i], t.match_len[i], raw) : raw;
  }
}

// Merges source s's trie into `out` (its estimates from source_estimates). copy: `out` is still the bare
// root, so the trie is copied without sibling searches (a trie has no duplicate children). out.f[v] is
// the largest f_parent * p_s(v) over the sources merged so far (the pruning estimate); p(v) the fusion of
// their p_s; the winner's source, raw and match length are kept.
void merge_source(const CandidateTrie& t, int32_t s, bool copy, const FusionParams& params, CandidateTree& out) {
  const int32_t n = t.size();
  std::vector<int32_t>& map = out.fuse_map;  // trie node -> tree node (-1: dropped)
  map.assign(static_cast<size_t>(n), -1);
  map[0] = 0;
  for (int32_t i = 1; i < n; ++i) {
    const int32_t fp = map[static_cast<size_t>(t.parents[i])];
    if (fp < 0 || t.depth[i] > params.max_depth) continue;
    const float ps = out.fuse_ps[static_cast<size_t>(i)];
    const double fv = out.f[fp] * static_cast<double>(ps);
    if (fv < params.min_f) continue;  // its subtree is skipped too (map stays -1)
    const int32_t v = copy ? out.new_child(fp, t.tokens[i]) : out.child(fp, t.tokens[i]);
    map[static_cast<size_t>(i)] = v;
    out.f[v] = std::max(out.f[v], fv);
    const bool first = out.source_mask[v] == 0;
    if (first || ps > out.p[v]) {
      out.source[v] = static_cast<int8_t>(s);
      out.raw[v] = out.fuse_raw[static_cast<size_t>(i)];
      out.match_len[v] = t.match_len[i];
    }
    if (params.noisy_or && !first) {
      out.p[v] = 1.0f - (1.0f - out.p[v]) * (1.0f - ps);
    } else {
      out.p[v] = std::max(out.p[v], ps);
    }
    out.source_mask[v] |= static_cast<uint8_t>(1u << s);
  }
}
}  // namespace

void fuse_merge(const CandidateTrie* const tries[kNumTrieSources], const Calibration* cal,
                const FusionParams& params, CandidateTree& out, int32_t extra_nodes) {
  reset_for(tries, extra_nodes, out);
  // The datastore, usually the largest trie, goes first: the first non-empty source is copied.
  bool empty = true;
  for (int32_t s : {1, 0, 2}) {
    const CandidateTrie* t = tries[s];
    if (t == nullptr || t->size() <= 1) continue;
    source_estimates(*t, s, cal, params.alpha, out);
    merge_source(*t, s, empty, params, out);
    empty = false;
  }
}

void fuse_finish(CandidateTree& out) {
  // Siblings whose p sum exceeds 1 are scaled down to sum 1 (impossible for a deterministic verifier,
  // which accepts at most one child); then f(v) = f(parent) * p(v). The sums are accumulated over the
  // nodes in decreasing index order, which is each child list's order (new_child prepends), so every
  // float sum is rounded exactly as a walk of the child list would (select_recycled walks them); flat
  // passes.
  const int32_t n = out.size();
  std::vector<float>& sum = out.fuse_raw;  // reused: [n] p sum of each node's children
  sum.assign(static_cast<size_t>(n), 0.0f);
  for (int32_t v = n - 1; v >= 1; --v) sum[static_cast<size_t>(out.parents[v])] += out.p[v];
  for (int32_t v = 1; v < n; ++v) {
    const float s = sum[static_cast<size_t>(out.parents[v])];
    if (s > 1.0f) out.p[v] /= s;
    out.f[v] = out.f[out.parents[v]] * static_cast<double>(out.p[v]);
  }
}

namespace {
using heap::heap_push;
using heap::heap_replace_top;
using heap::sift_down;
// Max-heaps keyed (value, index): the larger value first, ties to the lower index. The key order is
// strict and total over distinct indices, so the pop order does not depend on how a heap is built.
using HeapItem = std::pair<double, int32_t>;
inline bool before(const HeapItem& a, const HeapItem& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}
// (f, i) as one integer that orders like `before` for f not NaN: a larger key comes first. The f bits
// are mapped to an unsigned order (negative: all bits flipped; else the sign bit set), after f + 0.0
// turns -0.0 into +0.0 (they compare equal); the low 32 bits are ~i, so ties go to the lower index.
// Every key of a real item is > 0.
using MergeKey = unsigned __int128;
inline MergeKey merge_key(double f, int32_t i) {
  const double g = f + 0.0;
  uint64_t bits;
  std::memcpy(&bits, &g, sizeof bits);
  bits = (bits >> 63) != 0 ? ~bits : bits | (uint64_t{1} << 63);
  return (static_cast<MergeKey>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}

// Two ways to key a max-heap of (f, node) items, with the same order: `before` on pairs, or a
// merge_key compared as one integer (no NaN allowed; cheaper, and its comparisons need no branches).
struct PairOrder {
  using Item = HeapItem;
  static Item item(double f, int32_t i) { return {f, i}; }
  static int32_t index(const Item& x) { return x.second; }
  static bool first(const Item& a, const Item& b) { return before(a, b); }
};
struct KeyOrder {
  using Item = MergeKey;
  static Item item(double f, int32_t i) { return merge_key(f, i); }
  static int32_t index(Item x) { return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(x)); }
  static bool first(Item a, Item b) { return a > b; }
};

// Best-first selection given the children of each node: for_children(v, fn) calls fn(c) for every
// child c of v (any order). `heap` is the scratch heap of the order O.
template <class O, class ForChildren>
void select_best_first(const double* f, const int32_t* depth, int32_t cap, int32_t max_depth, int32_t max_width,
                       ForChildren&& for_children, std::vector<int32_t>& seq, std::vector<typename O::Item>& heap,
                       SelectScratch& sc) {
  // max_depth is in [0, the deepest node's depth] here (the caller clamps it), so `width` stays as small
  // as the tree; a negative depth is never eligible (as unsigned it exceeds max_depth).
  sc.width.assign(static_cast<size_t>(max_depth) + 2, 0);
  heap.clear();
  auto eligible = [&](int32_t c) { return static_cast<uint32_t>(depth[c]) <= static_cast<uint32_t>(max_depth); };
  for_children(0, [&](int32_t c) {
    if (eligible(c)) heap_push<O>(heap, O::item(f[c], c));
  });
  while (!heap.empty() && static_cast<int32_t>(seq.size()) < cap) {
    const int32_t v = O::index(heap[0]);
    int32_t& w = sc.width[static_cast<size_t>(depth[v])];
    if (max_width > 0 && w >= max_width) {
      heap_replace_top<O>(heap, nullptr);
      continue;
    }
    ++w;
    seq.push_back(v);
    // The popped top is replaced by v's first eligible child, the other children are pushed.
    bool top_free = true;
    for_children(v, [&](int32_t c) {
      if (!eligible(c)) return;
      const auto item = O::item(f[c], c);
      if (top_free) {
        heap_replace_top<O>(heap, &item);
        top_free = false;
      } else {
        heap_push<O>(heap, item);
      }
    });
    if (top_free) heap_replace_top<O>(heap, nullptr);
  }
}
// select_best_first with integer keys unless some f is NaN (n: the number of nodes).
template <class ForChildren>
void select_best_first(const double* f, const int32_t* depth, int32_t n, int32_t cap, int32_t max_depth,
                       int32_t max_width, ForChildren&& for_children, std::vector<int32_t>& seq, SelectScratch& sc) {
  bool has_nan = false;
  int32_t deepest = 0;
  for (int32_t v = 0; v < n; ++v) {
    has_nan |= std::isnan(f[v]);
    deepest = std::max(deepest, depth[v]);
  }
  max_depth = std::min(max_depth, deepest);  // no node is deeper: same selection, a bounded width table
  if (max_depth < 0) return;                  // no node is eligible
  if (has_nan) {
    select_best_first<PairOrder>(f, depth, cap, max_depth, max_width, for_children, seq, sc.heap, sc);
  } else {
    select_best_first<KeyOrder>(f, depth, cap, max_depth, max_width, for_children, seq, sc.key_heap, sc);
  }
}
}  // namespace

void select_sequence(const int32_t* parents, const double* f, const int32_t* depth, int32_t n, int32_t cap,
                     int32_t max_depth, int32_t max_width, std::vector<int32_t>& seq) {
  seq.clear();
  if (n <= 1 || cap <= 0) return;
  static thread_local SelectScratch scratch;
  SelectScratch& sc = scratch;
  // Children lists (CSR), in index order.
  sc.start.assign(static_cast<size_t>(n) + 1, 0);
  sc.kids.resize(static_cast<size_t>(n));
  for (int32_t i = 1; i < n; ++i) ++sc.start[static_cast<size_t>(parents[i]) + 1];
  for (int32_t i = 0; i < n; ++i) sc.start[static_cast<size_t>(i) + 1] += sc.start[static_cast<size_t>(i)];
  sc.fill.assign(sc.start.begin(), sc.start.end() - 1);
  for (int32_t i = 1; i < n; ++i) sc.kids[static_cast<size_t>(sc.fill[static_cast<size_t>(parents[i])]++)] = i;
  auto for_children = [&](int32_t v, auto&& fn) {
    for (int32_t k = sc.start[static_cast<size_t>(v)]; k < sc.start[static_cast<size_t>(v) + 1]; ++k) {
      fn(sc.kids[static_cast<size_t>(k)]);
    }
  };
  select_best_first(f, depth, n, cap, max_depth, max_width, for_children, seq, sc);
}

void select_sequence(const CandidateTree& t, int32_t cap, int32_t max_depth, int32_t max_width,
                     std::vector<int32_t>& seq, SelectScratch& scratch) {
  seq.clear();
  if (t.size() <= 1 || cap <= 0) return;
  auto for_children = [&](int32_t v, auto&& fn) {
    for (int32_t c = t.first_child[static_cast<size_t>(v)]; c >= 0; c = t.next_sibling[static_cast<size_t>(c)]) fn(c);
  };
  select_best_first(t.f.data(), t.depth.data(), t.size(), cap, max_depth, max_width, for_children, seq, scratch);
}

namespace {
// The trees' selection sequences as allocate_budget consumes them: taken[i] nodes of tree i so far.
struct Sequences {
  const std::vector<const double*>& f;
  const std::vector<int32_t>& len;
  std::vector<int32_t> taken;
  Sequences(const std::vector<const double*>& f_, const std::vector<int32_t>& len_)
      : f(f_), len(len_), taken(len_.size(), 0) {}
  int32_t size() const { return static_cast<int32_t>(len.size()); }
  bool left(int32_t i) const { return taken[static_cast<size_t>(i)] < len[static_cast<size_t>(i)]; }
  double next_f(int32_t i) const { return f[static_cast<size_t>(i)][taken[static_cast<size_t>(i)]]; }
  void take(int32_t i, std::vector<int32_t>& order) {
    ++taken[static_cast<size_t>(i)];
    order.push_back(i);
  }
  bool nan_left() const {  // a NaN f among the nodes not taken yet
    for (int32_t i = 0; i < size(); ++i) {
      for (int32_t k = taken[static_cast<size_t>(i)]; k < len[static_cast<size_t>(i)]; ++k) {
        if (std::isnan(f[static_cast<size_t>(i)][k])) return true;
      }
    }
    return false;
  }
};

// While some request with a target is short (need_i = (step_time + slack) / tpot[i] - (1 + sum of its
// taken f) > 0), its next node goes to the request with the largest need.
void allocate_targets(Sequences& s, int64_t budget, const double* tpot, double step_time, double slack,
                      std::vector<int32_t>& order) {
  using Item = std::pair<double, int32_t>;  // (key, -tree) so ties go to the lower tree index
  std::priority_queue<Item> need;
  std::vector<double> expected(static_cast<size_t>(s.size()), 1.0);
  auto need_of = [&](int32_t i) { return (step_time + slack) / tpot[i] - expected[static_cast<size_t>(i)]; };
  for (int32_t i = 0; i < s.size(); ++i) {
    if (tpot[i] > 0 && std::isfinite(tpot[i]) && s.left(i) && need_of(i) > 0) need.push({need_of(i), -i});
  }
  while (!need.empty() && static_cast<int64_t>(order.size()) < budget) {
    const int32_t i = -need.top().second;
    need.pop();
    expected[static_cast<size_t>(i)] += s.next_f(i);
    s.take(i, order);
    if (s.left(i) && need_of(i) > 0) need.push({need_of(i), -i});
  }
}

// The merge by f without NaN: a tournament (loser) tree. Leaf i holds tree i's next node as a merge_key,
// or 0 once the tree is exhausted (below every node); each internal node keeps the loser of the match
// played there, and the overall winner is kept apart. Taking the winner's node replays only the matches
// on its leaf's path to the root: log2(leaves) integer comparisons, no branches (the outcomes are
// unpredictable).
void merge_by_tournament(Sequences& s, int64_t budget, std::vector<int32_t>& order) {
  static thread_local std::vector<MergeKey> key;
  static thread_local std::vector<int32_t> loser, win;
  const int32_t b = s.size();
  int32_t leaves = 1;
  while (leaves < b) leaves *= 2;
  key.assign(static_cast<size_t>(leaves), 0);
  for (int32_t i = 0; i < b; ++i) {
    if (s.left(i)) key[static_cast<size_t>(i)] = merge_key(s.next_f(i), i);
  }
  // Nodes 1 .. leaves - 1 are the matches (children 2n, 2n + 1), leaves + i is leaf i.
  loser.assign(static_cast<size_t>(leaves), 0);
  win.resize(2 * static_cast<size_t>(leaves));
  for (int32_t i = 0; i < leaves; ++i) win[static_cast<size_t>(leaves + i)] = i;
  for (int32_t n = leaves - 1; n >= 1; --n) {
    const int32_t x = win[2 * static_cast<size_t>(n)], y = win[2 * static_cast<size_t>(n) + 1];
    const bool y_wins = key[static_cast<size_t>(y)] > key[static_cast<size_t>(x)];
    win[static_cast<size_t>(n)] = y_wins ? y : x;
    loser[static_cast<size_t>(n)] = y_wins ? x : y;
  }
  MergeKey* k = key.data();
  int32_t* ls = loser.data();
  int32_t w = win[1];
  while (static_cast<int64_t>(order.size()) < budget && k[w] != 0) {
    s.take(w, order);
    MergeKey kw = s.left(w) ? merge_key(s.next_f(w), w) : 0;  // the current winner's key, in registers
    k[w] = kw;
    for (int32_t n = (w + leaves) / 2; n >= 1; n /= 2) {
      const int32_t l = ls[n];
      const MergeKey kl = k[l];  // loaded off the dependency chain of w
      // Masks rather than `?:` keep the compiler from turning the store into a branch.
      const int32_t m = -static_cast<int32_t>(kl > kw);  // all ones: l wins
      const int32_t w_next = (l & m) | (w & ~m);
      ls[n] = (w & m) | (l & ~m);
      w = w_next;
      kw = m != 0 ? kl : kw;
    }
  }
}

// The merge by f when a NaN breaks the total order of merge keys: a heap of each tree's next node.
void merge_by_heap(Sequences& s, int64_t budget, std::vector<int32_t>& order) {
  static thread_local std::vector<HeapItem> heap;
  heap.clear();
  for (int32_t i = 0; i < s.size(); ++i) {
    if (s.left(i)) heap.push_back({s.next_f(i), i});
  }
  for (size_t k = heap.size() / 2; k-- > 0;) sift_down<PairOrder>(heap, k);
  while (!heap.empty() && static_cast<int64_t>(order.size()) < budget) {
    const int32_t i = heap[0].second;
    s.take(i, order);
    if (s.left(i)) {
      const HeapItem next{s.next_f(i), i};
      heap_replace_top<PairOrder>(heap, &next);
    } else {
      heap_replace_top<PairOrder>(heap, nullptr);
    }
  }
}
}  // namespace

void allocate_budget(const std::vector<const double*>& seq_f, const std::vector<int32_t>& len, int64_t budget,
                     const double* tpot, double step_time, double slack, std::vector<int32_t>& order) {
  order.clear();
  Sequences s(seq_f, len);
  if (tpot != nullptr) allocate_targets(s, budget, tpot, step_time, slack, order);
  // Merge by f: take the best next node over the trees, again and again. Both ways pick the first next
  // node under `before` (larger f, ties to the lower tree), which is the same whatever structure
  // computes it, as long as that order is total: a NaN f breaks it, so NaN takes the heap.
  const bool has_nan = s.nan_left();
  int64_t nodes = 0;  // the most ranks there can be: a budget past it reserves nothing more
  for (int32_t i = 0; i < s.size(); ++i) nodes += std::max(len[static_cast<size_t>(i)], 0);
  if (std::min(budget, nodes) > static_cast<int64_t>(order.size())) order.reserve(static_cast<size_t>(std::min(budget, nodes)));
  if (has_nan) {
    merge_by_heap(s, budget, order);
  } else {
    merge_by_tournament(s, budget, order);
  }
}

}  // namespace sssd
