#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/error.h"  // defines: set_error

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader/writer assumes a little-endian host"
#endif

namespace dst::st {

namespace {

struct DtypeInfo {
    const char *name;
    size_t size;
};
// Every dtype of the safetensors specification whose elements are whole bytes.
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},   {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
    {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
};

// Thrown by the JSON parser callback to stop parsing a header that is too deep or has duplicate keys.
struct HeaderReject : std::runtime_error {
    using std::runtime_error::runtime_error;
};

constexpr int kMaxJsonDepth = 8;

// Reads a non-negative integer that fits in int64 from a JSON value.
bool as_count(const nlohmann::json &v, uint64_t *out) {
    if (!v.is_number_unsigned()) return false;  // nlohmann parses every non-negative integer as unsigned
    const uint64_t x = v.get<uint64_t>();
    if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = x;
    return true;
}

std::string errno_text(int err) {
    return std::strerror(err);
}

// pread of exactly `n` bytes; returns 0, or -1 with errno set (EIO-like 0 for an early end of file).
int pread_full(int fd, void *dst, size_t n, uint64_t off, bool *eof) {
    char *p = static_cast<char *>(dst);
    *eof = false;
    while (n > 0) {
        const size_t chunk = std::min<size_t>(n, size_t(1) << 30);
        const ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(off));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) {
            *eof = true;
            return -1;
        }
        p += r;
        n -= static_cast<size_t>(r);
        off += static_cast<uint64_t>(r);
    }
    return 0;
}

// write of exactly `n` bytes; returns 0 or an errno value.
int write_full(int fd, const void *src, size_t n) {
    const char *p = static_cast<const char *>(src);
    while (n > 0) {
        const size_t chunk = std::min<size_t>(n, size_t(1) << 30);
        const ssize_t w = ::write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return ENOSPC;
        p += w;
        n -= static_cast<size_t>(w);
    }
    return 0;
}

// The process umask, read without changing it (umask(2) would race with other threads).
mode_t current_umask() {
    mode_t mask = 022;
    if (FILE *f = std::fopen("/proc/self/status", "re")) {
        char line[256];
        while (std::fgets(line, sizeof line, f)) {
            unsigned m = 0;
            if (std::sscanf(line, "Umask: %o", &m) == 1) {
                mask = static_cast<mode_t>(m & 0777);
                break;
            }
        }
        std::fclose(f);
    }
    return mask;
}

std::string dir_of(const std::string &path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

}  // namespace

size_t dtype_size(const std::string &dtype) {
    for (const DtypeInfo &d : kDtypes)
        if (dtype == d.name) return d.size;
    return 0;
}

const char *dtype_name(dst_dtype dt) {
    switch (dt) {
    case DST_DTYPE_FP32: return "F32";
    case DST_DTYPE_FP16: return "F16";
    case DST_DTYPE_BF16: return "BF16";
    case DST_DTYPE_FP64: return "F64";
    case DST_DTYPE_INT32: return "I32";
    }
    return "?";
}

bool to_dst_dtype(const std::string &dtype, dst_dtype *out) {
    static const struct {
        const char *name;
        dst_dtype dt;
    } map[] = {{"F32", DST_DTYPE_FP32},
               {"F16", DST_DTYPE_FP16},
               {"BF16", DST_DTYPE_BF16},
               {"F64", DST_DTYPE_FP64},
               {"I32", DST_DTYPE_INT32}};
    for (const auto &m : map)
        if (dtype == m.name) {
            *out = m.dt;
            return true;
        }
    return false;
}

const Entry *Header::find(const std::string &name) const {
    const auto it = index.find(name);
    return it == index.end() ? nullptr : &tensors[it->second];
}

