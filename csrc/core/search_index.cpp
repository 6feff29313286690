#include "core/search_index.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/parallel.h"

namespace sssd {

namespace {

constexpr uint64_t kHugePage = uint64_t{2} << 20;

template <class Sym, class Idx>
void fill_keys(const DatastoreView& v, uint64_t stride, uint64_t num_samples, Sym* keys) {
  const auto* stream = static_cast<const Sym*>(v.stream);
  const auto* sa = static_cast<const Idx*>(v.sa);
  const uint64_t length = v.header->stream_length;
  const int64_t blocks = static_cast<int64_t>((num_samples + 4095) / 4096);
  parallel_for(blocks, [&](int64_t b) {
    const uint64_t end = std::min<uint64_t>(num_samples, static_cast<uint64_t>(b + 1) * 4096);
    for (uint64_t i = static_cast<uint64_t>(b) * 4096; i < end; ++i) {
      const auto p = static_cast<uint64_t>(sa[i * stride]);
      if (p >= length) throw DatastoreError("corrupt datastore: suffix array entry out of range");
      Sym* key = keys + i * SearchIndex::kKeySymbols;
      int32_t j = 0;
      // The stream ends with a separator 0, so this stops inside it.
      for (; j < SearchIndex::kKeySymbols && stream[p + static_cast<uint64_t>(j)] != 0; ++j) {
        key[j] = stream[p + static_cast<uint64_t>(j)];
      }
      for (; j < SearchIndex::kKeySymbols; ++j) key[j] = 0;
    }
  });
}

// A bucket table needs 4 bytes per vocabulary entry and 32-bit sample numbers.
bool has_bucket_table(const DatastoreHeader& h, uint64_t num_samples) {
  return h.vocab_size + 2 <= (uint64_t{1} << 20) && num_samples < (uint64_t{1} << 32);
}

struct Policy {
  bool enabled = true;
  bool stride_set = false;  // the environment chose a stride
  uint64_t stride = kDefaultIndexStride;
  uint64_t min_tokens = kDefaultIndexMinTokens;
};

Policy read_policy() {
  Policy p;
  const char* env = std::getenv("SSSD_SEARCH_INDEX");
  if (env == nullptr || *env == '\0') return p;
  const std::string s(env);
  if (s == "off" || s == "0") {
    p.enabled = false;
    return p;
  }
  char* end = nullptr;
  const unsigned long long stride = std::strtoull(s.c_str(), &end, 10);
  if (stride >= 2 && (stride & (stride - 1)) == 0) {
    p.stride = stride;
    p.stride_set = true;
  }
  if (end != nullptr && *end == ',') p.min_tokens = std::strtoull(end + 1, nullptr, 10);
  return p;
}

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, std::shared_ptr<const SearchIndex>> indexes;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: mappings may outlive static destruction
  return *r;
}

}  // namespace

void SearchIndex::allocate_keys(uint32_t token_width) {
  keys_bytes_per_symbol_ = token_width;
  bytes_ = num_samples_ * static_cast<uint64_t>(kKeySymbols) * token_width;
  const uint64_t alloc = std::max<uint64_t>((bytes_ + kHugePage - 1) / kHugePage * kHugePage, kHugePage);
  if (posix_memalign(&keys_, kHugePage, static_cast<size_t>(alloc)) != 0) throw std::bad_alloc();
  madvise(keys_, static_cast<size_t>(alloc), MADV_HUGEPAGE);  // a hint; failure is harmless
}

void SearchIndex::init_singles(const DatastoreView& v) {
  const uint64_t symbols = v.header->vocab_size + 2;
  if (!buckets_.empty() && v.header->num_tokens < 0xffffffffu) {  // packed (lo, hi) words
    num_singles_ = symbols;
    singles_.reset(new std::atomic<uint64_t>[static_cast<size_t>(symbols)]);
    for (uint64_t x = 0; x < symbols; ++x) singles_[x].store(kUnknown, std::memory_order_relaxed);
  }
}

