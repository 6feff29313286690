// Building a datastore file from token documents, and opening one with mmap.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/datastore_format.h"

namespace sssd {

// Progress of a long operation: (phase, done, total). May throw to abort the operation.
using ProgressFn = std::function<void(const char* phase, uint64_t done, uint64_t total)>;

// Collects documents in memory (as the stream: token + 1, 0 after each document), then sorts the
// suffixes and writes the file atomically. Memory: token_width bytes per token while collecting; the
// suffix array (4 or 8 bytes per token) and SA-IS workspace (about 1.5 bytes per token) while finishing
// (plus 8 bytes per token when ids far above the stream length force a rank-mapped copy of the stream).
class DatastoreBuilder {
 public:
  DatastoreBuilder(uint64_t vocab_size, std::string fingerprint, bool force_sa64 = false);

  // Appends the documents tokens[offsets[k], offsets[k+1]). offsets has num_docs + 1 entries, starts at
  // 0, is non-decreasing and ends at num_tokens. Token ids must lie in [0, vocab_size); on any error
  // nothing is appended. T is int32, int64, uint16 or uint32.
  template <class T>
  void add_documents(const T* tokens, int64_t num_tokens, const int64_t* offsets, int64_t num_docs);

  // Store a search index of this stride (search_index.h) when the corpus has at least min_tokens tokens;
  // stride 0: never. Default: stride 64 from 65,536 tokens (the in-memory policy's default). Extra build
  // memory: the index (about 1 byte per token at stride 64), after the suffix sort's workspace is freed.
  void set_search_index(uint64_t stride, uint64_t min_tokens);

  uint64_t num_tokens() const { return stream_length() - num_documents_; }
  uint64_t num_documents() const { return num_documents_; }
  uint64_t vocab_size() const { return vocab_size_; }

  // Builds the suffix array and writes the file to `path` via a temporary file + rename. On failure (or
  // when progress throws) no file is left at `path` and the temporary is removed. The builder is empty
  // afterwards either way.
  void finish(const std::string& path, const ProgressFn& progress);

 private:
  uint64_t stream_length() const { return width_ == 2 ? stream16_.size() : stream32_.size(); }
  template <class Sym>
  void write_file(const std::string& path, const std::vector<Sym>& stream, const ProgressFn& progress);

  uint64_t vocab_size_;
  std::string fingerprint_;
  bool force_sa64_;
  uint32_t width_;
  uint64_t index_stride_ = 64;  // kDefaultIndexStride
  uint64_t index_min_tokens_ = 65536;  // kDefaultIndexMinTokens
  uint64_t num_documents_ = 0;
  std::vector<uint64_t> doc_offsets_{0};
  std::vector<uint16_t> stream16_;
  std::vector<uint32_t> stream32_;
};

// A read-only memory map of a whole regular file. Anything else (a FIFO, a device, a directory) is a
// DatastoreError naming the path, raised before the file is read (a FIFO is never waited on). The file
// stays open so that check_size() can tell, before a read, whether it shrank under the mapping (reading
// a mapped page past the end of a truncated file raises SIGBUS).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Throws DatastoreError when the file is now shorter than the mapping (truncated in place).
  void check_size(const std::string& path) const;

 private:
  unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
};

class Datastore;

// Raw pointers into a validated datastore (owned elsewhere); what search reads.
struct DatastoreView {
  const DatastoreHeader* header = nullptr;
  const void* stream = nullptr;          // [stream_length] of token_width bytes
  const uint64_t* doc_offsets = nullptr;  // [num_documents + 1]
  const void* sa = nullptr;              // [num_tokens] of sa_width bytes
  const Datastore* owner = nullptr;      // the opened file (null for views of memory, in tests)
};

// An opened datastore: O(1) open (header checks only), pages come in on demand.
class Datastore {
 public:
  explicit Datastore(const std::string& path);
  const DatastoreHeader& header() const { return *view_.header; }
  const DatastoreView& view() const { return view_; }
  const std::string& path() const { return path_; }
  std::string fingerprint() const { return std::string(view_.header->fingerprint); }
  // Document k's tokens (ids, not stream symbols) appended to out; throws DatastoreError if corrupt.
  void document(uint64_t k, std::vector<int32_t>& out) const;
  // Full O(n) consistency check: content checksum, offsets, token range, suffix-array order (a rank
  // array: 4 bytes per stream symbol, 8 past 2^32). Throws DatastoreError (datastore_verify.cpp).
  void verify(const ProgressFn& progress) const;
  // What every read path calls first (check_mapping): the file was not truncated under the mapping
  // (an fstat, every call), and its content checksum matches (once per opened file; files without one
  // pass). Throws DatastoreError naming the path.
  void check_usable() const;

 private:
  void check_contents() const;
  std::string path_;
  MappedFile file_;
  DatastoreView view_;
  mutable std::atomic<bool> contents_checked_{false};
  mutable std::mutex check_mutex_;
};

// v.owner->check_usable() for views of opened files; nothing for views of memory.
void check_mapping(const DatastoreView& v);

// Checks that the shards can be searched as one datastore (same vocabulary size; a search index's
// tables are sized by it) and that every mapped file is still whole (check_mapping). Throws
// DatastoreError.
void check_shards(const std::vector<DatastoreView>& shards);

}  // namespace sssd