dst_status parse_header(const char *fn, const char *path, const char *text, size_t text_len, uint64_t data_size,
                        Header *out) {
    using nlohmann::json;
    json root;
    {
        // Duplicate keys and deep nesting are rejected while parsing: one set of keys per open object.
        std::vector<std::set<std::string>> keys;
        auto cb = [&](int depth, json::parse_event_t ev, json &parsed) -> bool {
            if (depth > kMaxJsonDepth) throw HeaderReject("nesting deeper than " + std::to_string(kMaxJsonDepth));
            switch (ev) {
            case json::parse_event_t::object_start: keys.emplace_back(); break;
            case json::parse_event_t::object_end:
                if (!keys.empty()) keys.pop_back();
                break;
            case json::parse_event_t::key:
                if (!keys.empty() && parsed.is_string() && !keys.back().insert(parsed.get<std::string>()).second)
                    throw HeaderReject("duplicate key \"" + parsed.get<std::string>() + "\"");
                break;
            default: break;
            }
            return true;
        };
        try {
            root = json::parse(text, text + text_len, cb);
        } catch (const HeaderReject &e) {
            return set_error(DST_ERR_FORMAT, "%s: '%s': the safetensors header is malformed: %s", fn, path, e.what());
        } catch (const json::exception &e) {
            return set_error(DST_ERR_FORMAT, "%s: '%s': the safetensors header is not valid JSON: %s", fn, path,
                             e.what());
        }
    }
    if (!root.is_object())
        return set_error(DST_ERR_FORMAT, "%s: '%s': the safetensors header is JSON but not an object", fn, path);

    Header h;
    h.data_size = data_size;
    for (auto it = root.begin(); it != root.end(); ++it) {
        const std::string &name = it.key();
        const json &v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object())
                return set_error(DST_ERR_FORMAT, "%s: '%s': \"__metadata__\" is not a JSON object of strings", fn,
                                 path);
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string())
                    return set_error(DST_ERR_FORMAT, "%s: '%s': \"__metadata__\" entry \"%s\" is not a string", fn,
                                     path, m.key().c_str());
                h.metadata[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        const char *nm = name.c_str();
        if (!v.is_object())
            return set_error(DST_ERR_FORMAT, "%s: '%s': tensor \"%s\": entry is not a JSON object", fn, path, nm);
        Entry e;
        e.name = name;
        const auto dt = v.find("dtype");
        if (dt == v.end() || !dt->is_string())
            return set_error(DST_ERR_FORMAT, "%s: '%s': tensor \"%s\": \"dtype\" is missing or not a string", fn, path,
                             nm);
        e.dtype = dt->get<std::string>();
        e.elem_size = dtype_size(e.dtype);
        if (e.elem_size == 0)
            return set_error(DST_ERR_FORMAT, "%s: '%s': tensor \"%s\": unknown dtype \"%s\"", fn, path, nm,
                             e.dtype.c_str());

        const auto sh = v.find("shape");
        if (sh == v.end() || !sh->is_array())
            return set_error(DST_ERR_FORMAT, "%s: '%s': tensor \"%s\": \"shape\" is missing or not a list", fn, path,
                             nm);
        uint64_t numel = 1;
        for (size_t d = 0; d < sh->size(); ++d) {
            uint64_t x = 0;
            if (!as_count((*sh)[d], &x))
                return set_error(DST_ERR_FORMAT,
                                 "%s: '%s': tensor \"%s\": \"shape\"[%zu] is not a non-negative integer", fn, path, nm,
                                 d);
            e.shape.push_back(static_cast<int64_t>(x));
            if (__builtin_mul_overflow(numel, x, &numel))
                return set_error(DST_ERR_FORMAT, "%s: '%s': tensor \"%s\": the element count of \"shape\" overflows",
                                 fn, path, nm);
        }
        e.numel = numel;
        uint64_t nbytes = 0;
        if (__builtin_mul_overflow(numel, static_cast<uint64_t>(e.elem_size), &nbytes))
            return set_error(DST_ERR_FORMAT, "%s: '%s': tensor \"%s\": the byte size of \"shape\" overflows", fn, path,
                             nm);

        const auto off = v.find("data_offsets");
        if (off == v.end() || !off->is_array() || off->size() != 2 || !as_count((*off)[0], &e.begin) ||
            !as_count((*off)[1], &e.end))
            return set_error(DST_ERR_FORMAT,
                             "%s: '%s': tensor \"%s\": \"data_offsets\" is missing or not [begin, end] of "
                             "non-negative integers",
                             fn, path, nm);
        if (e.begin > e.end)
            return set_error(DST_ERR_FORMAT, "%s: '%s': tensor \"%s\": \"data_offsets\" [%llu, %llu] has begin > end",
                             fn, path, nm, (unsigned long long)e.begin, (unsigned long long)e.end);
        if (e.end > data_size)
            return set_error(DST_ERR_FORMAT,
                             "%s: '%s': tensor \"%s\": \"data_offsets\" end %llu is past the data section (%llu "
                             "bytes; the file is truncated or the offsets are wrong)",
                             fn, path, nm, (unsigned long long)e.end, (unsigned long long)data_size);
        if (e.end - e.begin != nbytes)
            return set_error(DST_ERR_FORMAT,
                             "%s: '%s': tensor \"%s\": \"data_offsets\" span %llu bytes, but dtype %s and shape "
                             "give %llu elements = %llu bytes",
                             fn, path, nm, (unsigned long long)(e.end - e.begin), e.dtype.c_str(),
                             (unsigned long long)numel, (unsigned long long)nbytes);
        h.index[name] = h.tensors.size();
        h.tensors.push_back(std::move(e));
    }

    // No two non-empty byte ranges may overlap.
    std::vector<const Entry *> by_off;
    for (const Entry &e : h.tensors)
        if (e.end > e.begin) by_off.push_back(&e);
    std::sort(by_off.begin(), by_off.end(), [](const Entry *a, const Entry *b) {
        return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    for (size_t i = 1; i < by_off.size(); ++i)
        if (by_off[i]->begin < by_off[i - 1]->end)
            return set_error(DST_ERR_FORMAT, "%s: '%s': tensors \"%s\" and \"%s\" have overlapping data_offsets", fn,
                             path, by_off[i - 1]->name.c_str(), by_off[i]->name.c_str());
    *out = std::move(h);
    return DST_OK;
}

Reader::~Reader() {
    if (fd_ >= 0) ::close(fd_);
}

dst_status Reader::open(const char *fn, const char *path) {
    if (fd_ >= 0) {
        ::close(fd_);
        fd_ = -1;
    }
    path_ = path;
    int fd;
    do {
        fd = ::open(path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return set_error(DST_ERR_IO, "%s: cannot open '%s': %s", fn, path, errno_text(errno).c_str());
    fd_ = fd;
    struct stat sb;
    if (::fstat(fd, &sb) != 0)
        return set_error(DST_ERR_IO, "%s: cannot stat '%s': %s", fn, path, errno_text(errno).c_str());
    if (!S_ISREG(sb.st_mode)) return set_error(DST_ERR_IO, "%s: '%s' is not a regular file", fn, path);
    file_size_ = static_cast<uint64_t>(sb.st_size);
    if (file_size_ < 8)
        return set_error(DST_ERR_FORMAT,
                         "%s: '%s' has %llu bytes, too short for a safetensors file (8-byte header "
                         "length)",
                         fn, path, (unsigned long long)file_size_);
    unsigned char len8[8];
    bool eof = false;
    if (pread_full(fd, len8, 8, 0, &eof) != 0)
        return eof ? set_error(DST_ERR_FORMAT, "%s: '%s' ended while reading the header length", fn, path)
                   : set_error(DST_ERR_IO, "%s: cannot read '%s': %s", fn, path, errno_text(errno).c_str());
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
    if (n > file_size_ - 8)
        return set_error(DST_ERR_FORMAT,
                         "%s: '%s': header length %llu exceeds the %llu bytes after it (truncated "
                         "or not a safetensors file)",
                         fn, path, (unsigned long long)n, (unsigned long long)(file_size_ - 8));
    if (n > kMaxHeaderBytes)
        return set_error(DST_ERR_FORMAT, "%s: '%s': header length %llu is above the limit of %llu bytes", fn, path,
                         (unsigned long long)n, (unsigned long long)kMaxHeaderBytes);
    if (n < 2)
        return set_error(DST_ERR_FORMAT, "%s: '%s': header length %llu is too small for a JSON object", fn, path,
                         (unsigned long long)n);
    std::string json(static_cast<size_t>(n), '\0');
    if (pread_full(fd, json.data(), json.size(), 8, &eof) != 0)
        return eof ? set_error(DST_ERR_FORMAT, "%s: '%s' ended inside the header", fn, path)
                   : set_error(DST_ERR_IO, "%s: cannot read '%s': %s", fn, path, errno_text(errno).c_str());
    if (json[0] != '{')
        return set_error(DST_ERR_FORMAT, "%s: '%s': the header does not start with '{' (not a safetensors file)", fn,
                         path);
    header_ = Header{};
    DST_TRY(parse_header(fn, path, json.data(), json.size(), file_size_ - 8 - n, &header_));
    header_.data_start = 8 + n;
    return DST_OK;
}

dst_status Reader::read(const char *fn, const Entry &e, uint64_t offset, uint64_t bytes, void *dst) const {
    if (fd_ < 0) return set_error(DST_ERR_INTERNAL, "%s: reading from a safetensors file that is not open", fn);
    if (offset > e.bytes() || bytes > e.bytes() - offset)
        return set_error(DST_ERR_INTERNAL, "%s: read of %llu bytes at %llu is outside tensor \"%s\"", fn,
                         (unsigned long long)bytes, (unsigned long long)offset, e.name.c_str());
    if (bytes == 0) return DST_OK;
    bool eof = false;
    if (pread_full(fd_, dst, static_cast<size_t>(bytes), header_.data_start + e.begin + offset, &eof) != 0)
        return eof ? set_error(DST_ERR_FORMAT,
                               "%s: '%s' ended inside tensor \"%s\" (the file changed while it was "
                               "read)",
                               fn, path_.c_str(), e.name.c_str())
                   : set_error(DST_ERR_IO, "%s: cannot read tensor \"%s\" from '%s': %s", fn, e.name.c_str(),
                               path_.c_str(), errno_text(errno).c_str());
    return DST_OK;
}

dst_status write_file(const char *fn, const std::string &path, const std::vector<OutTensor> &tensors,
                      const std::map<std::string, std::string> &metadata) {
    // Header: "__metadata__" first, then the tensors in the given order, packed back to back.
    nlohmann::ordered_json hdr = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
        nlohmann::ordered_json m = nlohmann::ordered_json::object();
        for (const auto &kv : metadata) m[kv.first] = kv.second;
        hdr["__metadata__"] = std::move(m);
    }
    uint64_t off = 0;
    std::set<std::string> names;
    for (const OutTensor &t : tensors) {
        if (t.name == "__metadata__" || !names.insert(t.name).second)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor name \"%s\" is used twice or reserved", fn,
                             t.name.c_str());
        const size_t es = dtype_size(t.dtype);
        if (es == 0)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor \"%s\": unknown dtype \"%s\"", fn, t.name.c_str(),
                             t.dtype.c_str());
        uint64_t numel = 1;
        for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
        uint64_t have = 0;
        for (const Piece &p : t.pieces) {
            if (!p.mem && p.bytes > 0 && (!p.src || !p.entry))
                return set_error(DST_ERR_INTERNAL, "%s: tensor \"%s\" has a piece without data", fn, t.name.c_str());
            have += p.bytes;
        }
        if (have != numel * es)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor \"%s\" has %llu bytes of data, its shape needs %llu",
                             fn, t.name.c_str(), (unsigned long long)have, (unsigned long long)(numel * es));
        hdr[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + have}}};
        off += have;
    }
    std::string json = hdr.dump();
    json.append((8 - json.size() % 8) % 8, ' ');
    unsigned char len8[8];
    for (int i = 0; i < 8; ++i) len8[i] = static_cast<unsigned char>((uint64_t(json.size()) >> (8 * i)) & 0xff);

    const std::string dir = dir_of(path);
    std::vector<char> tmpl(path.begin(), path.end());
    const char suffix[] = ".tmp.XXXXXX";
    tmpl.insert(tmpl.end(), suffix, suffix + sizeof suffix);  // includes the NUL
    const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0)
        return set_error(DST_ERR_IO, "%s: cannot create a temporary file in '%s' for '%s': %s", fn, dir.c_str(),
                         path.c_str(), errno_text(errno).c_str());
    const std::string tmp(tmpl.data());
    auto fail = [&](int err, const char *what) {
        ::close(fd);
        ::unlink(tmp.c_str());
        return set_error(DST_ERR_IO, "%s: cannot %s '%s' (writing '%s'): %s", fn, what, tmp.c_str(), path.c_str(),
                         errno_text(err).c_str());
    };
    // mkstemp makes the file 0600; give it the mode of the file it replaces, or 0666 less the umask.
    struct stat sb;
    const mode_t mode = ::stat(path.c_str(), &sb) == 0 ? (sb.st_mode & 07777) : (0666 & ~current_umask());
    if (::fchmod(fd, mode) != 0) return fail(errno, "set the mode of");

    int err = write_full(fd, len8, 8);
    if (!err) err = write_full(fd, json.data(), json.size());
    std::vector<char> buf;
    for (const OutTensor &t : tensors) {
        for (const Piece &p : t.pieces) {
            if (err) break;
            if (p.mem || p.bytes == 0) {
                err = write_full(fd, p.mem, static_cast<size_t>(p.bytes));
                continue;
            }
            const uint64_t chunk = uint64_t(8) << 20;
            buf.resize(static_cast<size_t>(std::min(chunk, p.bytes)));
            for (uint64_t done = 0; done < p.bytes && !err;) {
                const uint64_t n = std::min(chunk, p.bytes - done);
                const dst_status s = p.src->read(fn, *p.entry, p.offset + done, n, buf.data());
                if (s != DST_OK) {
                    ::close(fd);
                    ::unlink(tmp.c_str());
                    return s;
                }
                err = write_full(fd, buf.data(), static_cast<size_t>(n));
                done += n;
            }
        }
        if (err) break;
    }
    if (err) return fail(err, "write");
    if (::fsync(fd) != 0) return fail(errno, "flush (fsync)");
    if (::close(fd) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return set_error(DST_ERR_IO, "%s: cannot close '%s' (writing '%s'): %s", fn, tmp.c_str(), path.c_str(),
                         errno_text(e).c_str());
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return set_error(DST_ERR_IO, "%s: cannot rename '%s' to '%s': %s", fn, tmp.c_str(), path.c_str(),
                         errno_text(e).c_str());
    }
    // Make the rename itself durable; the new file is complete either way, so a failure here is ignored.
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)::fsync(dfd);
        ::close(dfd);
    }
    return DST_OK;
}

}  // namespace dst::st
