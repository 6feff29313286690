#include "core/recycled.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

namespace sssd {

RecycledTable::RecycledTable(int32_t k, uint64_t vocab, int32_t pair_slots)
    : k_(k), max_rows_(vocab > 0 ? vocab : kMaxUnsizedRows) {
  if (k < 1 || k > kMaxRecycledK) {
    throw std::invalid_argument("recycled k must be in [1, " + std::to_string(kMaxRecycledK) + "]");
  }
  if (pair_slots < 0 || pair_slots > (1 << 24) || (pair_slots & (pair_slots - 1)) != 0) {
    throw std::invalid_argument("recycled pair slots must be 0 or a power of two <= 2^24");
  }
  if (pair_slots > 0) {
    int32_t bits = 0;
    while ((1 << bits) < pair_slots) ++bits;
    pair_shift_ = 64 - bits;
    pair_keys_.assign(static_cast<size_t>(pair_slots), ~uint64_t{0});
    pair_rows_.assign(static_cast<size_t>(pair_slots) * static_cast<size_t>(k), RecycledCandidate{-1, 0.0f});
  }
}

// A token repeated in a row is kept once (its first, best rank): then the tokens of a row are distinct
// and a rank names one candidate, which the expansion relies on.
int32_t RecycledTable::keep_row(const int32_t* ids, const float* probs, int32_t w, RecycledCandidate* out) const {
  int32_t kept = 0;
  for (int32_t j = 0; j < w; ++j) {
    bool seen = false;
    for (int32_t i = 0; i < kept; ++i) seen |= out[i].id == ids[j];
    if (!seen) out[kept++] = {ids[j], probs[j]};
  }
  for (int32_t j = kept; j < k_; ++j) out[j] = {-1, 0.0f};
  return kept;
}

void RecycledTable::update(const int32_t* tokens, int64_t n, const int32_t* ids, const float* probs, int32_t width,
                           const int32_t* prev) {
  const int32_t w = std::min(width, k_);
  if (w <= 0) return;
  const auto k = static_cast<uint64_t>(k_);
  int64_t top = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<uint64_t>(tokens[i]) < max_rows_) top = std::max<int64_t>(top, tokens[i]);
  }
  uint64_t rows = num_rows_;
  if (top >= static_cast<int64_t>(rows)) {
    // Doubling keeps growth amortized; never past the bound.
    rows = std::min<uint64_t>(max_rows_, std::max<uint64_t>(static_cast<uint64_t>(top) + 1, 2 * rows));
    rows_.resize(rows * k, RecycledCandidate{-1, 0.0f});
    num_rows_ = rows;
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto row = static_cast<uint64_t>(tokens[i]);
    if (tokens[i] < 0 || row >= rows) continue;
    RecycledCandidate* out = rows_.data() + row * k;
    recorded_ += out[0].id < 0;
    const int32_t* in_ids = ids + i * width;
    const float* in_probs = probs + i * width;
    keep_row(in_ids, in_probs, w, out);
    if (prev != nullptr && prev[i] >= 0 && !pair_keys_.empty()) {
      const uint64_t key = pair_key(prev[i], tokens[i]);
      const uint64_t slot = pair_slot(key);  // direct-mapped: a newer pair takes the slot
      pair_keys_[slot] = key;
      keep_row(in_ids, in_probs, w, pair_rows_.data() + slot * k);
    }
  }
}

void RecycledTable::clear() {
  Rows().swap(rows_);
  num_rows_ = 0;
  std::fill(pair_keys_.begin(), pair_keys_.end(), ~uint64_t{0});
  std::fill(pair_rows_.begin(), pair_rows_.end(), RecycledCandidate{-1, 0.0f});
  recorded_ = 0;
}

