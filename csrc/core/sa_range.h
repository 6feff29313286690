// Suffix-array range search for several context suffixes at once (internal to search.cpp).
//
// The ranges of all requested suffix lengths are found by binary searches run in lockstep: each round
// first prefetches the suffix-array entry of every search's midpoint, then the stream position it points
// to, then compares. The searches are independent, so their cache misses overlap instead of forming one
// long chain (a binary search over 1e7 suffixes is ~24 dependent pairs of misses).
//
// Each comparison skips the prefix the query is already known to share with both window ends (the
// "mlr" trick: every suffix between two suffixes that share m symbols with the query shares them too).
// The lower and upper bound of one length share their probes until the first probe that matches the
// whole query; then they split.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/datastore.h"
#include "core/search_index.h"

namespace sssd {
namespace search_detail {

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 1); }

struct Range {
  uint64_t lo = 0, hi = 0;  // suffix-array indices [lo, hi)
  uint64_t count() const { return hi - lo; }
};

// Typed access to one shard. Suffix-array entries are bounds-checked when read (the file is not trusted
// beyond its header); stream scans need no check because the stream ends with a separator 0 that no
// query symbol (token + 1 >= 1) equals, and open() checked that final separator.
template <class Sym, class Idx>
struct TypedShard {
  const Sym* stream;
  const Idx* sa;
  uint64_t num_suffixes;
  uint64_t stream_length;

  explicit TypedShard(const DatastoreView& v)
      : stream(static_cast<const Sym*>(v.stream)),
        sa(static_cast<const Idx*>(v.sa)),
        num_suffixes(v.header->num_tokens),
        stream_length(v.header->stream_length) {}

  uint64_t position(uint64_t i) const {
    const auto p = static_cast<uint64_t>(sa[i]);
    if (p >= stream_length) throw DatastoreError("corrupt datastore: suffix array entry out of range");
    return p;
  }
};

// Calls f(TypedShard<Sym, Idx>) with the shard's widths.
template <class F>
decltype(auto) with_typed_shard(const DatastoreView& v, F&& f) {
  const bool sym16 = v.header->token_width == 2, idx32 = v.header->sa_width == 4;
  if (sym16 && idx32) return f(TypedShard<uint16_t, int32_t>(v));
  if (sym16) return f(TypedShard<uint16_t, int64_t>(v));
  if (idx32) return f(TypedShard<uint32_t, int32_t>(v));
  return f(TypedShard<uint32_t, int64_t>(v));
}

// One binary search. kJoint: lower and upper bound not yet separated; kLower: first index whose suffix
// has the query as a prefix or is greater; kUpper: first index whose suffix is greater (not a prefix).
// Indices are suffix-array indices, or sample indices while searching a SearchIndex.
struct Cursor {
  enum Kind : uint8_t { kJoint, kLower, kUpper };
  uint64_t lo, hi;        // the answer lies in [lo, hi]
  uint64_t mid, pos;      // current probe and (suffix-array phase) its stream position
  int32_t llcp, rlcp;     // symbols the query shares with the suffixes at lo - 1 and at hi
  int32_t slot;           // index into the output ranges
  Kind kind;
};

// Compares query q (len symbols) with the suffix at stream position pos from symbol j on (the first j
// are known to match). Returns the number of matching symbols (<= len); *less tells whether the suffix
// is smaller at the first difference.
template <class Sym>
inline int32_t match(const Sym* stream, uint64_t stream_length, uint64_t pos, const uint32_t* q, int32_t len,
                     int32_t j, bool* less) {
  // A sorted suffix array guarantees the first j symbols match; a corrupt one must not make the scan
  // start past the final separator.
  if (pos + static_cast<uint64_t>(j) >= stream_length) {
    throw DatastoreError("corrupt datastore: unsorted suffix array");
  }
  const Sym* s = stream + pos;
  while (j < len && s[j] == q[j]) ++j;
  *less = j < len && s[j] < q[j];
  return j;
}

