// A count-weighted trie of candidate continuations, stored flat in creation order (so parents[i] < i).
// Node 0 is the root: the context's last token (or -1 for an empty context), depth 0, parent -1; its
// count is the number of continuations inserted. A node's count is the number of inserted continuations
// that pass through it; match_len is the length of the context suffix whose match produced it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace sssd {

class CandidateTrie {
 public:
  void reset(int32_t root_token) {
    tokens.assign(1, root_token);
    parents.assign(1, -1);
    counts.assign(1, 0);
    depth.assign(1, 0);
    match_len.assign(1, 0);
    first_child_.assign(1, -1);
    next_sibling_.assign(1, -1);
  }
  int32_t size() const { return static_cast<int32_t>(tokens.size()); }

  // Returns the child of `node` labelled `token`, creating it (with this match length) if needed, and
  // adds `weight` to its count. Sibling lists are short (bounded by the samples), so a scan is fastest.
  int32_t add_child(int32_t node, int32_t token, int32_t weight, int32_t match_length) {
    int32_t c = first_child_[node];
    for (; c >= 0; c = next_sibling_[c]) {
      if (tokens[c] == token) break;
    }
    if (c < 0) {
      c = size();
      tokens.push_back(token);
      parents.push_back(node);
      counts.push_back(0);
      depth.push_back(depth[node] + 1);
      match_len.push_back(match_length);
      first_child_.push_back(-1);
      next_sibling_.push_back(first_child_[node]);
      first_child_[node] = c;
    }
    counts[c] += weight;
    return c;
  }

  // Appends a child of `node` that the caller knows does not exist yet (no sibling scan).
  int32_t add_new_child(int32_t node, int32_t token, int32_t weight, int32_t match_length) {
    const int32_t c = size();
    tokens.push_back(token);
    parents.push_back(node);
    counts.push_back(weight);
    depth.push_back(depth[node] + 1);
    match_len.push_back(match_length);
    first_child_.push_back(-1);
    next_sibling_.push_back(first_child_[node]);
    first_child_[node] = c;
    return c;
  }

  // Room for `extra` more nodes without reallocating.
  void reserve_more(int32_t extra) {
    const size_t n = tokens.size() + static_cast<size_t>(extra);
    if (n <= tokens.capacity()) return;
    const size_t cap = std::max(n, 2 * tokens.capacity());
    for (auto* v : {&tokens, &parents, &counts, &depth, &match_len, &first_child_, &next_sibling_}) {
      v->reserve(cap);
    }
  }

  std::vector<int32_t> tokens, parents, counts, depth, match_len;  // [size()] each

 private:
  std::vector<int32_t> first_child_, next_sibling_;
};

}  // namespace sssd