SearchIndex::SearchIndex(const DatastoreView& v, uint64_t stride)
    : stride_(stride), num_samples_((v.header->num_tokens + stride - 1) / stride) {
  const uint64_t sym_bytes = v.header->token_width;
  allocate_keys(static_cast<uint32_t>(sym_bytes));
  try {
    const bool sym16 = v.header->token_width == 2, idx32 = v.header->sa_width == 4;
    if (sym16 && idx32) fill_keys<uint16_t, int32_t>(v, stride, num_samples_, static_cast<uint16_t*>(keys_));
    if (sym16 && !idx32) fill_keys<uint16_t, int64_t>(v, stride, num_samples_, static_cast<uint16_t*>(keys_));
    if (!sym16 && idx32) fill_keys<uint32_t, int32_t>(v, stride, num_samples_, static_cast<uint32_t*>(keys_));
    if (!sym16 && !idx32) fill_keys<uint32_t, int64_t>(v, stride, num_samples_, static_cast<uint32_t*>(keys_));
  } catch (...) {
    std::free(keys_);
    throw;
  }
  if (has_bucket_table(*v.header, num_samples_)) {
    const uint64_t symbols = v.header->vocab_size + 2;  // 0 .. vocab + 1
    buckets_.assign(static_cast<size_t>(symbols), 0);
    auto first_symbol = [&](uint64_t i) -> uint64_t {
      return sym_bytes == 2 ? keys<uint16_t>()[i * kKeySymbols] : keys<uint32_t>()[i * kKeySymbols];
    };
    // Keys are sorted, so each first symbol's samples are contiguous: count, then prefix-sum.
    for (uint64_t i = 0; i < num_samples_; ++i) {
      const uint64_t x = first_symbol(i);
      if (x + 1 < symbols) ++buckets_[static_cast<size_t>(x + 1)];
    }
    for (size_t x = 1; x < buckets_.size(); ++x) buckets_[x] += buckets_[x - 1];
    build_pairs();
    init_singles(v);
  }
}

void SearchIndex::build_pairs() {
  auto symbol = [&](uint64_t i, int j) -> uint64_t {
    const uint64_t at = i * kKeySymbols + static_cast<uint64_t>(j);
    return keys_bytes_per_symbol_ == 2 ? keys<uint16_t>()[at] : keys<uint32_t>()[at];
  };
  // Keys are sorted, so the samples of each pair are contiguous: count the runs, then insert them.
  uint64_t runs = 0;
  for (uint64_t i = 0; i < num_samples_; ++i) {
    if (i == 0 || symbol(i, 0) != symbol(i - 1, 0) || symbol(i, 1) != symbol(i - 1, 1)) ++runs;
  }
  uint64_t cap = 1024;
  while (cap < 2 * runs) cap *= 2;
  pairs_.assign(static_cast<size_t>(cap), PairSlot{0, 0, 0});
  pair_mask_ = cap - 1;
  for (uint64_t i = 0; i < num_samples_;) {
    uint64_t e = i + 1;
    while (e < num_samples_ && symbol(e, 0) == symbol(i, 0) && symbol(e, 1) == symbol(i, 1)) ++e;
    const uint64_t key = pair_key(symbol(i, 0), symbol(i, 1));
    uint64_t h = pair_hash(key) & pair_mask_;
    while (pairs_[h].key != 0) h = (h + 1) & pair_mask_;
    pairs_[h] = PairSlot{key, static_cast<uint32_t>(i), static_cast<uint32_t>(e)};
    i = e;
  }
}

SearchIndex::~SearchIndex() { std::free(keys_); }

// ---------------------------------------------------------------------------------------------------
// The stored section