// Advances every cursor by one step per round until all are done; done(cursor) receives each finished
// cursor (lo == hi, kind tells which bound). Probe: prefetch(c) starts the loads of c.mid, compare(c,
// q, len, &less) returns the number of matching symbols.
template <class Probe, class Done>
void lockstep(std::vector<Cursor>& cursors, const int32_t* lengths, const uint32_t* query_end, Probe& probe,
              Done&& done) {
  while (!cursors.empty()) {
    for (auto& c : cursors) c.mid = c.lo + (c.hi - c.lo) / 2;
    probe.prefetch(cursors);
    size_t live = 0;
    const size_t count = cursors.size();
    for (size_t i = 0; i < count; ++i) {
      Cursor c = cursors[i];
      const int32_t len = lengths[c.slot];
      bool less = false;
      const int32_t j = probe.compare(c, query_end - len, len, &less);
      const bool prefix = j == len;
      if (c.kind == Cursor::kJoint && prefix) {
        // Split: the lower bound lies in [lo, mid], the upper bound in [mid + 1, hi].
        Cursor up = c;
        up.kind = Cursor::kUpper;
        up.lo = c.mid + 1;
        up.llcp = len;
        c.kind = Cursor::kLower;
        c.hi = c.mid;
        c.rlcp = len;
        if (up.lo < up.hi) {
          cursors.push_back(up);
        } else {
          done(up);
        }
      } else if (less || (prefix && c.kind == Cursor::kUpper)) {
        c.lo = c.mid + 1;
        c.llcp = j;
      } else {
        c.hi = c.mid;
        c.rlcp = j;
      }
      if (c.lo < c.hi) {
        cursors[live++] = c;
      } else {
        done(c);
      }
    }
    // Cursors split in this round were appended after `count`; keep them.
    for (size_t i = count; i < cursors.size(); ++i) cursors[live++] = cursors[i];
    cursors.resize(live);
  }
}

// Probes suffix-array entries: first the entries, then the stream positions they point to.
template <class Sym, class Idx>
struct SaProbe {
  const TypedShard<Sym, Idx>& sh;
  void prefetch(std::vector<Cursor>& cursors) const {
    for (auto& c : cursors) search_detail::prefetch(sh.sa + c.mid);
    for (auto& c : cursors) {
      c.pos = sh.position(c.mid);
      search_detail::prefetch(sh.stream + c.pos + static_cast<uint64_t>(std::min(c.llcp, c.rlcp)));
    }
  }
  int32_t compare(const Cursor& c, const uint32_t* q, int32_t len, bool* less) const {
    return match(sh.stream, sh.stream_length, c.pos, q, len, std::min(c.llcp, c.rlcp), less);
  }
};

// Probes the samples of a SearchIndex: compares the inline keys, and reads the suffix itself only when
// the query is longer than a key and matches all of it.
template <class Sym, class Idx>
struct KeyProbe {
  const TypedShard<Sym, Idx>& sh;
  const Sym* keys;
  uint64_t stride;
  void prefetch(const std::vector<Cursor>& cursors) const {
    for (const auto& c : cursors) search_detail::prefetch(keys + c.mid * SearchIndex::kKeySymbols);
  }
  int32_t compare(const Cursor& c, const uint32_t* q, int32_t len, bool* less) const {
    const Sym* key = keys + c.mid * SearchIndex::kKeySymbols;
    int32_t j = std::min(c.llcp, c.rlcp);
    const int32_t n = std::min(len, SearchIndex::kKeySymbols);
    while (j < n && key[j] == q[j]) ++j;
    if (j < n || j == len) {
      *less = j < len && key[j] < q[j];
      return j;
    }
    return match(sh.stream, sh.stream_length, sh.position(c.mid * stride), q, len, j, less);
  }
};

