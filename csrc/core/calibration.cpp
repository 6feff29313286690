#include "core/calibration.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>

namespace sssd {

namespace {
void check_edges(const std::vector<int32_t>& e, const char* what) {
  if (e.empty() || e[0] > 1) throw std::invalid_argument(std::string(what) + " must start at a value <= 1");
  for (size_t i = 1; i < e.size(); ++i) {
    if (e[i] <= e[i - 1]) throw std::invalid_argument(std::string(what) + " must be strictly increasing");
  }
}
}  // namespace

void isotonic_fit(const double* y, const double* w, int32_t n, double* out) {
  // Blocks of the stack: value, weight, length (reused buffers: refits run on every observe()).
  static thread_local std::vector<double> val, wt;
  static thread_local std::vector<int32_t> len;
  val.clear();
  wt.clear();
  len.clear();
  for (int32_t i = 0; i < n; ++i) {
    val.push_back(y[i]);
    wt.push_back(w[i]);
    len.push_back(1);
    while (val.size() > 1 && val[val.size() - 2] > val.back()) {
      const size_t b = val.size() - 1;
      const double tw = wt[b - 1] + wt[b];
      val[b - 1] = tw > 0 ? (val[b - 1] * wt[b - 1] + val[b] * wt[b]) / tw : 0.5 * (val[b - 1] + val[b]);
      wt[b - 1] = tw;
      len[b - 1] += len[b];
      val.pop_back();
      wt.pop_back();
      len.pop_back();
    }
  }
  int32_t k = 0;
  for (size_t b = 0; b < val.size(); ++b) {
    for (int32_t j = 0; j < len[b]; ++j) out[k++] = val[b];
  }
}

namespace {
std::atomic<uint64_t> g_versions{0};
uint64_t next_version() { return g_versions.fetch_add(1, std::memory_order_relaxed) + 1; }
}  // namespace

Calibration::Calibration(std::vector<int32_t> depth_edges, std::vector<int32_t> match_edges, int32_t num_knots)
    : depth_edges_(std::move(depth_edges)), match_edges_(std::move(match_edges)), num_knots_(num_knots) {
  check_edges(depth_edges_, "depth_edges");
  check_edges(match_edges_, "match_edges");
  if (num_knots_ < 2 || num_knots_ > 1001) throw std::invalid_argument("num_knots must be in [2, 1001]");
  // A bound on the table (the shipped one has 3 * 7 * 6 * 11 entries) so that absurd bin lists are
  // a clear error, not a multi-gigabyte allocation.
  if (depth_edges_.size() > 4096 || match_edges_.size() > 4096 ||
      depth_edges_.size() * match_edges_.size() * static_cast<size_t>(num_knots_) > (size_t{1} << 22)) {
    throw std::invalid_argument("calibration table too large: at most 4096 depth and match bins and 2^22 "
                                "(bin, knot) entries per source");
  }
  for (int32_t v = 0; v < kLut; ++v) {
    depth_lut_.push_back(bin(depth_edges_, v));
    match_lut_.push_back(bin(match_edges_, v));
  }
  const size_t groups = static_cast<size_t>(kNumSources) * depth_edges_.size() * match_edges_.size();
  values_.resize(groups * static_cast<size_t>(num_knots_));
  weights_.assign(values_.size(), 1e-3);
  successes_.resize(values_.size());
  for (size_t i = 0; i < values_.size(); ++i) {
    values_[i] = static_cast<float>(i % static_cast<size_t>(num_knots_)) / static_cast<float>(num_knots_ - 1);
    successes_[i] = values_[i] * weights_[i];
  }
  dirty_.assign(groups, 0);
  version_ = next_version();
}

void Calibration::set(const std::vector<float>& values, const std::vector<double>& weights) {
  if (values.size() != values_.size() || weights.size() != values_.size()) {
    throw std::invalid_argument("calibration table has " + std::to_string(values.size()) + " values and " +
                                std::to_string(weights.size()) + " weights, expected " +
                                std::to_string(values_.size()));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!(values[i] >= 0.0f && values[i] <= 1.0f)) throw std::invalid_argument("calibration values must lie in [0, 1]");
    if (!(weights[i] >= 0.0) || !std::isfinite(weights[i])) {
      throw std::invalid_argument("calibration weights must be finite and >= 0");
    }
    values_[i] = values[i];
    weights_[i] = std::max(weights[i], 1e-3);  // every knot keeps a trace of its prior value
    successes_[i] = values_[i] * weights_[i];
  }
  for (int32_t g = 0; g < static_cast<int32_t>(dirty_.size()); ++g) refit(g);
}

int32_t Calibration::bin(const std::vector<int32_t>& edges, int32_t v) {
  const auto it = std::upper_bound(edges.begin(), edges.end(), v);
  return std::max<int32_t>(0, static_cast<int32_t>(it - edges.begin()) - 1);
}

void Calibration::observe(int32_t source, int32_t depth, int32_t match_len, float raw, float accepted, double weight) {
  if (!(weight >= 0.0) || !std::isfinite(weight) || !(accepted >= 0.0f && accepted <= 1.0f)) return;
  if (source < 0 || source >= kNumSources) return;
  const int32_t g = group(source, depth, match_len);
  const size_t base = static_cast<size_t>(g) * num_knots_;
  const double t = (raw > 0.0f ? std::min(static_cast<double>(raw), 1.0) : 0.0) * (num_knots_ - 1);
  const int32_t k = std::min(static_cast<int32_t>(t), num_knots_ - 2);
  const double a = t - k;
  weights_[base + k] += (1 - a) * weight;
  successes_[base + k] += (1 - a) * weight * accepted;
  weights_[base + k + 1] += a * weight;
  successes_[base + k + 1] += a * weight * accepted;
  if (!dirty_[static_cast<size_t>(g)]) {
    dirty_[static_cast<size_t>(g)] = 1;
    dirty_list_.push_back(g);
  }
}

void Calibration::refit_dirty() {
  for (int32_t g : dirty_list_) {
    refit(g);
    dirty_[static_cast<size_t>(g)] = 0;
  }
  dirty_list_.clear();
}

void Calibration::refit(int32_t g) {
  const size_t base = static_cast<size_t>(g) * num_knots_;
  double y[1001], out[1001];
  for (int32_t k = 0; k < num_knots_; ++k) y[k] = successes_[base + k] / weights_[base + k];
  isotonic_fit(y, weights_.data() + base, num_knots_, out);
  for (int32_t k = 0; k < num_knots_; ++k) values_[base + k] = static_cast<float>(std::min(std::max(out[k], 0.0), 1.0));
  version_ = next_version();
}

}  // namespace sssd