namespace {

uint64_t align8(uint64_t x) { return (x + 7) / 8 * 8; }

// Byte offsets of the parts of a stored section; false on overflow.
struct SectionLayout {
  uint64_t keys = sizeof(StoredIndexHeader), keys_bytes = 0, buckets = 0, pairs = 0, total = 0;
};

bool layout_of(const StoredIndexHeader& sh, SectionLayout* l) {
  uint64_t n = 0;
  if (__builtin_mul_overflow(sh.num_samples, uint64_t{SearchIndex::kKeySymbols} * sh.token_width, &n)) {
    return false;
  }
  l->keys_bytes = n;
  if (n > (uint64_t{1} << 60) || sh.num_buckets > (uint64_t{1} << 40) || sh.num_pair_slots > (uint64_t{1} << 40)) {
    return false;
  }
  l->buckets = align8(l->keys + n);
  l->pairs = align8(l->buckets + 4 * sh.num_buckets);
  l->total = l->pairs + 16 * sh.num_pair_slots;
  return true;
}

uint64_t combine(uint64_t h, uint64_t part) { return fnv1a64(&part, sizeof part) ^ (h * 0x100000001b3ull); }

uint64_t parts_checksum(const StoredIndexHeader& sh, const void* keys, uint64_t keys_bytes, const void* buckets,
                        uint64_t buckets_bytes, const void* pairs, uint64_t pairs_bytes) {
  uint64_t h = checksum64(&sh, sizeof sh);
  h = combine(h, checksum64(keys, static_cast<size_t>(keys_bytes)));
  h = combine(h, checksum64(buckets, static_cast<size_t>(buckets_bytes)));
  return combine(h, checksum64(pairs, static_cast<size_t>(pairs_bytes)));
}

[[noreturn]] void corrupt(const std::string& what) {
  throw DatastoreError("datastore search index section is corrupt: " + what +
                       "; rebuild the datastore with build-datastore (or set SSSD_SEARCH_INDEX=off)");
}

bool read_section_header(const DatastoreView& v, StoredIndexHeader* sh) {
  const DatastoreHeader& h = *v.header;
  if (!(h.flags & kFlagSearchIndex)) return false;
  if (h.index_bytes < sizeof(StoredIndexHeader)) corrupt("truncated (smaller than its header)");
  std::memcpy(sh, reinterpret_cast<const unsigned char*>(v.header) + h.index_offset, sizeof *sh);
  if (std::memcmp(sh->magic, kStoredIndexMagic, sizeof sh->magic) != 0) corrupt("bad magic bytes");
  return true;
}

// Compares the keys of up to 1024 evenly spread samples (and the last) with the suffixes they sample.
template <class Sym, class Idx>
bool keys_match(const DatastoreView& v, const SearchIndex& ix, uint64_t every) {
  const auto* stream = static_cast<const Sym*>(v.stream);
  const auto* sa = static_cast<const Idx*>(v.sa);
  const uint64_t n = ix.num_samples();
  auto matches = [&](uint64_t i) {
    const auto p = static_cast<uint64_t>(sa[i * ix.stride()]);
    if (p >= v.header->stream_length) return false;
    const Sym* key = ix.keys<Sym>() + i * SearchIndex::kKeySymbols;
    bool ended = false;  // past the separator the key holds zeros; the stream is not read further
    for (int32_t j = 0; j < SearchIndex::kKeySymbols; ++j) {
      const Sym want = ended ? Sym{0} : stream[p + static_cast<uint64_t>(j)];
      ended = ended || want == 0;
      if (key[j] != want) return false;
    }
    return true;
  };
  for (uint64_t i = 0; i < n; i += every) {
    if (!matches(i)) return false;
  }
  if (n > 0 && !matches(n - 1)) return false;
  return true;
}

}  // namespace

uint64_t stored_index_stride(const DatastoreView& v) {
  StoredIndexHeader sh;
  if (!read_section_header(v, &sh)) return 0;
  if (sh.version != kStoredIndexVersion || sh.key_symbols != static_cast<uint32_t>(SearchIndex::kKeySymbols)) {
    return 0;  // another version's index: build ours in memory instead
  }
  return sh.stride;
}

