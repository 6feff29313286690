#include "core/datastore.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
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

// Temporary files of a build are named `.<target>.tmp.<pid>.<n>` next to the target: hidden, and
// recognisable as the leftovers of the build of that target by process pid.
std::string temp_prefix(const std::string& final_path) {
  const size_t slash = final_path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : final_path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? final_path : final_path.substr(slash + 1);
  return dir + "." + name + ".tmp.";
}

// Removes the temporaries that killed builds of this target left behind (a process killed by SIGKILL
// runs no cleanup): `.<target>.tmp.<pid>.<n>` whose pid is not a live process. A live pid (maybe a
// concurrent build of the same target) keeps its files.
void remove_stale_temporaries(const std::string& final_path) {
  const std::string prefix = temp_prefix(final_path);
  const size_t slash = prefix.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : prefix.substr(0, slash + 1);
  const std::string stem = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, stem.size(), stem) != 0) continue;
    const std::string rest = name.substr(stem.size());  // "<pid>.<n>"
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || rest.find_first_not_of("0123456789.") != std::string::npos) continue;
    const long pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
    if (pid <= 0 || pid == static_cast<long>(getpid())) continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::remove((slash == std::string::npos ? name : dir + name).c_str());
    }
  }
  closedir(d);
}

class TempFile {
 public:
  explicit TempFile(const std::string& final_path) {
    static std::atomic<uint64_t> counter{0};
    remove_stale_temporaries(final_path);
    path_ = temp_prefix(final_path) + std::to_string(getpid()) + "." + std::to_string(counter++);
    f_ = std::fopen(path_.c_str(), "w+b");  // read back for the content checksum
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
  // Sets the content checksum of the file written so far (its sections up to the suffix array's end)
  // in h and rewrites the header. Reads the bytes back through a mapping: they are in the page cache.
  void seal_contents(DatastoreHeader& h) {
    if (std::fflush(f_) != 0) throw std::system_error(errno, std::generic_category(), "write failed on " + path_);
    const uint64_t end = content_end(h);
    void* p = mmap(nullptr, static_cast<size_t>(end), PROT_READ, MAP_SHARED, fileno(f_), 0);
    if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "cannot map " + path_);
    madvise(p, static_cast<size_t>(end), MADV_SEQUENTIAL);
    h.content_checksum = content_checksum(static_cast<const unsigned char*>(p), h);
    munmap(p, static_cast<size_t>(end));
    h.flags |= kFlagContentChecksum;
    seal_header(h);
    rewrite(0, &h, sizeof h);
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
  progress("checksum", 0, 1);
  out.seal_contents(h);
  progress("checksum", 1, 1);
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

}  // namespace sssd
