// Opening a datastore file: the mapping, the header and spot checks (O(1)), and the checks every read
// path makes first (truncation, content checksum).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>

#include "core/datastore.h"
#include "core/search_index.h"

namespace sssd {

MappedFile::MappedFile(const std::string& path) {
  // stat first: open() of a FIFO would wait for a writer. O_NONBLOCK covers a path replaced in between.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw DatastoreError(path + " is not a regular file (" +
                         (S_ISDIR(st.st_mode)    ? "a directory"
                          : S_ISFIFO(st.st_mode) ? "a FIFO"
                          : S_ISCHR(st.st_mode)  ? "a character device"
                          : S_ISBLK(st.st_mode)  ? "a block device"
                                                 : "not a file") +
                         "); a datastore is a file written by build-datastore");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) throw std::system_error(errno, std::generic_category(), path);
    throw std::system_error(errno, std::generic_category(), "cannot open " + path);
  }
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
  fd_ = fd;
}

MappedFile::~MappedFile() {
  search_index_release(data_);  // a later mapping may reuse the address
  if (data_) munmap(data_, static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::check_size(const std::string& path) const {
  struct stat st;
  if (fd_ >= 0 && fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) < size_) {
    throw DatastoreError(path + " was truncated while open (" + std::to_string(st.st_size) + " bytes, " +
                         std::to_string(size_) + " mapped): datastore files must be replaced (written "
                         "elsewhere, then renamed), never rewritten in place; open it again");
  }
}

namespace {

uint64_t stream_at(const DatastoreView& v, uint64_t i) {
  return v.header->token_width == 2 ? static_cast<const uint16_t*>(v.stream)[i]
                                    : static_cast<const uint32_t*>(v.stream)[i];
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
  view_.owner = this;
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

void check_mapping(const DatastoreView& v) {
  if (v.owner != nullptr) v.owner->check_usable();
}

void check_shards(const std::vector<DatastoreView>& views) {
  for (const DatastoreView& v : views) {
    if (v.header == nullptr) throw std::invalid_argument("a shard is not an opened datastore");
    if (v.header->vocab_size != views[0].header->vocab_size) {
      throw DatastoreError("shards of one datastore must share the vocabulary size: " +
                           std::to_string(v.header->vocab_size) + " vs " +
                           std::to_string(views[0].header->vocab_size));
    }
    check_mapping(v);
  }
}

void Datastore::check_usable() const {
  file_.check_size(path_);
  if (!contents_checked_.load(std::memory_order_acquire)) check_contents();
}

void Datastore::check_contents() const {
  std::lock_guard<std::mutex> lock(check_mutex_);  // one check per file, whatever the threads
  if (contents_checked_.load(std::memory_order_relaxed)) return;
  const DatastoreHeader& h = *view_.header;
  if ((h.flags & kFlagContentChecksum) && content_checksum(file_.data(), h) != h.content_checksum) {
    throw DatastoreError(path_ + ": corrupt: the content checksum does not match (the file was damaged "
                         "after it was written); rebuild it with build-datastore");
  }
  contents_checked_.store(true, std::memory_order_release);
}

void Datastore::document(uint64_t k, std::vector<int32_t>& out) const {
  const DatastoreHeader& h = *view_.header;
  if (k >= h.num_documents) {
    throw std::invalid_argument("document index " + std::to_string(k) + " is out of range [0, " +
                                std::to_string(h.num_documents) + ")");
  }
  check_usable();
  const uint64_t begin = view_.doc_offsets[k], end = view_.doc_offsets[k + 1];
  if (begin >= end || end > h.stream_length) throw DatastoreError(path_ + ": corrupt document table");
  for (uint64_t i = begin; i + 1 < end; ++i) {
    const uint64_t s = stream_at(view_, i);
    if (s == 0 || s > h.vocab_size) throw DatastoreError(path_ + ": corrupt token stream");
    out.push_back(static_cast<int32_t>(s - 1));
  }
}

}  // namespace sssd
