#include "core/search.h"

#include <stdexcept>
#include <string>

#include "core/parallel.h"

namespace sssd {

void validate_search_params(const SearchParams& p) {
  if (p.min_query_len < 1) throw std::invalid_argument("min_query_len must be >= 1");
  if (p.max_query_len < p.min_query_len) throw std::invalid_argument("max_query_len must be >= min_query_len");
  if (p.min_occurrences < 0) throw std::invalid_argument("min_occurrences must be >= 0");
  if (p.max_samples < 0) throw std::invalid_argument("max_samples must be >= 0");
  if (p.max_depth < 0) throw std::invalid_argument("max_depth must be >= 0");
}

namespace {

struct Range {
  uint64_t lo = 0, hi = 0;  // suffix-array indices [lo, hi)
  uint64_t count() const { return hi - lo; }
};

// Typed access to one shard. Every suffix-array entry is bounds-checked when read (the file is not
// trusted beyond its header); stream scans need no check because the stream ends with a separator 0
// that no query symbol (token + 1 >= 1) equals.
template <class Sym, class Idx>
struct Shard {
  const Sym* stream;
  const Idx* sa;
  uint64_t num_suffixes;
  uint64_t stream_length;

  explicit Shard(const DatastoreView& v)
      : stream(static_cast<const Sym*>(v.stream)),
        sa(static_cast<const Idx*>(v.sa)),
        num_suffixes(v.header->num_tokens),
        stream_length(v.header->stream_length) {}

  uint64_t position(uint64_t i) const {
    const auto p = static_cast<uint64_t>(sa[i]);
    if (p >= stream_length) throw DatastoreError("corrupt datastore: suffix array entry out of range");
    return p;
  }

  // <0: suffix < query; 0: query is a prefix of the suffix; >0: suffix > query.
  int compare(uint64_t p, const uint32_t* q, int32_t len) const {
    for (int32_t j = 0; j < len; ++j) {
      const uint32_t s = stream[p + static_cast<uint64_t>(j)];
      if (s != q[j]) return s < q[j] ? -1 : 1;
    }
    return 0;
  }

  Range find(const uint32_t* q, int32_t len) const {
    uint64_t lo = 0, hi = num_suffixes;  // first index with compare >= 0
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (compare(position(mid), q, len) < 0) lo = mid + 1; else hi = mid;
    }
    uint64_t lo2 = lo, hi2 = num_suffixes;  // first index with compare > 0
    while (lo2 < hi2) {
      const uint64_t mid = lo2 + (hi2 - lo2) / 2;
      if (compare(position(mid), q, len) <= 0) lo2 = mid + 1; else hi2 = mid;
    }
    return {lo, lo2};
  }

  uint32_t symbol(uint64_t pos) const { return stream[pos]; }
};

// Type-erased shard so one search can span shards of different widths.
class AnyShard {
  static int kind_of(const DatastoreView& v) {
    return (v.header->token_width == 2 ? 0 : 2) + (v.header->sa_width == 4 ? 0 : 1);
  }
  template <class F>
  auto dispatch(F&& f) const {
    switch (kind_) {
      case 0: return f(Shard<uint16_t, int32_t>(v_));
      case 1: return f(Shard<uint16_t, int64_t>(v_));
      case 2: return f(Shard<uint32_t, int32_t>(v_));
      default: return f(Shard<uint32_t, int64_t>(v_));
    }
  }
 public:
  explicit AnyShard(const DatastoreView& v) : kind_(kind_of(v)), v_(v) {}
  Range find(const uint32_t* q, int32_t len) const {
    return dispatch([&](const auto& s) { return s.find(q, len); });
  }
  uint64_t position(uint64_t i) const { return dispatch([&](const auto& s) { return s.position(i); }); }
  uint32_t symbol(uint64_t pos) const { return dispatch([&](const auto& s) { return s.symbol(pos); }); }
  uint64_t stream_length() const { return v_.header->stream_length; }
  uint64_t vocab_size() const { return v_.header->vocab_size; }