uint64_t stored_index_checksum(const unsigned char* section, uint64_t bytes) {
  StoredIndexHeader sh;
  SectionLayout l;
  if (bytes < sizeof sh) corrupt("truncated (smaller than its header)");
  std::memcpy(&sh, section, sizeof sh);
  if (!layout_of(sh, &l) || l.total > bytes) corrupt("truncated");
  return parts_checksum(sh, section + l.keys, l.keys_bytes, section + l.buckets, 4 * sh.num_buckets,
                        section + l.pairs, 16 * sh.num_pair_slots);
}

StoredIndexHeader SearchIndex::section_header() const {
  StoredIndexHeader sh;
  std::memset(&sh, 0, sizeof sh);
  std::memcpy(sh.magic, kStoredIndexMagic, sizeof sh.magic);
  sh.version = kStoredIndexVersion;
  sh.key_symbols = kKeySymbols;
  sh.token_width = keys_bytes_per_symbol_;
  sh.stride = stride_;
  sh.num_samples = num_samples_;
  sh.num_buckets = buckets_.size();
  sh.num_pair_slots = pairs_.size();
  return sh;
}

uint64_t SearchIndex::section_bytes() const {
  SectionLayout l;
  layout_of(section_header(), &l);
  return l.total;
}

uint64_t SearchIndex::section_checksum() const {
  return parts_checksum(section_header(), keys_, bytes_, buckets_.data(), 4 * buckets_.size(), pairs_.data(),
                        sizeof(PairSlot) * pairs_.size());
}

void SearchIndex::write_section(const std::function<void(const void*, size_t)>& write) const {
  static const char zeros[8] = {};
  const StoredIndexHeader sh = section_header();
  SectionLayout l;
  layout_of(sh, &l);
  write(&sh, sizeof sh);
  write(keys_, static_cast<size_t>(bytes_));
  write(zeros, static_cast<size_t>(l.buckets - l.keys - bytes_));
  write(buckets_.data(), 4 * buckets_.size());
  write(zeros, static_cast<size_t>(l.pairs - l.buckets - 4 * buckets_.size()));
  write(pairs_.data(), sizeof(PairSlot) * pairs_.size());
}

bool SearchIndex::same_as(const SearchIndex& o) const {
  return stride_ == o.stride_ && num_samples_ == o.num_samples_ && bytes_ == o.bytes_ &&
         keys_bytes_per_symbol_ == o.keys_bytes_per_symbol_ && std::memcmp(keys_, o.keys_, bytes_) == 0 &&
         buckets_ == o.buckets_ && pairs_.size() == o.pairs_.size() &&
         (pairs_.empty() || std::memcmp(pairs_.data(), o.pairs_.data(), sizeof(PairSlot) * pairs_.size()) == 0);
}