// Finds out[s] = range of the query q_s = query_end - lengths[s] .. query_end (lengths[s] symbols) for
// every s, in one shard, using its SearchIndex when it has one. `cursors` and `next` are scratch.
template <class Sym, class Idx>
void find_ranges(const TypedShard<Sym, Idx>& sh, const SearchIndex* index, const uint32_t* query_end,
                 const int32_t* lengths, int32_t n, Range* out, std::vector<Cursor>& cursors,
                 std::vector<Cursor>& next) {
  cursors.clear();
  next.clear();
  auto record = [&](const Cursor& c) {
    if (c.kind != Cursor::kUpper) out[c.slot].lo = c.lo;
    if (c.kind != Cursor::kLower) out[c.slot].hi = c.lo;
  };
  // A finished sample-space cursor: its bound lies in sample gap i, suffix-array indices
  // [(i - 1) * stride + 1, i * stride] (0 for i = 0; at most num_suffixes). The lcps carry over: the
  // gap's ends are the samples i - 1 and i.
  const uint64_t stride = index ? index->stride() : 1;
  auto to_gap = [&](Cursor c) {
    const uint64_t i = c.lo;
    c.lo = i == 0 ? 0 : (i - 1) * stride + 1;
    c.hi = std::min(i * stride, sh.num_suffixes);
    if (c.lo < c.hi) {
      next.push_back(c);
    } else {
      record(c);
    }
  };
  const uint64_t top = index ? index->num_samples() : sh.num_suffixes;
  const bool buckets = index != nullptr && index->has_buckets();
  for (int32_t s = 0; s < n; ++s) {
    out[s] = Range{0, 0};
    if (top == 0) continue;
    Cursor c{0, top, 0, 0, 0, 0, s, Cursor::kJoint};
    if (buckets) {
      // The samples starting with the query's first symbol (or first two) are known: for queries of
      // one (two) symbols they are the answer in sample space, for longer ones they bound it.
      const uint32_t* q = query_end - lengths[s];
      uint32_t begin = index->bucket_begin(q[0]), end = index->bucket_begin(q[0] + 1);
      const bool pair = lengths[s] >= 2 && index->pair_range(q[0], q[1], &begin, &end);
      if (lengths[s] == 1 && index->single_range(q[0], &out[s].lo, &out[s].hi)) continue;
      if (lengths[s] == 1 || (lengths[s] == 2 && pair)) {
        to_gap(Cursor{begin, begin, 0, 0, 0, 0, s, Cursor::kLower});
        to_gap(Cursor{end, end, 0, 0, 0, 0, s, Cursor::kUpper});
        continue;
      }
      c.lo = begin;
      c.hi = end;
      if (c.lo == c.hi) {
        to_gap(c);
        continue;
      }
    }
    cursors.push_back(c);
  }
  if (index != nullptr) {
    KeyProbe<Sym, Idx> probe{sh, index->keys<Sym>(), stride};
    lockstep(cursors, lengths, query_end, probe, to_gap);
    cursors.swap(next);
  }
  SaProbe<Sym, Idx> probe{sh};
  lockstep(cursors, lengths, query_end, probe, record);
  if (buckets) {
    for (int32_t s = 0; s < n; ++s) {
      if (lengths[s] == 1) index->remember_single(*(query_end - 1), out[s].lo, out[s].hi);
    }
  }
}

// Like find_ranges, but the range of q_s is known to lie inside windows[s] (suffix-array indices of this
// shard), whose suffixes all share their first lcps[s] symbols with q_s: a plain binary search inside
// the window that starts comparing at symbol lcps[s]. No SearchIndex (the window is small).
template <class Sym, class Idx>
void find_ranges_within(const TypedShard<Sym, Idx>& sh, const uint32_t* query_end, const int32_t* lengths,
                        int32_t n, const Range* windows, const int32_t* lcps, Range* out,
                        std::vector<Cursor>& cursors) {
  cursors.clear();
  auto record = [&](const Cursor& c) {
    if (c.kind != Cursor::kUpper) out[c.slot].lo = c.lo;
    if (c.kind != Cursor::kLower) out[c.slot].hi = c.lo;
  };
  for (int32_t s = 0; s < n; ++s) {
    const Range w = windows[s];
    if (w.hi > sh.num_suffixes || w.lo > w.hi) throw std::logic_error("search window outside the suffix array");
    out[s] = Range{w.lo, w.lo};
    if (w.lo == w.hi) continue;
    cursors.push_back(Cursor{w.lo, w.hi, 0, 0, lcps[s], lcps[s], s, Cursor::kJoint});
  }
  SaProbe<Sym, Idx> probe{sh};
  lockstep(cursors, lengths, query_end, probe, record);
}

}  // namespace search_detail
}  // namespace sssd