namespace {
using Edge = RecycleScratch::Edge;
using EdgeKey = RecycleScratch::EdgeKey;
using Touched = RecycleScratch::Touched;
// An edge as one integer that orders like the heap must: the larger f first, ties to the lower node, then
// the lower rank (a strict total order, so the expansion does not depend on how the heap is built). f >= 0
// (a product of probabilities; + 0.0 makes -0.0 +0.0), so its bits order as the value does. One integer
// comparison, no branches, inlined (a comparison function passed to std::push_heap is called through a
// pointer).
inline EdgeKey edge_key(double f, int32_t node, int32_t rank) {
  const double g = f + 0.0;
  uint64_t bits;
  std::memcpy(&bits, &g, sizeof bits);
  return (static_cast<EdgeKey>(bits) << 64) | (static_cast<EdgeKey>(0xffffffffu - static_cast<uint32_t>(node)) << 32) |
         (0xffffffffu - static_cast<uint32_t>(rank));
}
inline Edge edge_of(EdgeKey k) {
  const auto hi = static_cast<uint64_t>(k >> 64);
  double f;
  std::memcpy(&f, &hi, sizeof f);
  return {f, static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(k >> 32)),
          static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(k))};
}

// The largest p a new candidate can have at each depth: the maps are monotone in the raw score, so raw = 1
// gives each (source, depth, rank bucket) group's largest p.
void depth_bounds(const Calibration* cal, int32_t max_depth, std::vector<float>& bound) {
  bound.assign(static_cast<size_t>(max_depth) + 1, 1.0f);
  if (cal == nullptr) return;
  for (int32_t d = 1; d <= max_depth; ++d) {
    float b = 0.0f;
    for (int32_t m : cal->match_edges()) b = std::max(b, cal->apply(kRecycledSource, d, std::max(m, 1), 1.0f));
    bound[static_cast<size_t>(d)] = b;
  }
}

// The max_new-th largest of f[1 .. n) (0 when there are fewer), with `scratch` as room. The smallest of
// any max_new of them is a lower bound of it: only the f at or above that bound are copied and selected
// among (a tree's f are mostly far smaller than its best max_new).
double nth_largest(const std::vector<double>& f, int32_t n, int32_t max_new, std::vector<double>& scratch) {
  if (max_new <= 0 || n - 1 < max_new) return 0.0;
  const double low = *std::min_element(f.begin() + 1, f.begin() + 1 + max_new);
  scratch.resize(static_cast<size_t>(n));
  size_t m = 0;
  for (int32_t v = 1; v < n; ++v) {
    scratch[m] = f[v];
    m += f[v] >= low;  // no branch: the outcome is unpredictable
  }
  std::nth_element(scratch.begin(), scratch.begin() + (max_new - 1), scratch.begin() + static_cast<int64_t>(m),
                   std::greater<double>());
  return scratch[static_cast<size_t>(max_new - 1)];
}

// Bit j set: row[j].id == token (j < count <= kMaxRecycledK). No early exit: rows are short, and the
// comparisons of a row run side by side.
inline uint64_t rank_mask(const RecycledCandidate* row, int32_t count, int32_t token) {
  uint64_t m = 0;
  for (int32_t j = 0; j < count; ++j) m |= static_cast<uint64_t>(row[j].id == token) << j;
  return m;
}

// One expansion: the tree, the table, the heap of candidate edges (node, rank) and the floor.
class Expander {
 public:
  Expander(const RecycledTable& table, const Calibration* cal, const RecycleParams& params, CandidateTree& t,
           RecycleScratch& s)
      : table_(table), cal_(cal), params_(params), t_(t), s_(s) {
    // The bounds change only with the calibration's values: computed again when they did (a request's
    // call reuses the last call's, ~0.3 µs saved per request).
    const uint64_t version = cal != nullptr ? cal->version() : 0;
    if (s.bound_version != version || s.bound_depth != params.max_depth) {
      depth_bounds(cal, params.max_depth, s.bound);
      s.bound_version = version;
      s.bound_depth = params.max_depth;
    }
    s.heap.clear();
    s.touched.clear();
    // Sized, not cleared: list_relevant writes every entry of the tree's nodes, touch() the new ones'.
    if (s.slot.size() < static_cast<size_t>(t.size() + params.max_new)) {
      s.slot.resize(static_cast<size_t>(t.size() + params.max_new));
    }
  }

