// safetensors files: a validating reader and an atomic writer.
//
// Format: an 8-byte little-endian unsigned header length N, N bytes of a JSON object, then the data
// section. Each JSON key other than "__metadata__" names a tensor:
//   {"dtype": "F32", "shape": [3, 4], "data_offsets": [begin, end]}
// with byte offsets relative to the start of the data section; "__metadata__" is a string→string map.
// The reader checks everything before any tensor byte is read (see parse_header), and afterwards
// only reads inside the ranges it checked. The writer pads the header with spaces to a multiple of 8
// bytes, so the data section (and every tensor, whose sizes are multiples of their element size)
// starts 8-byte aligned in the file.
#ifndef DST_CHECKPOINT_SAFETENSORS_H
#define DST_CHECKPOINT_SAFETENSORS_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dstransformer/dstransformer.h"  // defines: dst_status, dst_dtype

namespace dst::st {

// Largest JSON header accepted (the Hugging Face reader uses the same bound).
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

// True when s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF),
// as JSON text must be; otherwise *bad_at (when not NULL) receives the offset of the first bad byte.
bool valid_utf8(const char *s, size_t n, size_t *bad_at);

// Element size of a safetensors dtype string ("F32", "BF16", "I64", "BOOL", ...); 0 when unknown.
size_t dtype_size(const std::string &dtype);
// The safetensors dtype string of a dst_dtype ("F32", "F16", "BF16", "F64", "I32").
const char *dtype_name(dst_dtype dt);
// The dst_dtype of a safetensors dtype string; false for dtypes the library does not handle.
bool to_dst_dtype(const std::string &dtype, dst_dtype *out);

struct Entry {
    std::string name;
    std::string dtype;
    size_t elem_size = 0;
    std::vector<int64_t> shape;
    uint64_t numel = 0;
    uint64_t begin = 0, end = 0;  // byte range inside the data section
    uint64_t bytes() const { return end - begin; }
};

struct Header {
    std::vector<Entry> tensors;  // in the order of the JSON object (sorted by name)
    std::map<std::string, std::string> metadata;
    std::map<std::string, size_t> index;  // name -> position in `tensors`
    uint64_t data_start = 0;              // file offset of the data section (8 + header length)
    uint64_t data_size = 0;

    const Entry *find(const std::string &name) const;
};

// Parses and validates the JSON header of a file whose data section has `data_size` bytes, in
// O(n log n) time for n tensors (no step looks at all the names seen so far once per name).
// Returns DST_ERR_FORMAT, prefixed by `fn` and `path` and naming the tensor and field, on any violation:
// not a JSON object; a tensor entry that is not an object or lacks dtype/shape/data_offsets; an unknown
// dtype; a shape that is not a list of non-negative integers; data_offsets not [begin, end] with
// begin <= end <= data_size; end - begin != numel * element size (overflow-checked); two tensors whose
// byte ranges overlap; a duplicate key; "__metadata__" not a map of strings to strings.
dst_status parse_header(const char *fn, const char *path, const char *text, size_t text_len, uint64_t data_size,
                        Header *out);

// An open safetensors file, its header validated.
class Reader {
public:
    Reader() = default;
    ~Reader();
    Reader(const Reader &) = delete;
    Reader &operator=(const Reader &) = delete;

    // Opens `path` and validates its framing and header. DST_ERR_IO when it cannot be opened or read or
    // is not a regular file (checked on the open descriptor, which is opened without blocking, so a FIFO
    // or a device is refused at once); DST_ERR_FORMAT when it is malformed.
    dst_status open(const char *fn, const char *path);
    const Header &header() const { return header_; }
    const std::string &path() const { return path_; }

    // Reads `bytes` bytes at `offset` inside tensor `e` (offset + bytes <= e.bytes(), checked).
    dst_status read(const char *fn, const Entry &e, uint64_t offset, uint64_t bytes, void *dst) const;

private:
    int fd_ = -1;
    uint64_t file_size_ = 0;
    std::string path_;
    Header header_;
};

// One tensor to write: its bytes are the concatenation of `pieces`, each either host memory or a
// byte range of a tensor in an open Reader (so that conversions stream without loading the file).
struct Piece {
    const void *mem = nullptr;  // host memory, or nullptr when `src` is used
    const Reader *src = nullptr;
    const Entry *entry = nullptr;  // tensor of `src`
    uint64_t offset = 0;           // inside that tensor
    uint64_t bytes = 0;
};

struct OutTensor {
    std::string name;
    std::string dtype;  // safetensors dtype string
    std::vector<int64_t> shape;
    std::vector<Piece> pieces;  // total bytes must equal numel * element size
};

// Writes a safetensors file atomically: a temporary file "<path>.dst-tmp.XXXXXX" in the same folder is
// created, locked (flock, held until it is renamed or removed), written (every write checked), fsync'ed
// and renamed over `path`. On any failure the temporary file is removed and `path` is left as it was;
// the status is DST_ERR_IO with the system's reason (DST_ERR_INVALID_ARGUMENT for a duplicate name or a
// size mismatch, which are bugs of the caller).
//
// A writer killed before the rename leaves its temporary file. Before writing, a save removes the
// "<path>.dst-tmp.XXXXXX" files of the same `path` that are regular files of this user, unlocked (their
// writer is gone: the lock dies with the process) and last changed at least kStaleTempSeconds ago (so
// that a writer between creating and locking its file is never taken for a dead one).
constexpr int kStaleTempSeconds = 60;
dst_status write_file(const char *fn, const std::string &path, const std::vector<OutTensor> &tensors,
                      const std::map<std::string, std::string> &metadata);

// Writes `text` as the whole content of `path`, atomically and with the same temporary-file rules as
// write_file (the `latest` file of engine checkpoints).
dst_status write_text_file(const char *fn, const std::string &path, const std::string &text);

}  // namespace dst::st

#endif  // DST_CHECKPOINT_SAFETENSORS_H
