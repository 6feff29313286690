#include "core/recycled.h"

#include <algorithm>
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
    pair_ids_.assign(static_cast<size_t>(pair_slots) * static_cast<size_t>(k), -1);
    pair_probs_.assign(static_cast<size_t>(pair_slots) * static_cast<size_t>(k), 0.0f);
    pair_count_.assign(static_cast<size_t>(pair_slots), 0);
  }
}

// A token repeated in a row is kept once (its first, best rank): then the tokens of a row are distinct
// and a rank names one candidate, which the expansion relies on.
int32_t RecycledTable::keep_row(const int32_t* ids, const float* probs, int32_t w, int32_t* out_ids, float* out_probs) {
  int32_t kept = 0;
  for (int32_t j = 0; j < w; ++j) {
    if (std::find(out_ids, out_ids + kept, ids[j]) != out_ids + kept) continue;
    out_ids[kept] = ids[j];
    out_probs[kept++] = probs[j];
  }
  return kept;
}

void RecycledTable::update(const int32_t* tokens, int64_t n, const int32_t* ids, const float* probs, int32_t width,
                           const int32_t* prev) {
  const int32_t w = std::min(width, k_);
  if (w <= 0) return;
  int64_t top = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<uint64_t>(tokens[i]) < max_rows_) top = std::max<int64_t>(top, tokens[i]);
  }
  if (top >= static_cast<int64_t>(count_.size())) {
    // Doubling keeps growth amortized; never past the bound.
    const uint64_t rows = std::min<uint64_t>(max_rows_, std::max<uint64_t>(static_cast<uint64_t>(top) + 1, 2 * count_.size()));
    count_.resize(rows, 0);
    ids_.resize(rows * static_cast<uint64_t>(k_), -1);
    probs_.resize(rows * static_cast<uint64_t>(k_), 0.0f);
  }
  const auto k = static_cast<uint64_t>(k_);
  for (int64_t i = 0; i < n; ++i) {
    const auto row = static_cast<uint64_t>(tokens[i]);
    if (tokens[i] < 0 || row >= count_.size()) continue;
    recorded_ += count_[row] == 0;
    const int32_t* in_ids = ids + i * width;
    const float* in_probs = probs + i * width;
    count_[row] = static_cast<uint8_t>(keep_row(in_ids, in_probs, w, ids_.data() + row * k, probs_.data() + row * k));
    if (prev != nullptr && prev[i] >= 0 && !pair_keys_.empty()) {
      const uint64_t key = pair_key(prev[i], tokens[i]);
      const uint64_t slot = pair_slot(key);  // direct-mapped: a newer pair takes the slot
      pair_keys_[slot] = key;
      pair_count_[slot] =
          static_cast<uint8_t>(keep_row(in_ids, in_probs, w, pair_ids_.data() + slot * k, pair_probs_.data() + slot * k));
    }
  }
}

void RecycledTable::clear() {
  std::vector<int32_t>().swap(ids_);
  std::vector<float>().swap(probs_);
  std::vector<uint8_t>().swap(count_);
  std::fill(pair_keys_.begin(), pair_keys_.end(), ~uint64_t{0});
  std::fill(pair_count_.begin(), pair_count_.end(), 0);
  recorded_ = 0;
}

