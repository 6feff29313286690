// The datastore file format (version 1). All integers little-endian.
//
//   [0, 256)            Header (below)
//   stream_offset       token stream: stream_length symbols of token_width bytes. A token t is stored
//                       as t + 1; 0 ends every document (so the stream ends with 0). Matches therefore
//                       never run across a document boundary, and a scan stops at the final 0 without
//                       a bounds check.
//   doc_offsets_offset  uint64[num_documents + 1]: document k is stream[doc[k], doc[k+1] - 1), the
//                       separator at doc[k+1] - 1.
//   sa_offset           suffix array: num_tokens stream positions (int32, or int64 when sa_width is 8)
//                       of every real token, sorted by the suffix up to its document's end; a suffix
//                       that ends first sorts first.
//   index_offset        optional (flags & kFlagSearchIndex): the stored search index, index_bytes long,
//                       after the suffix array; its own layout and version are in search_index.h. Its
//                       checksum (index_checksum) is checked when it is loaded (on the first search),
//                       not at open. Files without it (flags 0, fields 0) build the index in memory on
//                       the first search; readers that predate the flag ignore it (same version 1).
//
// Content checksum (flags & kFlagContentChecksum): content_checksum() of every byte from stream_offset to
// the stored index (or the end of the file): sections and the padding between them. Written by the
// builder and checked once per opened file, on its first use (search, drafting, document(), verify()),
// not at open. Files without the flag (older builds) are used unchecked; verify() checks their
// structure in full. The header has its checksum and the stored index its own: every byte is covered.
//
// Suffix order: suffixes compare up to their document's end (a suffix that ends first sorts first);
// suffixes equal up to their documents' ends appear in the order of the suffixes one position later
// (the builder sorts whole-stream suffixes, which gives exactly this; verify() checks it in O(n)).
//
// Every section lies after the header, is 64-byte aligned, and inside file_size; validate_header()
// checks all of it against the real file size before any section is touched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace sssd {

// Raised for files that are not datastores, are truncated or corrupt, or are incompatible.
class DatastoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr char kDatastoreMagic[8] = {'S', 'S', 'S', 'D', 'S', 'T', 'O', 'R'};
constexpr uint32_t kDatastoreVersion = 1;
constexpr size_t kFingerprintBytes = 120;
constexpr uint64_t kSectionAlign = 64;
constexpr uint32_t kFlagSearchIndex = 1;     // the file stores a search index section
constexpr uint32_t kFlagContentChecksum = 2;  // content_checksum holds the sections' checksum
// Token width: the stream stores token t as the symbol t + 1 (0 is the document separator), so uint16
// symbols hold tokens 0..65534 only. A datastore therefore uses uint16 iff vocab_size <= 65535 and uint32
// otherwise (vocab_size 65536 has the id 65535, stored as 65536). This is one less than the "vocab <=
// 65536" of the design; it is the price of an in-band separator that sorts below every token.
constexpr uint64_t kMaxVocabUint16 = 65535;
// Token ids travel as int32 everywhere (contexts, tries, document()), so ids stop at INT32_MAX: the
// largest vocabulary is 2^31 (stored symbols up to 2^31 still fit the uint32 stream).
constexpr uint64_t kMaxVocab = uint64_t{1} << 31;

struct DatastoreHeader {
  char magic[8];
  uint32_t version;
  uint32_t token_width;  // 2 or 4 bytes per stream symbol
  uint32_t sa_width;     // 4 or 8 bytes per suffix-array entry
  uint32_t flags;        // kFlagSearchIndex | kFlagContentChecksum; other bits are ignored
  uint64_t vocab_size;
  uint64_t num_tokens;     // real tokens, separators excluded
  uint64_t num_documents;  // including empty ones
  uint64_t stream_length;  // num_tokens + num_documents
  uint64_t stream_offset;
  uint64_t doc_offsets_offset;
  uint64_t sa_offset;
  uint64_t file_size;
  char fingerprint[kFingerprintBytes];  // tokenizer fingerprint, NUL-terminated
  uint64_t index_offset;    // 0 without a stored search index
  uint64_t index_bytes;     // 0 without a stored search index
  uint64_t index_checksum;  // search_index.h: stored_index_checksum
  uint64_t content_checksum;  // with kFlagContentChecksum: content_checksum() of the sections (else 0)
  uint64_t reserved;
  uint64_t header_checksum;  // FNV-1a 64 of the preceding 248 bytes
};
static_assert(sizeof(DatastoreHeader) == 256, "header must be 256 bytes");

uint64_t fnv1a64(const void* data, size_t n);
// A fast 64-bit checksum (four lanes of 64-bit words, xxHash64-style rounds): runs at memory speed, for
// sections too large for the byte-at-a-time FNV-1a.
uint64_t checksum64(const void* data, size_t n);
uint64_t align_section(uint64_t x);  // rounds up to kSectionAlign

// The end of the bytes the content checksum covers: the stored search index's offset (the index has its
// own checksum), else the end of the file.
uint64_t content_end(const DatastoreHeader& h);
// The checksum of the bytes [stream_offset, content_end(h)) of a whole file mapped at `file` (header
// already validated): checksum64 of every 16 MiB block, in parallel, then checksum64 of those block
// checksums. Memory speed on every core.
uint64_t content_checksum(const unsigned char* file, const DatastoreHeader& h);
uint32_t token_width_for_vocab(uint64_t vocab_size);  // throws std::invalid_argument past the limit

// Fills in offsets, widths, file size and checksum for a datastore of the given shape.
DatastoreHeader make_header(uint64_t vocab_size, uint64_t num_tokens, uint64_t num_documents,
                            const std::string& fingerprint, bool force_sa64);
void seal_header(DatastoreHeader& h);  // recomputes the checksum

// Checks the header against the actual file size; throws DatastoreError with a precise message.
void validate_header(const DatastoreHeader& h, uint64_t actual_file_size);

}  // namespace sssd
