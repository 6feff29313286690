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
#include <vector>

#include "core/datastore.h"

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
struct Cursor {
  enum Kind : uint8_t { kJoint, kLower, kUpper };
  uint64_t lo, hi;        // the answer lies in [lo, hi]
  uint64_t mid, pos;      // current probe and its stream position
  int32_t llcp, rlcp;     // symbols the query shares with the suffixes at lo - 1 and at hi
  int32_t slot;           // index into the output ranges
  Kind kind;
};

// Finds out[s] = range of the query q_s = query_end - lengths[s] .. query_end (lengths[s] symbols) for
// every s, in one shard. `cursors` is scratch (reused across calls to avoid allocations).
template <class Sym, class Idx>
void find_ranges(const TypedShard<Sym, Idx>& sh, const uint32_t* query_end, const int32_t* lengths, int32_t n,
                 Range* out, std::vector<Cursor>& cursors) {
  cursors.clear();
  for (int32_t s = 0; s < n; ++s) {
    out[s] = Range{0, 0};
    if (sh.num_suffixes > 0) cursors.push_back(Cursor{0, sh.num_suffixes, 0, 0, 0, 0, s, Cursor::kJoint});
  }
  while (!cursors.empty()) {
    for (auto& c : cursors) {
      c.mid = c.lo + (c.hi - c.lo) / 2;
      prefetch(sh.sa + c.mid);
    }
    for (auto& c : cursors) {
      c.pos = sh.position(c.mid);
      prefetch(sh.stream + c.pos + static_cast<uint64_t>(std::min(c.llcp, c.rlcp)));
    }
    size_t live = 0;
    const size_t count = cursors.size();
    for (size_t i = 0; i < count; ++i) {
      Cursor c = cursors[i];
      const int32_t len = lengths[c.slot];
      const uint32_t* q = query_end - len;
      int32_t j = std::min(c.llcp, c.rlcp);
      // A sorted suffix array guarantees the first j symbols match; a corrupt one must not make the
      // scan start past the final separator.
      if (c.pos + static_cast<uint64_t>(j) >= sh.stream_length) {
        throw DatastoreError("corrupt datastore: unsorted suffix array");
      }
      const Sym* s = sh.stream + c.pos;
      while (j < len && s[j] == q[j]) ++j;
      const bool prefix = j == len;
      const bool less = !prefix && s[j] < q[j];
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
          out[c.slot].hi = up.lo;
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
        continue;
      }
      if (c.kind == Cursor::kJoint) {
        out[c.slot] = Range{c.lo, c.lo};
      } else if (c.kind == Cursor::kLower) {
        out[c.slot].lo = c.lo;
      } else {
        out[c.slot].hi = c.lo;
      }
    }
    // Cursors split in this round were appended after `count`; keep them.
    for (size_t i = count; i < cursors.size(); ++i) cursors[live++] = cursors[i];
    cursors.resize(live);
  }
}

}  // namespace search_detail
}  // namespace sssd
