// Binary max-heaps in a vector, for an order O: O::Item the item type, O::first(a, b) true when a comes
// before b (a strict order). Shared by the drafter's best-first selections (draft_tree.cpp,
// recycled.cpp).
#pragma once
#include <cstddef>
#include <vector>

namespace sssd::heap {

template <class O>
void sift_down(std::vector<typename O::Item>& h, size_t i) {
  const size_t n = h.size();
  const auto x = h[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    c += static_cast<size_t>(c + 1 < n && O::first(h[c + 1], h[c]));
    if (!O::first(h[c], x)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = x;
}
template <class O>
void sift_up(std::vector<typename O::Item>& h, size_t i) {
  const auto x = h[i];
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (!O::first(x, h[parent])) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = x;
}
template <class O>
void heap_push(std::vector<typename O::Item>& h, typename O::Item x) {
  h.push_back(x);
  sift_up<O>(h, h.size() - 1);
}
// Replaces the top by x (or removes it when x is null) in one sift.
template <class O>
void heap_replace_top(std::vector<typename O::Item>& h, const typename O::Item* x) {
  if (x != nullptr) {
    h[0] = *x;
  } else {
    h[0] = h.back();
    h.pop_back();
    if (h.empty()) return;
  }
  sift_down<O>(h, 0);
}

}  // namespace sssd::heap