 private:
  int kind_;
  DatastoreView v_;
};

}  // namespace

void search_context(const std::vector<DatastoreView>& views, TokenSpan context, const SearchParams& p,
                    CandidateTrie& out) {
  out.reset(context.size > 0 ? context.data[context.size - 1] : -1);
  if (views.empty()) return;
  std::vector<AnyShard> shards;
  shards.reserve(views.size());
  for (const auto& v : views) shards.emplace_back(v);
  const uint64_t vocab = shards[0].vocab_size();

  const int32_t max_len = static_cast<int32_t>(std::min<int64_t>(p.max_query_len, context.size));
  std::vector<uint32_t> query(static_cast<size_t>(std::max(max_len, 0)));
  for (int32_t j = 0; j < max_len; ++j) {
    const int32_t t = context.data[context.size - max_len + j];
    if (t < 0 || static_cast<uint64_t>(t) >= vocab) {
      throw std::invalid_argument("context token id " + std::to_string(t) +
                                  " is outside the datastore vocabulary [0, " + std::to_string(vocab) + ")");
    }
    query[static_cast<size_t>(j)] = static_cast<uint32_t>(t) + 1;
  }
  if (max_len < p.min_query_len || p.max_samples == 0) return;

  // ranges[L] over all shards, computed on demand. The suffix c[-L:] is query[max_len - L:].
  std::vector<std::vector<Range>> ranges(static_cast<size_t>(max_len) + 1);
  auto total = [&](int32_t len) {
    auto& r = ranges[static_cast<size_t>(len)];
    if (r.empty()) {
      for (const auto& s : shards) r.push_back(s.find(query.data() + (max_len - len), len));
    }
    uint64_t n = 0;
    for (const auto& x : r) n += x.count();
    return n;
  };
  if (total(p.min_query_len) == 0) return;
  int32_t lo = p.min_query_len, hi = max_len;  // occurrence is monotone in L: binary search for L*
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (total(mid) > 0) lo = mid; else hi = mid - 1;
  }

  for (int32_t len = lo; len >= p.min_query_len; --len) {
    const uint64_t n = total(len);
    const uint64_t k = std::min<uint64_t>(n, static_cast<uint64_t>(p.max_samples));
    for (uint64_t i = 0; i < k; ++i) {
      // The i-th of k indices spread evenly over the concatenated ranges.
      uint64_t g = (n == k) ? i : static_cast<uint64_t>((static_cast<unsigned __int128>(i) * n) / k);
      size_t s = 0;
      const auto& r = ranges[static_cast<size_t>(len)];
      while (g >= r[s].count()) g -= r[s++].count();
      const AnyShard& shard = shards[s];
      const uint64_t start = shard.position(r[s].lo + g) + static_cast<uint64_t>(len);
      if (start >= shard.stream_length()) throw DatastoreError("corrupt datastore: unsorted suffix array");
      out.counts[0] += 1;
      int32_t node = 0;
      for (int32_t d = 0; d < p.max_depth; ++d) {
        const uint32_t sym = shard.symbol(start + static_cast<uint64_t>(d));
        if (sym == 0) break;  // document end
        if (sym > vocab) throw DatastoreError("corrupt datastore: token id outside the vocabulary");
        node = out.add_child(node, static_cast<int32_t>(sym - 1), 1, len);
      }
    }
    if (static_cast<int64_t>(n) >= p.min_occurrences) break;
  }
}

void search_batch(const std::vector<DatastoreView>& shards, const std::vector<TokenSpan>& contexts,
                  const SearchParams& p, std::vector<CandidateTrie>& out) {
  validate_search_params(p);
  out.resize(contexts.size());
  parallel_for(static_cast<int64_t>(contexts.size()), [&](int64_t i) {
    search_context(shards, contexts[static_cast<size_t>(i)], p, out[static_cast<size_t>(i)]);
  });
}

}  // namespace sssd