namespace {
using Edge = RecycleScratch::Edge;
// Heap order: the larger f first, ties to the lower node, then the lower rank (a strict total order, so
// the expansion does not depend on how the heap is built).
inline bool after(const Edge& a, const Edge& b) {
  if (a.f != b.f) return a.f < b.f;
  if (a.node != b.node) return a.node > b.node;
  return a.rank > b.rank;
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

// The max_new-th largest of f[1 .. n) (0 when there are fewer), with `scratch` as room.
double nth_largest(const std::vector<double>& f, int32_t n, int32_t max_new, std::vector<double>& scratch) {
  if (max_new <= 0 || n - 1 < max_new) return 0.0;
  scratch.assign(f.begin() + 1, f.begin() + n);
  std::nth_element(scratch.begin(), scratch.begin() + (max_new - 1), scratch.end(), std::greater<double>());
  return scratch[static_cast<size_t>(max_new - 1)];
}

// One expansion: the tree, the table, the heap of candidate edges (node, rank) and the floor.
class Expander {
 public:
  Expander(const RecycledTable& table, const Calibration* cal, const RecycleParams& params, CandidateTree& t,
           RecycleScratch& s)
      : table_(table), cal_(cal), params_(params), t_(t), s_(s) {
    depth_bounds(cal, params.max_depth, s.bound);
    s.heap.clear();
    s.taken.assign(static_cast<size_t>(t.size() + params.max_new), 0);
  }

  void run() {
    rescore(kRelevance * nth_largest(t_.f, t_.size(), params_.max_new, s_.best));
    init_best();
    push_next(0, 0);
    if (params_.from_every_node) {
      for (int32_t v : s_.relevant) push_next(v, 0);
    }
    while (!s_.heap.empty() && added_ < params_.max_new) {
      std::pop_heap(s_.heap.begin(), s_.heap.end(), after);
      const Edge e = s_.heap.back();
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
  static constexpr uint64_t kMasked = uint64_t{1} << 63;  // taken[v]: the children's ranks are in

  // The candidates after node v: the row of (its parent's token, its token) when there is one (the model
  // read that pair before: what it predicted then says more than the token's row), else its token's.
  // *pair: whether it is a pair's row (its ranks are calibrated apart, recycled_match).
  int32_t row_of(int32_t v, const int32_t** ids, const float** probs, bool* pair) const {
    const int32_t a = v == 0 ? params_.root_prev : t_.tokens[t_.parents[v]];
    const int32_t c = table_.lookup_pair(a, t_.tokens[v], ids, probs);
    *pair = c > 0;
    return c > 0 ? c : table_.lookup(t_.tokens[v], ids, probs);
  }
  float p_of(int32_t source, int32_t depth, int32_t match, float raw) const {
    return cal_ != nullptr ? cal_->apply(source, depth, match, raw) : raw;
  }
  bool good(double f) const { return f >= params_.min_f && f > floor_; }

  // Every relevant retrieval node (f >= relevant, match shorter than kRescoreMaxMatch) whose token is in
  // its parent's row gets p = cal(kRescoredSource, depth, recycled_match(its rank), its retrieval p);
  // then its f estimate follows (parents first). The relevant nodes are listed in s_.relevant.
  void rescore(double relevant) {
    s_.relevant.clear();
    const int32_t* ids = nullptr;
    const float* probs = nullptr;
    for (int32_t v = 1; v < t_.size(); ++v) {
      if (t_.f[v] < relevant) continue;
      s_.relevant.push_back(v);
      const int32_t u = t_.parents[v];
      bool pair = false;
      const int32_t count = row_of(u, &ids, &probs, &pair);
      if (count > 0 && t_.source[v] >= 0 && t_.source[v] < kNumTrieSources && t_.match_len[v] < kRescoreMaxMatch) {
        const auto j = static_cast<int32_t>(std::find(ids, ids + count, t_.tokens[v]) - ids);
        if (j < count) {  // absent from the row: the retrieval score stands (see the header)
          const int32_t match = recycled_match(j, pair);
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
  void push_next(int32_t v, int32_t j) {
    const int32_t d = t_.depth[v] + 1;
    if (d > params_.max_depth || !good(t_.f[v] * s_.bound[static_cast<size_t>(d)])) return;
    const int32_t* ids = nullptr;
    const float* probs = nullptr;
    bool pair = false;
    const int32_t count = row_of(v, &ids, &probs, &pair);
    uint64_t& taken = s_.taken[static_cast<size_t>(v)];
    if (count > 0 && !(taken & kMasked)) {  // the ranks of v's children, once
      for (int32_t c = t_.first_child[v]; c >= 0; c = t_.next_sibling[c]) {
        const auto r = static_cast<int32_t>(std::find(ids, ids + count, t_.tokens[c]) - ids);
        if (r < count) taken |= uint64_t{1} << r;
      }
      taken |= kMasked;
    }
    while (j < count && (taken >> j & 1u) != 0) ++j;
    if (j >= count) return;
    const double f = t_.f[v] * static_cast<double>(p_of(kRecycledSource, d, recycled_match(j, pair), probs[j]));
    if (good(f)) {
      s_.heap.push_back({f, v, j});
      std::push_heap(s_.heap.begin(), s_.heap.end(), after);
    }
  }

  void take(const Edge& e) {
    const int32_t* ids = nullptr;
    const float* probs = nullptr;
    bool pair = false;
    row_of(e.node, &ids, &probs, &pair);
    s_.taken[static_cast<size_t>(e.node)] |= uint64_t{1} << e.rank;
    push_next(e.node, e.rank + 1);
    const int32_t v = t_.new_child(e.node, ids[e.rank]);
    s_.taken[static_cast<size_t>(v)] = kMasked;  // no children
    ++added_;
    t_.source[v] = static_cast<int8_t>(kRecycledSource);
    t_.raw[v] = probs[e.rank];
    t_.match_len[v] = recycled_match(e.rank, pair);
    t_.p[v] = p_of(kRecycledSource, t_.depth[v], t_.match_len[v], probs[e.rank]);
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
