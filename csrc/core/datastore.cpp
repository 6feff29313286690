#include "core/datastore.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <system_error>
#include <type_traits>

#include "core/search_index.h"
#include "core/suffix_array.h"

namespace sssd {

// ---------------------------------------------------------------------------------------------------
// Building

DatastoreBuilder::DatastoreBuilder(uint64_t vocab_size, std::string fingerprint, bool force_sa64)
    : vocab_size_(vocab_size),
      fingerprint_(std::move(fingerprint)),
      force_sa64_(force_sa64),
      width_(token_width_for_vocab(vocab_size)) {
  if (fingerprint_.size() >= kFingerprintBytes) {
    throw std::invalid_argument("tokenizer fingerprint is longer than 119 bytes");
  }
}

void DatastoreBuilder::set_search_index(uint64_t stride, uint64_t min_tokens) {
  if (stride != 0 && (stride < 2 || (stride & (stride - 1)) != 0)) {
    throw std::invalid_argument("search index stride must be 0 (no index) or a power of two >= 2, got " +
                                std::to_string(stride));
  }
  index_stride_ = stride;
  index_min_tokens_ = min_tokens;
}

template <class T>
void DatastoreBuilder::add_documents(const T* tokens, int64_t num_tokens, const int64_t* offsets,
                                     int64_t num_docs) {
  if (num_tokens < 0 || num_docs < 0) throw std::invalid_argument("negative size");
  if (offsets[0] != 0 || offsets[num_docs] != num_tokens) {
    throw std::invalid_argument("document offsets must start at 0 and end at the number of tokens");
  }
  for (int64_t k = 0; k < num_docs; ++k) {
    if (offsets[k + 1] < offsets[k]) throw std::invalid_argument("document offsets must not decrease");
  }
  for (int64_t i = 0; i < num_tokens; ++i) {
    const T t = tokens[i];
    bool bad = static_cast<uint64_t>(t) >= vocab_size_;
    if constexpr (std::is_signed_v<T>) bad = bad || t < 0;
    if (bad) {
      throw std::invalid_argument("token id " + std::to_string(static_cast<int64_t>(t)) + " at position " +
                              std::to_string(i) + " is outside the vocabulary [0, " +
                              std::to_string(vocab_size_) + ")");
    }
  }
  auto append = [&](auto& stream) {
    using Sym = typename std::remove_reference_t<decltype(stream)>::value_type;
    // Grow geometrically: an exact reserve per chunk would reallocate (and copy the whole stream) on
    // every call when documents arrive in many small chunks.
    const size_t need = stream.size() + static_cast<size_t>(num_tokens + num_docs);
    if (need > stream.capacity()) stream.reserve(std::max(need, stream.capacity() * 2));
    for (int64_t k = 0; k < num_docs; ++k) {
      for (int64_t i = offsets[k]; i < offsets[k + 1]; ++i) {
        // Widen before adding 1: an int32 id may be INT32_MAX when vocab_size allows it.
        stream.push_back(static_cast<Sym>(static_cast<uint64_t>(tokens[i]) + 1));
      }
      stream.push_back(0);
      doc_offsets_.push_back(stream.size());
    }
  };
  if (width_ == 2) {
    append(stream16_);
  } else {
    append(stream32_);
  }
  num_documents_ += static_cast<uint64_t>(num_docs);
}

template void DatastoreBuilder::add_documents(const int32_t*, int64_t, const int64_t*, int64_t);
template void DatastoreBuilder::add_documents(const int64_t*, int64_t, const int64_t*, int64_t);
template void DatastoreBuilder::add_documents(const uint16_t*, int64_t, const int64_t*, int64_t);
template void DatastoreBuilder::add_documents(const uint32_t*, int64_t, const int64_t*, int64_t);

namespace {

class TempFile {
 public:
  explicit TempFile(const std::string& final_path) {
    static std::atomic<uint64_t> counter{0};
    path_ = final_path + ".tmp-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) throw std::system_error(errno, std::generic_category(), "cannot create " + path_);
  }
  ~TempFile() {
    if (f_) std::fclose(f_);
    if (!committed_) std::remove(path_.c_str());
  }
  void write(const void* data, size_t bytes) {
    if (bytes && std::fwrite(data, 1, bytes, f_) != bytes) {
      throw std::system_error(errno, std::generic_category(), "write failed on " + path_);
    }
  }
  void rewrite(uint64_t offset, const void* data, size_t bytes) {
    if (std::fseek(f_, static_cast<long>(offset), SEEK_SET) != 0) {
      throw std::system_error(errno, std::generic_category(), "seek failed on " + path_);
    }
    write(data, bytes);
    if (std::fseek(f_, 0, SEEK_END) != 0) throw std::system_error(errno, std::generic_category(), "seek failed");
  }
  void pad_to(uint64_t offset) {
    static const char zeros[64] = {};
    const long pos = std::ftell(f_);
    if (pos < 0 || static_cast<uint64_t>(pos) > offset) throw std::logic_error("bad section offset");
    write(zeros, static_cast<size_t>(offset - static_cast<uint64_t>(pos)));
  }
  void commit(const std::string& final_path) {
    if (std::fflush(f_) != 0 || fsync(fileno(f_)) != 0) {
      throw std::system_error(errno, std::generic_category(), "cannot flush " + path_);
    }
    std::fclose(f_);
    f_ = nullptr;
    if (std::rename(path_.c_str(), final_path.c_str()) != 0) {
      throw std::system_error(errno, std::generic_category(), "cannot rename to " + final_path);
    }
    committed_ = true;
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

// SA-IS needs a bucket array as large as its alphabet, so the alphabet is the largest symbol present,
// not vocab_size + 1. Ids far above the stream length (a huge vocab_size used sparsely) are first mapped
// to their ranks among the distinct symbols: the order, hence the suffix array, is the same, and the
// buckets stay as small as the text (a 2^32 alphabet would need 16-32 GB of buckets, and does not fit
// an int32 index at all).
template <class Sym, class Idx>
void sort_suffixes(const std::vector<Sym>& stream, Idx* sa) {
  const auto n = static_cast<int64_t>(stream.size());
  const uint64_t alphabet = uint64_t{*std::max_element(stream.begin(), stream.end())} + 1;
  if (alphabet <= std::max<uint64_t>(stream.size(), uint64_t{1} << 17)) {
    build_suffix_array(stream.data(), sa, n, static_cast<int64_t>(alphabet));
    return;
  }
  std::vector<uint32_t> distinct(stream.begin(), stream.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<uint32_t> ranks(stream.size());
  for (size_t i = 0; i < stream.size(); ++i) {
    ranks[i] = static_cast<uint32_t>(std::lower_bound(distinct.begin(), distinct.end(), stream[i]) -
                                     distinct.begin());
  }
  build_suffix_array(ranks.data(), sa, n, static_cast<int64_t>(distinct.size()));
}

// Builds the search index from the sorted suffixes in memory (the same one the first search would build
// from the file) and appends it as the stored section; updates and rewrites the header.
template <class Sym, class Idx>
void write_index(TempFile& out, DatastoreHeader& h, const std::vector<Sym>& stream, const Idx* sa,
                 uint64_t stride, const ProgressFn& progress) {
  progress("building search index", 0, 1);
  DatastoreView v;
  v.header = &h;
  v.stream = stream.data();
  v.sa = sa;
  const SearchIndex index(v, stride);
  h.flags |= kFlagSearchIndex;
  h.index_offset = align_section(h.file_size);
  h.index_bytes = index.section_bytes();
  h.index_checksum = index.section_checksum();
  h.file_size = h.index_offset + h.index_bytes;
  seal_header(h);
  out.pad_to(h.index_offset);
  index.write_section([&](const void* data, size_t bytes) { out.write(data, bytes); });
  out.rewrite(0, &h, sizeof h);
  progress("building search index", 1, 1);
}

template <class Sym, class Idx>
void sort_and_write(TempFile& out, DatastoreHeader& h, const std::vector<Sym>& stream, uint64_t index_stride,
                    const ProgressFn& progress) {
  std::vector<Idx> sa(stream.size());
  progress("sorting suffixes", 0, 1);
  sort_suffixes(stream, sa.data());
  progress("sorting suffixes", 1, 1);
  // Separators (symbol 0) are the smallest symbols, so their suffixes fill the first num_documents
  // slots; the datastore indexes real tokens only.
  const uint64_t d = h.num_documents;
  if (d < sa.size() && stream[static_cast<size_t>(sa[d])] == 0) throw std::logic_error("suffix order");
  out.pad_to(h.sa_offset);
  const uint64_t chunk = uint64_t{1} << 22;
  for (uint64_t i = d; i < sa.size(); i += chunk) {
    const uint64_t n = std::min<uint64_t>(chunk, sa.size() - i);
    out.write(sa.data() + i, static_cast<size_t>(n * sizeof(Idx)));
    progress("writing suffix array", i + n - d, sa.size() - d);
  }
  if (index_stride != 0) write_index(out, h, stream, sa.data() + d, index_stride, progress);
}

}  // namespace

template <class Sym>
void DatastoreBuilder::write_file(const std::string& path, const std::vector<Sym>& stream,
                                  const ProgressFn& progress) {
  DatastoreHeader h = make_header(vocab_size_, num_tokens(), num_documents_, fingerprint_, force_sa64_);
  const uint64_t index_stride = num_tokens() >= index_min_tokens_ ? index_stride_ : 0;
  TempFile out(path);
  out.write(&h, sizeof h);
  out.pad_to(h.stream_offset);
  out.write(stream.data(), stream.size() * sizeof(Sym));
  out.pad_to(h.doc_offsets_offset);
  out.write(doc_offsets_.data(), doc_offsets_.size() * sizeof(uint64_t));
  if (h.sa_width == 4) {
    sort_and_write<Sym, int32_t>(out, h, stream, index_stride, progress);
  } else {
    sort_and_write<Sym, int64_t>(out, h, stream, index_stride, progress);
  }
  out.commit(path);
}

void DatastoreBuilder::finish(const std::string& path, const ProgressFn& progress) {
  struct Reset {
    DatastoreBuilder* b;
    ~Reset() {
      b->stream16_ = {};
      b->stream32_ = {};
      b->doc_offsets_ = {0};
      b->num_documents_ = 0;
    }
  } reset{this};
  if (num_tokens() == 0) {
    throw std::invalid_argument("the corpus is empty: no tokens in any document");
  }
  const ProgressFn report = progress ? progress : [](const char*, uint64_t, uint64_t) {};
  if (width_ == 2) {
    write_file(path, stream16_, report);
  } else {
    write_file(path, stream32_, report);
  }
}

// ---------------------------------------------------------------------------------------------------
// Opening

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw std::system_error(errno, std::generic_category(), path);
    throw std::system_error(errno, std::generic_category(), "cannot open " + path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DatastoreError(path + " is not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw std::system_error(err, std::generic_category(), "cannot mmap " + path);
    }
    data_ = static_cast<unsigned char*>(p);
    madvise(p, static_cast<size_t>(size_), MADV_RANDOM);  // binary searches jump around
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  search_index_release(data_);  // a later mapping may reuse the address
  if (data_) munmap(data_, static_cast<size_t>(size_));
}

namespace {

uint64_t stream_at(const DatastoreView& v, uint64_t i) {
  return v.header->token_width == 2 ? static_cast<const uint16_t*>(v.stream)[i]
                                    : static_cast<const uint32_t*>(v.stream)[i];
}

uint64_t sa_at(const DatastoreView& v, uint64_t i) {
  return v.header->sa_width == 4 ? static_cast<uint64_t>(static_cast<const int32_t*>(v.sa)[i])
                                 : static_cast<uint64_t>(static_cast<const int64_t*>(v.sa)[i]);
}

}  // namespace

Datastore::Datastore(const std::string& path) : path_(path), file_(path) {
  if (file_.size() < sizeof(DatastoreHeader)) {
    throw DatastoreError(path + ": truncated: " + std::to_string(file_.size()) +
                         " bytes is smaller than a datastore header");
  }
  const auto* h = reinterpret_cast<const DatastoreHeader*>(file_.data());
  try {
    validate_header(*h, file_.size());
  } catch (const DatastoreError& e) {
    throw DatastoreError(path + ": " + e.what());
  }
  view_.header = h;
  view_.stream = file_.data() + h->stream_offset;
  view_.doc_offsets = reinterpret_cast<const uint64_t*>(file_.data() + h->doc_offsets_offset);
  view_.sa = file_.data() + h->sa_offset;
  // O(1) spot checks that make every later scan safe: the stream ends with a separator (scans stop
  // there) and the document table spans the stream.
  if (h->stream_length > 0 && stream_at(view_, h->stream_length - 1) != 0) {
    throw DatastoreError(path + ": corrupt: the token stream does not end with a document separator");
  }
  if (view_.doc_offsets[0] != 0 || view_.doc_offsets[h->num_documents] != h->stream_length) {
    throw DatastoreError(path + ": corrupt: the document table does not span the token stream");
  }
}

void Datastore::document(uint64_t k, std::vector<int32_t>& out) const {
  const DatastoreHeader& h = *view_.header;
  if (k >= h.num_documents) throw std::out_of_range("document index out of range");
  const uint64_t begin = view_.doc_offsets[k], end = view_.doc_offsets[k + 1];
  if (begin >= end || end > h.stream_length) throw DatastoreError(path_ + ": corrupt document table");
  for (uint64_t i = begin; i + 1 < end; ++i) {
    const uint64_t s = stream_at(view_, i);
    if (s == 0 || s > h.vocab_size) throw DatastoreError(path_ + ": corrupt token stream");
    out.push_back(static_cast<int32_t>(s - 1));
  }
}

void Datastore::verify(const ProgressFn& progress) const {
  const DatastoreHeader& h = *view_.header;
  const ProgressFn report = progress ? progress : [](const char*, uint64_t, uint64_t) {};
  for (uint64_t k = 0; k < h.num_documents; ++k) {
    const uint64_t b = view_.doc_offsets[k], e = view_.doc_offsets[k + 1];
    if (b >= e || e > h.stream_length || stream_at(view_, e - 1) != 0) {
      throw DatastoreError(path_ + ": corrupt document table at document " + std::to_string(k));
    }
    for (uint64_t i = b; i + 1 < e; ++i) {
      const uint64_t s = stream_at(view_, i);
      if (s == 0 || s > h.vocab_size) throw DatastoreError(path_ + ": corrupt token stream");
    }
  }
  report("checking documents", 1, 1);
  std::vector<uint64_t> seen(static_cast<size_t>(h.stream_length / 64 + 1), 0);
  auto less_or_equal = [&](uint64_t a, uint64_t b) {  // suffix(a) <= suffix(b), up to document ends
    for (;; ++a, ++b) {
      const uint64_t x = stream_at(view_, a), y = stream_at(view_, b);
      if (x != y) return x < y;
      if (x == 0) return true;
    }
  };
  for (uint64_t i = 0; i < h.num_tokens; ++i) {
    const uint64_t p = sa_at(view_, i);
    if (p >= h.stream_length || stream_at(view_, p) == 0 || ((seen[p >> 6] >> (p & 63)) & 1)) {
      throw DatastoreError(path_ + ": corrupt suffix array at entry " + std::to_string(i));
    }
    seen[p >> 6] |= uint64_t{1} << (p & 63);
    if (i > 0 && !less_or_equal(sa_at(view_, i - 1), p)) {
      throw DatastoreError(path_ + ": suffix array is not sorted at entry " + std::to_string(i));
    }
    if ((i & 0xFFFFF) == 0) report("checking suffix array", i, h.num_tokens);
  }
  report("checking suffix array", h.num_tokens, h.num_tokens);
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
