#include "core/recycled.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sssd {

RecycledTable::RecycledTable(int32_t k, uint64_t vocab)
    : k_(k), max_rows_(vocab > 0 ? vocab : kMaxUnsizedRows) {
  if (k < 1 || k > kMaxRecycledK) {
    throw std::invalid_argument("recycled k must be in [1, " + std::to_string(kMaxRecycledK) + "]");
  }
}

void RecycledTable::update(const int32_t* tokens, int64_t n, const int32_t* ids, const float* probs, int32_t width) {
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
  for (int64_t i = 0; i < n; ++i) {
    const auto row = static_cast<uint64_t>(tokens[i]);
    if (tokens[i] < 0 || row >= count_.size()) continue;
    recorded_ += count_[row] == 0;
    count_[row] = static_cast<uint8_t>(w);
    std::copy_n(ids + i * width, w, ids_.data() + row * static_cast<uint64_t>(k_));
    std::copy_n(probs + i * width, w, probs_.data() + row * static_cast<uint64_t>(k_));
  }
}

void RecycledTable::clear() {
  std::vector<int32_t>().swap(ids_);
  std::vector<float>().swap(probs_);
  std::vector<uint8_t>().swap(count_);
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

// The max_new-th largest f among the tree's non-root nodes (0 when there are fewer).
double cap_threshold(const CandidateTree& t, int32_t max_new, std::vector<double>& f) {
  const int32_t n = t.size() - 1;
  if (max_new <= 0 || n < max_new) return 0.0;
  f.assign(t.f.begin() + 1, t.f.begin() + 1 + n);
  std::nth_element(f.begin(), f.begin() + (max_new - 1), f.end(), [](double a, double b) { return a > b; });
  return f[static_cast<size_t>(max_new - 1)];
}

// One expansion: the tree, the table and the heap of candidate edges (node, rank).
class Expander {
 public:
  Expander(const RecycledTable& table, const Calibration* cal, const RecycleParams& params, CandidateTree& t,
           RecycleScratch& s)
      : table_(table), cal_(cal), params_(params), t_(t), s_(s) {
    depth_bounds(cal, params.max_depth, s.bound);
    s.heap.clear();
  }

  void run() {
    rescore();
    floor_ = std::max(params_.min_f, cap_threshold(t_, params_.max_new, s_.f_sorted));
    for (int32_t v = 0, n = params_.from_every_node ? t_.size() : 1; v < n; ++v) push_all(v);
    while (!s_.heap.empty() && added_ < params_.max_new) {
      std::pop_heap(s_.heap.begin(), s_.heap.end(), after);
      const Edge e = s_.heap.back();
      s_.heap.pop_back();
      take(e);
    }
  }

 private:
  float p_of(int32_t source, int32_t depth, int32_t match, float raw) const {
    return cal_ != nullptr ? cal_->apply(source, depth, match, raw) : raw;
  }
  bool good(double f) const { return f >= params_.min_f && f > floor_; }

  // Every retrieval node whose parent's token has a row gets p = cal(kRescoredSource, depth, 1 + its rank
  // in the row (kAbsentRank + 1 when absent), its retrieval p); then f estimates follow (parents first).
  void rescore() {
    const int32_t* ids = nullptr;
    const float* probs = nullptr;
    for (int32_t v = 1; v < t_.size(); ++v) {
      const int32_t u = t_.parents[v];
      const int32_t count = t_.source[v] >= 0 && t_.source[v] < kNumTrieSources ? table_.lookup(t_.tokens[u], &ids, &probs) : 0;
      if (count > 0) {
        int32_t j = 0;
        while (j < count && ids[j] != t_.tokens[v]) ++j;
        const int32_t match = j < count ? j + 1 : kAbsentRank + 1;
        t_.raw[v] = t_.p[v];
        t_.p[v] = p_of(kRescoredSource, t_.depth[v], match, t_.p[v]);
        t_.source[v] = static_cast<int8_t>(kRescoredSource);
        t_.match_len[v] = match;
        if (j < count) t_.source_mask[v] |= static_cast<uint8_t>(1u << kRecycledSource);
      }
      t_.f[v] = t_.f[u] * static_cast<double>(t_.p[v]);
    }
  }

  // Pushes every new candidate after node v that could make the cut (a token v already has as a child
  // was rescored instead).
  void push_all(int32_t v) {
    const int32_t d = t_.depth[v] + 1;
    if (d > params_.max_depth || !good(t_.f[v] * s_.bound[static_cast<size_t>(d)])) return;
    const int32_t* ids = nullptr;
    const float* probs = nullptr;
    const int32_t count = table_.lookup(t_.tokens[v], &ids, &probs);
    for (int32_t j = 0; j < count; ++j) {
      const double f = t_.f[v] * static_cast<double>(p_of(kRecycledSource, d, j + 1, probs[j]));
      if (good(f) && t_.find_child(v, ids[j]) < 0) {
        s_.heap.push_back({f, v, j});
        std::push_heap(s_.heap.begin(), s_.heap.end(), after);
      }
    }
  }

  void take(const Edge& e) {
    const int32_t* ids = nullptr;
    const float* probs = nullptr;
    table_.lookup(t_.tokens[e.node], &ids, &probs);
    if (t_.find_child(e.node, ids[e.rank]) >= 0) return;  // duplicate ids in a row
    const int32_t v = t_.new_child(e.node, ids[e.rank]);
    ++added_;
    t_.source[v] = static_cast<int8_t>(kRecycledSource);
    t_.raw[v] = probs[e.rank];
    t_.match_len[v] = e.rank + 1;
    t_.p[v] = p_of(kRecycledSource, t_.depth[v], e.rank + 1, probs[e.rank]);
    t_.source_mask[v] = static_cast<uint8_t>(1u << kRecycledSource);
    t_.f[v] = e.f;
    push_all(v);
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
