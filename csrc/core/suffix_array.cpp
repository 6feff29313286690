#include "core/suffix_array.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <vector>

namespace sssd {
namespace {

// One bit per position: true = S-type (the suffix is smaller than the next one).
class TypeBits {
 public:
  explicit TypeBits(int64_t n) : words_(static_cast<size_t>(n / 64 + 1), 0) {}
  bool s_type(int64_t i) const { return (words_[i >> 6] >> (i & 63)) & 1u; }
  void set_s(int64_t i) { words_[i >> 6] |= uint64_t{1} << (i & 63); }

 private:
  std::vector<uint64_t> words_;
};

template <class Char, class Idx>
void bucket_bounds(const Char* s, Idx n, Idx k, Idx* bkt, bool ends) {
  std::fill(bkt, bkt + k, Idx{0});
  for (Idx i = 0; i < n; ++i) ++bkt[s[i]];
  Idx sum = 0;
  for (Idx c = 0; c < k; ++c) {
    sum += bkt[c];
    bkt[c] = ends ? sum : sum - bkt[c];
  }
}

// Induces the order of L-type suffixes from the seeds already in sa, then of S-type suffixes.
template <class Char, class Idx>
void induce(const Char* s, Idx* sa, Idx n, Idx k, const TypeBits& t, Idx* bkt) {
  bucket_bounds(s, n, k, bkt, false);
  sa[bkt[s[n - 1]]++] = n - 1;  // the virtual sentinel's predecessor is L-type
  for (Idx i = 0; i < n; ++i) {
    const Idx j = sa[i] - 1;
    if (sa[i] > 0 && !t.s_type(j)) sa[bkt[s[j]]++] = j;
  }
  bucket_bounds(s, n, k, bkt, true);
  for (Idx i = n - 1; i >= 0; --i) {
    const Idx j = sa[i] - 1;
    if (sa[i] > 0 && t.s_type(j)) sa[--bkt[s[j]]] = j;
  }
}

template <class Char, class Idx>
void sais(const Char* s, Idx* sa, Idx n, Idx k) {
  if (n == 0) return;
  if (n == 1) {
    sa[0] = 0;
    return;
  }
  TypeBits t(n);  // s[n-1] is L-type: it is larger than the virtual sentinel
  for (Idx i = n - 2; i >= 0; --i) {
    if (s[i] < s[i + 1] || (s[i] == s[i + 1] && t.s_type(i + 1))) t.set_s(i);
  }
  auto is_lms = [&](Idx i) { return i > 0 && t.s_type(i) && !t.s_type(i - 1); };

  // Stage 1: sort the LMS substrings by one induced pass from LMS seeds in arbitrary order.
  std::vector<Idx> bkt(static_cast<size_t>(k));
  bucket_bounds(s, n, k, bkt.data(), true);
  std::fill(sa, sa + n, Idx{-1});
  for (Idx i = 1; i < n; ++i) {
    if (is_lms(i)) sa[--bkt[s[i]]] = i;
  }
  induce(s, sa, n, k, t, bkt.data());

  Idx n1 = 0;  // compact the sorted LMS positions into sa[0, n1)
  for (Idx i = 0; i < n; ++i) {
    if (is_lms(sa[i])) sa[n1++] = sa[i];
  }

  // Name the LMS substrings; equal substrings get equal names. LMS positions are >= 2 apart, so
  // sa[n1 + pos / 2] gives each one its own slot.
  auto same_substring = [&](Idx a, Idx b) {
    for (Idx d = 0;; ++d) {
      if (a + d == n || b + d == n) return false;  // reaches the unique sentinel
      if (s[a + d] != s[b + d] || t.s_type(a + d) != t.s_type(b + d)) return false;
      if (d > 0) {
        const bool la = is_lms(a + d), lb = is_lms(b + d);
        if (la || lb) return la && lb;
      }
    }
  };
  std::fill(sa + n1, sa + n, Idx{-1});
  Idx names = 0, prev = -1;
  for (Idx i = 0; i < n1; ++i) {
    const Idx pos = sa[i];
    if (prev < 0 || !same_substring(pos, prev)) ++names;
    prev = pos;
    sa[n1 + pos / 2] = names - 1;
  }
  for (Idx i = n - 1, j = n - 1; i >= n1; --i) {
    if (sa[i] >= 0) sa[j--] = sa[i];
  }

  // Stage 2: sort the reduced string (names in text order), recursively when names repeat.
  Idx* s1 = sa + n - n1;
  if (names < n1) {
    sais<Idx, Idx>(s1, sa, n1, names);
  } else {
    for (Idx i = 0; i < n1; ++i) sa[s1[i]] = i;
  }

  // Stage 3: seed the sorted LMS suffixes at their bucket ends and induce the full order.
  for (Idx i = 1, j = 0; i < n; ++i) {
    if (is_lms(i)) s1[j++] = i;
  }
  for (Idx i = 0; i < n1; ++i) sa[i] = s1[sa[i]];
  std::fill(sa + n1, sa + n, Idx{-1});
  bucket_bounds(s, n, k, bkt.data(), true);
  for (Idx i = n1 - 1; i >= 0; --i) {
    const Idx p = sa[i];
    sa[i] = -1;
    sa[--bkt[s[p]]] = p;
  }
  induce(s, sa, n, k, t, bkt.data());
}

template <class Char, class Idx>
void build(const Char* text, Idx* sa, int64_t n, int64_t alphabet) {
  if (n < 0 || alphabet < 1) throw std::invalid_argument("build_suffix_array: bad size or alphabet");
  const auto limit = static_cast<int64_t>(std::numeric_limits<Idx>::max());
  if (n >= limit || alphabet >= limit) {
    throw std::length_error("build_suffix_array: text or alphabet too large for this index width");
  }
  sais<Char, Idx>(text, sa, static_cast<Idx>(n), static_cast<Idx>(alphabet));
}

}  // namespace

void build_suffix_array(const uint16_t* t, int32_t* sa, int64_t n, int64_t a) { build(t, sa, n, a); }
void build_suffix_array(const uint32_t* t, int32_t* sa, int64_t n, int64_t a) { build(t, sa, n, a); }
void build_suffix_array(const uint16_t* t, int64_t* sa, int64_t n, int64_t a) { build(t, sa, n, a); }
void build_suffix_array(const uint32_t* t, int64_t* sa, int64_t n, int64_t a) { build(t, sa, n, a); }

}  // namespace sssd