  void run() {
    list_relevant(kRelevance * nth_largest(t_.f, t_.size(), params_.max_new, s_.best));
    rescore();
    init_best();
    push_next(0, 0);
    if (params_.from_every_node) {
      for (int32_t v : s_.relevant) push_next(v, 0);
    }
    while (!s_.heap.empty() && added_ < params_.max_new) {
      std::pop_heap(s_.heap.begin(), s_.heap.end());
      const Edge e = edge_of(s_.heap.back());
      s_.heap.pop_back();
      if (!good(e.f)) break;  // the floor rose past it, and past every edge left (none has a larger f)
      take(e);
    }
  }

 private:
  // Nodes whose f is below this share of the max_new-th largest are left as they are: rescoring could
  // not lift one of them into the selection (the largest gain of agreement is far smaller), and a tree
  // holds hundreds of them (every source's continuations down to min_f).
  static constexpr double kRelevance = 0.25;
  static constexpr uint64_t kMasked = uint64_t{1} << 63;  // taken: the children's ranks are in

  int32_t prev_of(int32_t v) const { return v == 0 ? params_.root_prev : t_.tokens[t_.parents[v]]; }
  // Node v's entry in s_.touched, made on first use (its row is looked up later, once).
  Touched& touch(int32_t v) {
    int32_t& k = s_.slot[static_cast<size_t>(v)];
    if (k < 0) {
      k = static_cast<int32_t>(s_.touched.size());
      s_.touched.resize(s_.touched.size() + 1);  // in place (a pushed temporary is copied through the stack)
      Touched& r = s_.touched.back();
      r.row = nullptr;
      r.count = -1;
      r.pair = false;
      r.taken = 0;
    }
    return s_.touched[static_cast<size_t>(k)];
  }
  // The candidates after node v: the row of (its parent's token, its token) when there is one (the model
  // read that pair before: what it predicted then says more than the token's row), else its token's. A
  // pair's row's ranks are calibrated apart (recycled_match).
  Touched& row_of(int32_t v) {
    Touched& r = touch(v);
    if (r.count < 0) {
      const int32_t c = table_.lookup_pair(prev_of(v), t_.tokens[v], &r.row);
      r.pair = c > 0;
      r.count = c > 0 ? c : table_.lookup(t_.tokens[v], &r.row);
    }
    return r;
  }
  float p_of(int32_t source, int32_t depth, int32_t match, float raw) const {
    return cal_ != nullptr ? cal_->apply(source, depth, match, raw) : raw;
  }
  bool good(double f) const { return f >= params_.min_f && f > floor_; }

  // s_.relevant: the nodes with f >= relevant, parents first; every node's slot is set (-1: untouched).
  void list_relevant(double relevant) {
    s_.relevant.clear();
    s_.slot[0] = -1;
    touch(0);
    for (int32_t v = 1; v < t_.size(); ++v) {
      s_.slot[static_cast<size_t>(v)] = -1;
      if (t_.f[v] < relevant) continue;
      s_.relevant.push_back(v);
      touch(v);
    }
  }

  // Every relevant retrieval node (match shorter than kRescoreMaxMatch) whose token is in its parent's
  // row gets p = cal(kRescoredSource, depth, recycled_match(its rank), its retrieval p); then its f
  // estimate follows (parents first).
  bool rescorable(int32_t v) const {
    return t_.source[v] >= 0 && t_.source[v] < kNumTrieSources && t_.match_len[v] < kRescoreMaxMatch;
  }
  void rescore() {
    for (int32_t v : s_.relevant) {
      const int32_t u = t_.parents[v];
      if (rescorable(v)) {
        const Touched& r = row_of(u);
        const uint64_t in = r.count > 0 ? rank_mask(r.row, r.count, t_.tokens[v]) : 0;
        if (in != 0) {  // absent from the row: the retrieval score stands (see the header)
          const int32_t match = recycled_match(__builtin_ctzll(in), r.pair);
          t_.raw[v] = t_.p[v];
          t_.p[v] = p_of(kRescoredSource, t_.depth[v], match, t_.p[v]);
          t_.source[v] = static_cast<int8_t>(kRescoredSource);
          t_.match_len[v] = match;
          t_.source_mask[v] |= static_cast<uint8_t>(1u << kRecycledSource);
        }
      }
      t_.f[v] = t_.f[u] * static_cast<double>(t_.p[v]);
    }
  }

