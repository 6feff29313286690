// Calibration of raw node scores: a monotone piecewise-linear map raw -> p per group (source, depth
// bin, match-length bin), on fixed knots x_k = k / (K - 1) (fixed spacing: nothing to validate
// per update). Online updates add soft-binned observations to the knots' (successes, weights) and refit
// only the touched groups with pool-adjacent-violators, so an update costs O(observations + touched
// groups * K). The Python side (sssd.calibration) owns the JSON format and the offline fit.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace sssd {

// Sources of draft nodes, each with its own calibration groups: 0 input, 1 datastore, 2 recent-outputs
// pool (the retrieval sources, whose candidates come as tries); 3 recycled candidates (the verifier's own
// top-k, core/recycled.h) and 4 a retrieval candidate rescored with them (from its retrieval p and its
// rank among them). For 3 and 4 the match-length feature is recycled_match(rank, pair) (kAbsentRank + 1:
// not among them).
constexpr int32_t kNumTrieSources = 3;
constexpr int32_t kRecycledSource = 3;
constexpr int32_t kRescoredSource = 4;
constexpr int32_t kAbsentRank = 63;
constexpr int32_t kNumSources = 5;
// The match-length feature of a recycled candidate of rank j (0: best): 1 + j in a token's row (ranks past
// kPairRankBase - 1 share the last value), kPairRankBase + 1 + j in a (previous token, token) pair's row
// (up to kPairRankBase ranks): with the default match bins, the two kinds of rows fall in groups of
// their own (a pair's row is the model's prediction after a longer context: it is right more often).
constexpr int32_t kPairRankBase = 8;
// A stale row's candidates (written before the request began: what the model predicted in other texts)
// have this value whatever their rank: a group of their own with the default bins (they are right less
// often than the rows of the request's own text).
constexpr int32_t kStaleRowMatch = 2 * kPairRankBase + 1;
inline int32_t recycled_match(int32_t rank, bool pair, bool stale = false) {
  if (stale) return kStaleRowMatch;
  return pair ? kPairRankBase + 1 + std::min(rank, kPairRankBase - 1) : 1 + std::min(rank, kPairRankBase - 1);
}

class Calibration {
 public:
  // Identity map (p = raw) with the given bins. depth_edges / match_edges are the lower bounds of
  // the bins (increasing, first <= 1); num_knots >= 2.
  Calibration(std::vector<int32_t> depth_edges, std::vector<int32_t> match_edges, int32_t num_knots);
  Calibration() : Calibration({1, 2, 3, 4, 6, 9, 13}, {1, 2, 3, 5, 9, 17}, 11) {}

  int32_t num_depth() const { return static_cast<int32_t>(depth_edges_.size()); }
  int32_t num_match() const { return static_cast<int32_t>(match_edges_.size()); }
  int32_t num_knots() const { return num_knots_; }
  int64_t table_size() const { return static_cast<int64_t>(values_.size()); }
  const std::vector<int32_t>& depth_edges() const { return depth_edges_; }
  const std::vector<int32_t>& match_edges() const { return match_edges_; }
  const std::vector<float>& values() const { return values_; }       // [S, D, M, K]
  const std::vector<double>& weights() const { return weights_; }    // [S, D, M, K]
  const std::vector<double>& successes() const { return successes_; }
  // Names the table's current values: a new number whenever they change (from one counter for all
  // tables, so two tables share a number only when one is a copy of the other, unchanged since). A
  // cache of anything computed from the values (the recycled source's depth bounds) keys on it.
  uint64_t version() const { return version_; }

  // Replaces the table: values (monotone per group after refit) with prior weights. Sizes must match.
  void set(const std::vector<float>& values, const std::vector<double>& weights);

  // Inline: apply runs for every candidate node of every request at every step.
  int32_t group(int32_t source, int32_t depth, int32_t match_len) const {
    const int32_t d = depth >= 0 && depth < kLut ? depth_lut_[static_cast<size_t>(depth)] : bin(depth_edges_, depth);
    const int32_t m = match_len >= 0 && match_len < kLut ? match_lut_[static_cast<size_t>(match_len)]
                                                         : bin(match_edges_, match_len);
    return (source * num_depth() + d) * num_match() + m;
  }
  float apply(int32_t source, int32_t depth, int32_t match_len, float raw) const {
    return apply_group(group(source, depth, match_len), raw);
  }
  // apply of a group found before (group(...)).
  float apply_group(int32_t g, float raw) const {
    const float* v = values_.data() + static_cast<size_t>(g) * num_knots_;
    // max(0, raw) (in this order) sends NaN to 0: a NaN knot index would be UB. Still branchless.
    const float t = std::min(std::max(0.0f, raw), 1.0f) * static_cast<float>(num_knots_ - 1);
    const int32_t k = std::min(static_cast<int32_t>(t), num_knots_ - 2);
    const float a = t - static_cast<float>(k);
    return v[k] + a * (v[k + 1] - v[k]);
  }

  // Adds one observation (accepted = 0/1) with the given weight; the group is refit by refit_dirty().
  // A NaN raw counts as 0; a NaN or negative weight or accepted outside [0, 1] is ignored (the
  // bindings reject them earlier; this keeps the table finite whatever a caller passes).
  void observe(int32_t source, int32_t depth, int32_t match_len, float raw, float accepted, double weight = 1.0);
  void refit_dirty();

 private:
  void refit(int32_t g);
  static int32_t bin(const std::vector<int32_t>& edges, int32_t v);  // index of the last edge <= v
  static constexpr int32_t kLut = 128;  // bin lookup tables for depth / match length < kLut
  std::vector<int32_t> depth_edges_, match_edges_, depth_lut_, match_lut_;
  int32_t num_knots_;
  std::vector<float> values_;
  uint64_t version_;
  std::vector<double> weights_, successes_;
  std::vector<uint8_t> dirty_;
  std::vector<int32_t> dirty_list_;
};

// Pool-adjacent-violators: the non-decreasing sequence closest to y in weighted least squares.
void isotonic_fit(const double* y, const double* w, int32_t n, double* out);

}  // namespace sssd
