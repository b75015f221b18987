// safetensors files with a checksum of their data section in the metadata ("checksum", 16 hex digits,
// checkpoint/checksum.h) and a "format" tag: what the training-state files (optimizer files, engine
// checkpoints) are written as, and read back only after every byte was checked.
#ifndef DST_CHECKPOINT_VERIFIED_H
#define DST_CHECKPOINT_VERIFIED_H

#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"  // defines: OutTensor, Header, Entry

namespace dst::st {

// Writes `tensors` (host-memory pieces only) atomically as write_file does, with metadata["format"] =
// format and metadata["checksum"] added.
dst_status write_verified(const char *fn, const std::string &path, const char *format,
                          const std::vector<OutTensor> &tensors, std::map<std::string, std::string> metadata);

// A file read whole: its validated header and the bytes of every tensor.
struct VerifiedFile {
    Header header;
    std::map<std::string, std::vector<char>> data;
    // The tensor `name` with dtype `dtype` and `shape`, or a DST_ERR_FORMAT naming what differs.
    dst_status tensor(const char *fn, const std::string &name, const char *dtype, const std::vector<int64_t> &shape,
                      const std::vector<char> **out) const;
    std::string path;
};

// Opens `path`, checks its format tag, reads every tensor and checks the checksum. DST_ERR_IO when it
// cannot be read, DST_ERR_FORMAT for another format, a missing or wrong checksum, or a malformed file.
dst_status read_verified(const char *fn, const std::string &path, const char *format, VerifiedFile *out);

}  // namespace dst::st

#endif  // DST_CHECKPOINT_VERIFIED_H
