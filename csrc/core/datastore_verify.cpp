// Datastore::verify: the full O(n) check of an opened file.
//
// The suffix array is checked without comparing suffixes symbol by symbol (which costs the length of
// the common prefixes: quadratic on repetitive text). With rank[p] = the index of position p in the
// suffix array, adjacent entries a = sa[i-1], b = sa[i] are in order iff
//   stream[a] < stream[b], or they are equal and a's document ends after it (stream[a+1] == 0), or both
//   continue and rank[a+1] < rank[b+1].
// These keys never decrease along a valid array, and if they never decrease, every pair is in order
// (by induction on the length to the document end), given that the array is a permutation of the real
// token positions, which is checked first. Suffixes equal up to their documents' ends must therefore
// appear in the order of their successors: the order the builder writes (datastore_format.h).
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/datastore.h"
#include "core/search_index.h"

namespace sssd {

namespace {

uint64_t stream_at(const DatastoreView& v, uint64_t i) {
  return v.header->token_width == 2 ? static_cast<const uint16_t*>(v.stream)[i]
                                    : static_cast<const uint32_t*>(v.stream)[i];
}

uint64_t sa_at(const DatastoreView& v, uint64_t i) {
  return v.header->sa_width == 4 ? static_cast<uint64_t>(static_cast<const int32_t*>(v.sa)[i])
                                 : static_cast<uint64_t>(static_cast<const int64_t*>(v.sa)[i]);
}

void check_documents(const DatastoreView& v, const std::string& path) {
  const DatastoreHeader& h = *v.header;
  for (uint64_t k = 0; k < h.num_documents; ++k) {
    const uint64_t b = v.doc_offsets[k], e = v.doc_offsets[k + 1];
    if (b >= e || e > h.stream_length || stream_at(v, e - 1) != 0) {
      throw DatastoreError(path + ": corrupt document table at document " + std::to_string(k));
    }
    for (uint64_t i = b; i + 1 < e; ++i) {
      const uint64_t s = stream_at(v, i);
      if (s == 0 || s > h.vocab_size) throw DatastoreError(path + ": corrupt token stream");
    }
  }
}

// The suffix-array check above; Rank is uint32_t when the stream has fewer than 2^32 symbols.
template <class Rank>
void check_suffix_array(const DatastoreView& v, const std::string& path, const ProgressFn& report) {
  const DatastoreHeader& h = *v.header;
  constexpr Rank kNone = std::numeric_limits<Rank>::max();
  std::vector<Rank> rank(static_cast<size_t>(h.stream_length), kNone);
  // Documents were checked: exactly num_tokens positions hold real tokens, so num_tokens distinct real
  // positions are all of them.
  for (uint64_t i = 0; i < h.num_tokens; ++i) {
    const uint64_t p = sa_at(v, i);
    if (p >= h.stream_length || stream_at(v, p) == 0 || rank[static_cast<size_t>(p)] != kNone) {
      throw DatastoreError(path + ": corrupt suffix array at entry " + std::to_string(i));
    }
    rank[static_cast<size_t>(p)] = static_cast<Rank>(i);
    if ((i & 0xFFFFF) == 0) report("checking suffix array", i / 2, h.num_tokens);
  }
  for (uint64_t i = 1; i < h.num_tokens; ++i) {
    const uint64_t a = sa_at(v, i - 1), b = sa_at(v, i);
    const uint64_t x = stream_at(v, a), y = stream_at(v, b);
    bool ok = x < y;
    if (x == y) {
      // a + 1 and b + 1 are inside the stream: it ends with a separator and a, b are real tokens.
      const uint64_t na = stream_at(v, a + 1), nb = stream_at(v, b + 1);
      ok = na == 0 || (nb != 0 && rank[static_cast<size_t>(a + 1)] < rank[static_cast<size_t>(b + 1)]);
    }
    // The pair at i may itself be in order: its successors' ranks show that some entry is misplaced.
    if (!ok) throw DatastoreError(path + ": suffix array is not sorted (found at entry " + std::to_string(i) + ")");
    if ((i & 0xFFFFF) == 0) report("checking suffix array", h.num_tokens / 2 + i / 2, h.num_tokens);
  }
  report("checking suffix array", h.num_tokens, h.num_tokens);
}

}  // namespace

void Datastore::verify(const ProgressFn& progress) const {
  const DatastoreHeader& h = *view_.header;
  const ProgressFn report = progress ? progress : [](const char*, uint64_t, uint64_t) {};
  file_.check_size(path_);
  if (h.flags & kFlagContentChecksum) {
    report("checking checksum", 0, 1);
    if (content_checksum(file_.data(), h) != h.content_checksum) {
      throw DatastoreError(path_ + ": corrupt: the content checksum does not match (the file was damaged "
                           "after it was written); rebuild it with build-datastore");
    }
    report("checking checksum", 1, 1);
  }
  check_documents(view_, path_);
  report("checking documents", 1, 1);
  if (h.stream_length < (uint64_t{1} << 32)) {
    check_suffix_array<uint32_t>(view_, path_, report);
  } else {
    check_suffix_array<uint64_t>(view_, path_, report);
  }
  try {
    const uint64_t stride = stored_index_stride(view_);
    if (stride != 0) {
      const auto stored = SearchIndex::load(view_);
      if (!stored->same_as(SearchIndex(view_, stride))) {
        throw DatastoreError("the stored search index differs from one built from the suffix array");
      }
      report("checking search index", 1, 1);
    }
  } catch (const DatastoreError& e) {
    throw DatastoreError(path_ + ": " + e.what());
  }
}

}  // namespace sssd
