#include "core/draft_tree.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>

namespace sssd {

void CandidateTree::reset(int32_t root_token) {
  tokens.assign(1, root_token);
  parents.assign(1, -1);
  depth.assign(1, 0);
  match_len.assign(1, 0);
  p.assign(1, 1.0f);
  raw.assign(1, 1.0f);
  f.assign(1, 1.0);
  source.assign(1, -1);
  source_mask.assign(1, 0);
  first_child.assign(1, -1);
  next_sibling.assign(1, -1);
}

int32_t CandidateTree::child(int32_t node, int32_t token) {
  for (int32_t c = first_child[node]; c >= 0; c = next_sibling[c]) {
    if (tokens[c] == token) return c;
  }
  return new_child(node, token);
}

int32_t CandidateTree::new_child(int32_t node, int32_t token) {
  const int32_t c = size();
  tokens.push_back(token);
  parents.push_back(node);
  depth.push_back(depth[node] + 1);
  match_len.push_back(0);
  p.push_back(0.0f);
  raw.push_back(0.0f);
  f.push_back(0.0);
  source.push_back(-1);
  source_mask.push_back(0);
  first_child.push_back(-1);
  next_sibling.push_back(first_child[node]);
  first_child[node] = c;
  return c;
}

void fuse(const CandidateTrie* const tries[kNumSources], const Calibration* cal, const FusionParams& params,
          CandidateTree& out) {
  int32_t root = -1;
  for (int32_t s = 0; s < kNumSources; ++s) {
    if (tries[s] != nullptr && tries[s]->size() > 0) root = tries[s]->tokens[0];
  }
  out.reset(root);
  // The first source is copied without sibling searches (a trie has no duplicate children); the
  // datastore, usually the largest trie, goes first.
  static thread_local std::vector<int32_t> map;
  bool empty = true;
  for (int32_t s : {1, 0, 2}) {
    const CandidateTrie* t = tries[s];
    if (t == nullptr || t->size() <= 1) continue;
    const bool copy = empty;
    empty = false;
    map.assign(static_cast<size_t>(t->size()), -1);
    map[0] = 0;
    for (int32_t i = 1; i < t->size(); ++i) {
      const int32_t fp = map[static_cast<size_t>(t->parents[i])];
      if (fp < 0 || t->depth[i] > params.max_depth) continue;
      const float raw = static_cast<float>(t->counts[i]) /
                        (static_cast<float>(t->counts[t->parents[i]]) + params.alpha);
      const float ps = cal != nullptr ? cal->apply(s, t->depth[i], t->match_len[i], raw) : raw;
      const double fv = out.f[fp] * static_cast<double>(ps);
      if (fv < params.min_f) continue;  // its subtree is skipped too (map stays -1)
      const int32_t v = copy ? out.new_child(fp, t->tokens[i]) : out.child(fp, t->tokens[i]);
      map[static_cast<size_t>(i)] = v;
      out.f[v] = std::max(out.f[v], fv);
      const bool first = out.source_mask[v] == 0;
      if (first || ps > out.p[v]) {
        out.source[v] = static_cast<int8_t>(s);
        out.raw[v] = raw;
        out.match_len[v] = t->match_len[i];
      }
      if (params.noisy_or && !first) {
        out.p[v] = 1.0f - (1.0f - out.p[v]) * (1.0f - ps);
      } else {
        out.p[v] = std::max(out.p[v], ps);
      }
      out.source_mask[v] |= static_cast<uint8_t>(1u << s);
    }
  }
  // Sibling sums above 1 are impossible for a deterministic verifier (at most one child is accepted).
  for (int32_t v = 0; v < out.size(); ++v) {
    float sum = 0.0f;
    for (int32_t c = out.first_child[v]; c >= 0; c = out.next_sibling[c]) sum += out.p[c];
    if (sum > 1.0f) {
      for (int32_t c = out.first_child[v]; c >= 0; c = out.next_sibling[c]) out.p[c] /= sum;
    }
  }
  for (int32_t v = 1; v < out.size(); ++v) out.f[v] = out.f[out.parents[v]] * static_cast<double>(out.p[v]);
}

namespace {
struct Frontier {
  double f;
  int32_t node;
  bool operator<(const Frontier& o) const { return f != o.f ? f < o.f : node > o.node; }  // max-heap
};
}  // namespace

void select_sequence(const int32_t* parents, const double* f, const int32_t* depth, int32_t n, int32_t cap,
                     int32_t max_depth, int32_t max_width, std::vector<int32_t>& seq) {
  seq.clear();
  if (n <= 1 || cap <= 0) return;
  // Children lists (CSR), in index order.
  static thread_local std::vector<int32_t> start, kids, fill, width;
  start.assign(static_cast<size_t>(n) + 1, 0);
  kids.resize(static_cast<size_t>(n));
  for (int32_t i = 1; i < n; ++i) ++start[static_cast<size_t>(parents[i]) + 1];
  for (int32_t i = 0; i < n; ++i) start[static_cast<size_t>(i) + 1] += start[static_cast<size_t>(i)];
  fill.assign(start.begin(), start.end() - 1);
  for (int32_t i = 1; i < n; ++i) kids[static_cast<size_t>(fill[static_cast<size_t>(parents[i])]++)] = i;
  width.assign(static_cast<size_t>(std::max(max_depth, 0)) + 2, 0);
  static thread_local std::vector<Frontier> heap;
  heap.clear();
  auto push_children = [&](int32_t v) {
    for (int32_t k = start[static_cast<size_t>(v)]; k < start[static_cast<size_t>(v) + 1]; ++k) {
      const int32_t c = kids[static_cast<size_t>(k)];
      if (depth[c] <= max_depth) {
        heap.push_back({f[c], c});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  };
  push_children(0);
  while (!heap.empty() && static_cast<int32_t>(seq.size()) < cap) {
    std::pop_heap(heap.begin(), heap.end());
    const int32_t v = heap.back().node;
    heap.pop_back();
    int32_t& w = width[static_cast<size_t>(depth[v])];
    if (max_width > 0 && w >= max_width) continue;
    ++w;
    seq.push_back(v);
    push_children(v);
  }
}

void allocate_budget(const std::vector<const double*>& seq_f, const std::vector<int32_t>& len, int64_t budget,
                     const double* tpot, double step_time, double slack, std::vector<int32_t>& order) {
  order.clear();
  const auto b = static_cast<int32_t>(len.size());
  std::vector<int32_t> taken(static_cast<size_t>(b), 0);
  auto left = [&](int32_t i) { return taken[static_cast<size_t>(i)] < len[static_cast<size_t>(i)]; };
  auto next_f = [&](int32_t i) { return seq_f[static_cast<size_t>(i)][taken[static_cast<size_t>(i)]]; };
  using Item = std::pair<double, int32_t>;  // (key, -tree) so ties go to the lower tree index
  if (tpot != nullptr) {
    std::priority_queue<Item> need;
    std::vector<double> expected(static_cast<size_t>(b), 1.0);
    auto need_of = [&](int32_t i) { return (step_time + slack) / tpot[i] - expected[static_cast<size_t>(i)]; };
    for (int32_t i = 0; i < b; ++i) {
      if (tpot[i] > 0 && std::isfinite(tpot[i]) && left(i) && need_of(i) > 0) need.push({need_of(i), -i});
    }
    while (!need.empty() && static_cast<int64_t>(order.size()) < budget) {
      const int32_t i = -need.top().second;
      need.pop();
      expected[static_cast<size_t>(i)] += next_f(i);
      ++taken[static_cast<size_t>(i)];
      order.push_back(i);
      if (left(i) && need_of(i) > 0) need.push({need_of(i), -i});
    }
  }
  std::priority_queue<Item> heap;
  for (int32_t i = 0; i < b; ++i) {
    if (left(i)) heap.push({next_f(i), -i});
  }
  while (!heap.empty() && static_cast<int64_t>(order.size()) < budget) {
    const int32_t i = -heap.top().second;
    heap.pop();
    ++taken[static_cast<size_t>(i)];
    order.push_back(i);
    if (left(i)) heap.push({next_f(i), -i});
  }
}

}  // namespace sssd
