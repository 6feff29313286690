// A small in-memory index that speeds up suffix-array binary search (built lazily, one per mapping).
//
// Every `stride`-th suffix-array entry is sampled and the first kKeySymbols stream symbols of its
// suffix are stored inline (zero after the document end, like the stream's separator). Binary search
// first runs over these keys: they are contiguous (0.5 bytes per token at stride 64 for uint16 tokens)
// and in huge pages when the kernel allows, so only the last log2(stride) steps read the mapped suffix
// array and stream. A table of where each first symbol's samples begin (4 bytes per vocabulary entry)
// and a hash table of the samples' first-symbol pairs (at most 0.5 bytes per token at stride 64) let a
// search start inside the query's bucket; for 1- and 2-symbol queries they give the answer directly.
// In all, at most ~1 byte per token (uint16 tokens, stride 64).
//
// The index is derived data: it is built on the first search of a mapping (O(n / stride) reads; not at
// open, which stays O(1)), kept in a process-wide registry keyed by the mapping's address, and dropped
// when the mapping is unmapped (search_index_release, called by MappedFile). Environment variable
// SSSD_SEARCH_INDEX: "off" disables it; "STRIDE,MIN_TOKENS" sets the sampling stride (a power of two
// >= 2) and the smallest datastore that gets one (default "64,65536"); read when an index is made.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/datastore.h"

namespace sssd {

class SearchIndex {
 public:
  static constexpr int32_t kKeySymbols = 16;

  // Reads sa[i * stride] and its suffix's first symbols for every i; throws DatastoreError when an
  // entry is out of range.
  SearchIndex(const DatastoreView& v, uint64_t stride);
  ~SearchIndex();
  SearchIndex(const SearchIndex&) = delete;
  SearchIndex& operator=(const SearchIndex&) = delete;

  uint64_t stride() const { return stride_; }
  uint64_t num_samples() const { return num_samples_; }  // ceil(num_tokens / stride)
  // Keys of the samples: [num_samples * kKeySymbols] symbols of the shard's token width.
  template <class Sym>
  const Sym* keys() const {
    return static_cast<const Sym*>(keys_);
  }
  uint64_t bytes() const { return bytes_ + 4 * buckets_.size() + sizeof(PairSlot) * pairs_.size(); }

  // Samples whose key starts with symbol x are [bucket_begin(x), bucket_begin(x + 1)); x in [1, vocab].
  // False when the vocabulary is too large for a bucket table (2^20 symbols).
  bool has_buckets() const { return !buckets_.empty(); }
  uint32_t bucket_begin(uint32_t x) const { return buckets_[x]; }

  // The exact suffix-array range [*lo, *hi) of the one-symbol query x (in [1, vocab]) when a search
  // already found it (then stored with remember_single), else false. Lazily filled and shared by all
  // threads (each entry is one atomic word); one-symbol queries are the most frequent and their range
  // would otherwise take ~2 log2(stride) reads of the mapped suffix array and stream.
  bool single_range(uint32_t x, uint64_t* lo, uint64_t* hi) const {
    if (singles_ == nullptr || x >= num_singles_) return false;
    const uint64_t w = singles_[x].load(std::memory_order_relaxed);
    if (w == kUnknown) return false;
    *lo = w >> 32;
    *hi = w & 0xffffffffu;
    return true;
  }
  void remember_single(uint32_t x, uint64_t lo, uint64_t hi) const {
    if (singles_ == nullptr || x >= num_singles_ || lo > hi || hi >= 0xffffffffu) return;
    singles_[x].store((lo << 32) | hi, std::memory_order_relaxed);
  }

  // Samples whose key starts with the symbols x, y (>= 1) are [*begin, *end); false when there are
  // none (or no bucket table). A hash table over the distinct first-symbol pairs of the samples.
  bool pair_range(uint32_t x, uint32_t y, uint32_t* begin, uint32_t* end) const {
    if (pairs_.empty()) return false;
    const uint64_t key = pair_key(x, y);
    for (uint64_t h = pair_hash(key) & pair_mask_;; h = (h + 1) & pair_mask_) {
      const PairSlot& slot = pairs_[h];
      if (slot.key == key) {
        *begin = slot.begin;
        *end = slot.end;
        return true;
      }
      if (slot.key == 0) return false;
    }
  }

 private:
  uint64_t stride_;
  uint64_t num_samples_;
  void* keys_ = nullptr;
  uint32_t keys_bytes_per_symbol_ = 2;
  uint64_t bytes_ = 0;
  std::vector<uint32_t> buckets_;  // [vocab + 2]: first sample whose key's first symbol is >= x

  struct PairSlot {
    uint64_t key;  // 0: empty (first symbols are >= 1)
    uint32_t begin, end;
  };
  static uint64_t pair_key(uint64_t x, uint64_t y) { return (x << 32) | y; }
  // splitmix64's finalizer: every key bit affects the low bits used as the slot.
  static uint64_t pair_hash(uint64_t k) {
    k = (k ^ (k >> 30)) * 0xBF58476D1CE4E5B9ull;
    k = (k ^ (k >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint64_t>(k ^ (k >> 31));
  }
  void build_pairs();
  static constexpr uint64_t kUnknown = ~uint64_t{0};
  std::unique_ptr<std::atomic<uint64_t>[]> singles_;  // [num_singles_] (lo << 32) | hi, or kUnknown
  uint64_t num_singles_ = 0;
  std::vector<PairSlot> pairs_;
  uint64_t pair_mask_ = 0;
};

// The index of this mapping, built on first use; nullptr when indexing is off or the shard is small.
// Thread-safe. The returned pointer keeps the index alive even if the mapping is released meanwhile.
std::shared_ptr<const SearchIndex> search_index_for(const DatastoreView& v);

// Forgets the index of the mapping that starts at `mapping` (its header). Safe to call for any address.
void search_index_release(const void* mapping);

// Incremented by every search_index_release: results cached under a mapping's address (SearchCache,
// the per-thread trie memo, search_memo.h) are valid only while it is unchanged, since a later mapping
// may reuse the address.
uint64_t mapping_generation();

}  // namespace sssd
