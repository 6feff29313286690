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
// The index is derived data. The builder stores it in the datastore file (an optional section after the
// suffix array, layout below) so that the first search only copies and checks it; files without that
// section build it on the first search of a mapping (O(n / stride) random reads; 9.6 s at 1e8 tokens).
// Either way it is made on the first search, never at open (which stays O(1)), kept in a process-wide
// registry keyed by the mapping's address, and dropped when the mapping is unmapped
// (search_index_release, called by MappedFile). Environment variable SSSD_SEARCH_INDEX: "off" disables
// it (stored or not); "STRIDE,MIN_TOKENS" sets the sampling stride (a power of two >= 2) and the
// smallest datastore that gets one built (default "64,65536"); a stored index of another stride is then
// ignored and one of STRIDE is built. Read when an index is made.
//
// Stored section (version 1), at header.index_offset, header.index_bytes long:
//   StoredIndexHeader (64 bytes)
//   keys     [num_samples * kKeySymbols] symbols of token_width bytes, zero-padded to 8 bytes
//   buckets  uint32[num_buckets] (0, or vocab_size + 2), zero-padded to 8 bytes
//   pairs    {uint64 key, uint32 begin, uint32 end}[num_pair_slots] (0, or a power of two >= 1024)
// header.index_checksum = checksum64 of the four parts, combined (stored_index_checksum). Loading checks
// the checksum, the structure (every bound the search relies on) and spot-checks keys against the
// suffix array; any failure is a DatastoreError. A section of an unknown version is ignored (built in
// memory instead).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/datastore.h"

namespace sssd {

constexpr uint64_t kDefaultIndexStride = 64;
constexpr uint64_t kDefaultIndexMinTokens = 65536;
constexpr uint32_t kStoredIndexVersion = 1;
constexpr char kStoredIndexMagic[8] = {'S', 'S', 'S', 'D', 'S', 'I', 'D', 'X'};

struct StoredIndexHeader {
  char magic[8];
  uint32_t version;      // kStoredIndexVersion
  uint32_t key_symbols;  // SearchIndex::kKeySymbols
  uint32_t token_width;  // as the datastore's
  uint32_t reserved0;
  uint64_t stride;
  uint64_t num_samples;
  uint64_t num_buckets;
  uint64_t num_pair_slots;
  uint64_t reserved1;
};
static_assert(sizeof(StoredIndexHeader) == 64, "stored index header must be 64 bytes");

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

  // Loads the index stored in the mapped datastore v (header flag set): copies it into memory and checks
  // it. Throws DatastoreError naming the problem (truncated, checksum, structure, mismatch).
  static std::shared_ptr<const SearchIndex> load(const DatastoreView& v);
  // The stored section: its size, its checksum (for header.index_checksum) and its bytes, in order.
  uint64_t section_bytes() const;
  uint64_t section_checksum() const;
  void write_section(const std::function<void(const void*, size_t)>& write) const;
  // Same samples, keys and tables (the lazily filled single-symbol ranges aside).
  bool same_as(const SearchIndex& o) const;

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
  uint64_t stride_ = 0;
  uint64_t num_samples_ = 0;
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
  SearchIndex() = default;
  void allocate_keys(uint32_t token_width);
  void init_singles(const DatastoreView& v);
  StoredIndexHeader section_header() const;
  void build_pairs();
  static constexpr uint64_t kUnknown = ~uint64_t{0};
  std::unique_ptr<std::atomic<uint64_t>[]> singles_;  // [num_singles_] (lo << 32) | hi, or kUnknown
  uint64_t num_singles_ = 0;
  std::vector<PairSlot> pairs_;
  uint64_t pair_mask_ = 0;
};

// The checksum of a stored section's bytes as header.index_checksum records it (for tools and tests that
// rewrite a section); throws DatastoreError when the section is shorter than its own header says.
uint64_t stored_index_checksum(const unsigned char* section, uint64_t bytes);

// The stride of the index stored in v's file, or 0 when there is none (or of an unknown version).
uint64_t stored_index_stride(const DatastoreView& v);

// The index of this mapping, loaded from the file or built on first use; nullptr when indexing is off or the shard is small.
// Thread-safe. The returned pointer keeps the index alive even if the mapping is released meanwhile.
std::shared_ptr<const SearchIndex> search_index_for(const DatastoreView& v);

// Forgets the index of the mapping that starts at `mapping` (its header). Safe to call for any address.
void search_index_release(const void* mapping);

// Incremented by every search_index_release: results cached under a mapping's address (SearchCache,
// the per-thread trie memo, search_memo.h) are valid only while it is unchanged, since a later mapping
// may reuse the address.
uint64_t mapping_generation();

}  // namespace sssd