std::shared_ptr<const SearchIndex> SearchIndex::load(const DatastoreView& v) {
  const DatastoreHeader& h = *v.header;
  StoredIndexHeader sh;
  if (!read_section_header(v, &sh)) throw std::logic_error("no stored search index");
  if (sh.version != kStoredIndexVersion || sh.key_symbols != static_cast<uint32_t>(kKeySymbols)) {
    corrupt("unsupported version " + std::to_string(sh.version));
  }
  SectionLayout l;
  if (!layout_of(sh, &l) || l.total != h.index_bytes) {
    corrupt("truncated or oversized (" + std::to_string(h.index_bytes) + " bytes for its contents)");
  }
  if (sh.stride < 2 || (sh.stride & (sh.stride - 1)) != 0 || sh.token_width != h.token_width ||
      sh.num_samples != (h.num_tokens + sh.stride - 1) / sh.stride || sh.num_samples == 0 || sh.reserved0 != 0 ||
      sh.reserved1 != 0) {
    corrupt("its shape does not match the datastore");
  }
  const bool table = has_bucket_table(h, sh.num_samples);
  if (sh.num_buckets != (table ? h.vocab_size + 2 : 0) ||
      (table ? (sh.num_pair_slots < 1024 || (sh.num_pair_slots & (sh.num_pair_slots - 1)) != 0)
             : sh.num_pair_slots != 0)) {
    corrupt("its tables do not match the datastore");
  }
  const unsigned char* sec = reinterpret_cast<const unsigned char*>(v.header) + h.index_offset;
  // Read ahead: the mapping is MADV_RANDOM for the binary searches, but this is one sequential pass.
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(sec) / page * page;
  madvise(reinterpret_cast<void*>(start), static_cast<size_t>(reinterpret_cast<uintptr_t>(sec) + l.total - start),
          MADV_WILLNEED);
  std::shared_ptr<SearchIndex> ix(new SearchIndex());
  ix->stride_ = sh.stride;
  ix->num_samples_ = sh.num_samples;
  ix->allocate_keys(sh.token_width);
  // Copy first, then check the copy: what is verified is exactly what the searches will read.
  std::memcpy(ix->keys_, sec + l.keys, static_cast<size_t>(l.keys_bytes));
  const auto* b = reinterpret_cast<const uint32_t*>(sec + l.buckets);
  ix->buckets_.assign(b, b + sh.num_buckets);
  ix->pairs_.resize(static_cast<size_t>(sh.num_pair_slots));
  if (sh.num_pair_slots) std::memcpy(ix->pairs_.data(), sec + l.pairs, static_cast<size_t>(16 * sh.num_pair_slots));
  if (ix->section_checksum() != h.index_checksum) corrupt("checksum mismatch");
  // Structure: every bound find_ranges relies on (a crafted file may carry a valid checksum).
  for (size_t x = 0; x < ix->buckets_.size(); ++x) {
    if (ix->buckets_[x] > sh.num_samples || (x > 0 && ix->buckets_[x] < ix->buckets_[x - 1])) {
      corrupt("bucket table out of order or range");
    }
  }
  bool empty_slot = ix->pairs_.empty();
  for (const PairSlot& slot : ix->pairs_) {
    empty_slot = empty_slot || slot.key == 0;
    if (slot.key != 0 && (slot.begin > slot.end || slot.end > sh.num_samples)) corrupt("pair table out of range");
  }
  if (!empty_slot) corrupt("pair table has no empty slot");
  ix->pair_mask_ = ix->pairs_.empty() ? 0 : ix->pairs_.size() - 1;
  const uint64_t every = std::max<uint64_t>(1, sh.num_samples / 1024);
  const bool sym16 = h.token_width == 2, idx32 = h.sa_width == 4;
  const bool ok = sym16 ? (idx32 ? keys_match<uint16_t, int32_t>(v, *ix, every) : keys_match<uint16_t, int64_t>(v, *ix, every))
                        : (idx32 ? keys_match<uint32_t, int32_t>(v, *ix, every) : keys_match<uint32_t, int64_t>(v, *ix, every));
  if (!ok) corrupt("its keys do not match the suffix array");
  ix->init_singles(v);
  return ix;
}

std::shared_ptr<const SearchIndex> search_index_for(const DatastoreView& v) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.indexes.find(v.header);
  if (it != r.indexes.end()) return it->second;
  const Policy p = read_policy();
  std::shared_ptr<const SearchIndex> index;
  const uint64_t stored = p.enabled ? stored_index_stride(v) : 0;
  if (stored != 0 && (!p.stride_set || p.stride == stored)) {
    index = SearchIndex::load(v);  // throws on a corrupt section; nothing is remembered then
  } else if (p.enabled && v.header->num_tokens >= p.min_tokens && v.header->num_tokens > 0) {
    index = std::make_shared<const SearchIndex>(v, p.stride);
  }
  r.indexes.emplace(v.header, index);  // nullptr is remembered too: the policy is read once per mapping
  return index;
}

namespace {
std::atomic<uint64_t> g_generation{0};
}  // namespace

uint64_t mapping_generation() { return g_generation.load(std::memory_order_acquire); }

void search_index_release(const void* mapping) {
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  Registry& r = registry();
  std::shared_ptr<const SearchIndex> dropped;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.indexes.find(mapping);
  if (it == r.indexes.end()) return;
  dropped = std::move(it->second);
  r.indexes.erase(it);
}

}  // namespace sssd