  // s_.best: a min-heap of the max_new largest f among the relevant nodes and the new ones; a candidate
  // at or below the smallest of them would never be among the max_new nodes selection takes.
  void init_best() {
    auto& b = s_.best;
    b.clear();
    for (int32_t v : s_.relevant) b.push_back(t_.f[v]);
    const auto keep = static_cast<size_t>(params_.max_new);
    if (b.size() > keep) {
      std::nth_element(b.begin(), b.begin() + (keep - 1), b.end(), std::greater<double>());
      b.resize(keep);
    }
    std::make_heap(b.begin(), b.end(), std::greater<double>());
    if (b.size() == keep) floor_ = b.front();
  }
  void keep_best(double f) {
    auto& b = s_.best;
    if (static_cast<int32_t>(b.size()) < params_.max_new) {
      b.push_back(f);
      std::push_heap(b.begin(), b.end(), std::greater<double>());
    } else if (f > b.front()) {
      std::pop_heap(b.begin(), b.end(), std::greater<double>());
      b.back() = f;
      std::push_heap(b.begin(), b.end(), std::greater<double>());
    }
    if (static_cast<int32_t>(b.size()) == params_.max_new) floor_ = std::max(floor_, b.front());
  }

  // Pushes the first candidate after node v from rank j on that v has no child for yet (a token it has
  // was rescored instead), when it could make the cut. Ranks come one at a time: the next is pushed when
  // this one is taken, so a node's weak candidates cost nothing until its strong ones are in.
  // Whether a candidate after v could make the cut (the best p a candidate can have at its depth).
  bool may_push(int32_t v) const {
    const int32_t d = t_.depth[v] + 1;
    return d <= params_.max_depth && good(t_.f[v] * s_.bound[static_cast<size_t>(d)]);
  }
  void push_next(int32_t v, int32_t j) {
    if (!may_push(v)) return;
    const int32_t d = t_.depth[v] + 1;
    Touched& r = row_of(v);
    if (r.count > 0 && !(r.taken & kMasked)) {  // the ranks of v's children, once
      for (int32_t c = t_.first_child[v]; c >= 0; c = t_.next_sibling[c]) r.taken |= rank_mask(r.row, r.count, t_.tokens[c]);
      r.taken |= kMasked;
    }
    while (j < r.count && (r.taken >> j & 1u) != 0) ++j;
    if (j >= r.count) return;
    const double f = t_.f[v] * static_cast<double>(p_of(kRecycledSource, d, recycled_match(j, r.pair), r.row[j].prob));
    if (good(f)) {
      s_.heap.push_back(edge_key(f, v, j));
      std::push_heap(s_.heap.begin(), s_.heap.end());
    }
  }

  void take(const Edge& e) {
    Touched& r = row_of(e.node);
    r.taken |= uint64_t{1} << e.rank;
    const int32_t token = r.row[e.rank].id;
    const float prob = r.row[e.rank].prob;
    const int32_t match = recycled_match(e.rank, r.pair);
    push_next(e.node, e.rank + 1);  // may grow s_.touched: r is not used past here
    const int32_t v = t_.new_child(e.node, token);
    s_.slot[static_cast<size_t>(v)] = -1;
    touch(v).taken = kMasked;  // no children
    ++added_;
    t_.source[v] = static_cast<int8_t>(kRecycledSource);
    t_.raw[v] = prob;
    t_.match_len[v] = match;
    t_.p[v] = p_of(kRecycledSource, t_.depth[v], match, prob);
    t_.source_mask[v] = static_cast<uint8_t>(1u << kRecycledSource);
    t_.f[v] = e.f;
    keep_best(e.f);
    push_next(v, 0);
  }

  const RecycledTable& table_;
  const Calibration* cal_;
  const RecycleParams& params_;
  CandidateTree& t_;
  RecycleScratch& s_;
  double floor_ = 0.0;
  int32_t added_ = 0;
};
}  // namespace

void expand_recycled(const RecycledTable& table, const Calibration* cal, const RecycleParams& params,
                     CandidateTree& tree, RecycleScratch& s) {
  if (params.max_new <= 0 || params.max_depth < 1) return;
  Expander(table, cal, params, tree, s).run();
}

}  // namespace sssd
