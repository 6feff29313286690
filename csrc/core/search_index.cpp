#include "core/search_index.h"

#include <sys/mman.h>

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

struct Policy {
  bool enabled = true;
  uint64_t stride = 64;
  uint64_t min_tokens = 65536;
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
  if (stride >= 2 && (stride & (stride - 1)) == 0) p.stride = stride;
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

SearchIndex::SearchIndex(const DatastoreView& v, uint64_t stride)
    : stride_(stride), num_samples_((v.header->num_tokens + stride - 1) / stride) {
  const uint64_t sym_bytes = v.header->token_width;
  keys_bytes_per_symbol_ = static_cast<uint32_t>(sym_bytes);
  bytes_ = num_samples_ * static_cast<uint64_t>(kKeySymbols) * sym_bytes;
  const uint64_t alloc = std::max<uint64_t>((bytes_ + kHugePage - 1) / kHugePage * kHugePage, kHugePage);
  if (posix_memalign(&keys_, kHugePage, static_cast<size_t>(alloc)) != 0) throw std::bad_alloc();
  madvise(keys_, static_cast<size_t>(alloc), MADV_HUGEPAGE);  // a hint; failure is harmless
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
  const uint64_t symbols = v.header->vocab_size + 2;  // 0 .. vocab + 1
  if (symbols <= (uint64_t{1} << 20) && num_samples_ < (uint64_t{1} << 32)) {
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
    if (v.header->num_tokens < 0xffffffffu) {  // packed (lo, hi) words
      num_singles_ = symbols;
      singles_.reset(new std::atomic<uint64_t>[static_cast<size_t>(symbols)]);
      for (uint64_t x = 0; x < symbols; ++x) singles_[x].store(kUnknown, std::memory_order_relaxed);
    }
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

std::shared_ptr<const SearchIndex> search_index_for(const DatastoreView& v) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.indexes.find(v.header);
  if (it != r.indexes.end()) return it->second;
  const Policy p = read_policy();
  std::shared_ptr<const SearchIndex> index;
  if (p.enabled && v.header->num_tokens >= p.min_tokens && v.header->num_tokens > 0) {
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
