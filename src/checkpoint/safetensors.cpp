#include "checkpoint/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

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

constexpr size_t kMaxJsonDepth = 8;

// Builds the JSON value of a header from nlohmann's SAX events, refusing duplicate keys and nesting
// deeper than kMaxJsonDepth as it goes. (nlohmann's parser callback does the same checks, but it scans
// the parent object once per finished child, which is quadratic in the number of tensors.) Objects are
// std::map-backed, so a key is found or inserted in O(log n).
class HeaderBuilder final : public nlohmann::json_sax<nlohmann::json> {
public:
    using json = nlohmann::json;
    json root;
    std::string error;  // set when a callback returned false

    bool null() override { return add(json(nullptr)) != nullptr; }
    bool boolean(bool v) override { return add(json(v)) != nullptr; }
    bool number_integer(number_integer_t v) override { return add(json(v)) != nullptr; }
    bool number_unsigned(number_unsigned_t v) override { return add(json(v)) != nullptr; }
    bool number_float(number_float_t v, const string_t &) override { return add(json(v)) != nullptr; }
    bool string(string_t &v) override { return add(json(std::move(v))) != nullptr; }
    bool binary(binary_t &) override { return fail("binary values are not JSON"); }
    bool start_object(std::size_t) override { return open(json::object()); }
    bool start_array(std::size_t) override { return open(json::array()); }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool key(string_t &k) override {
        if (stack_.back()->contains(k)) return fail("duplicate key \"" + k + "\"");
        key_ = std::move(k);
        return true;
    }
    bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception &e) override {
        error = std::string("not valid JSON: ") + e.what();
        return false;
    }

private:
    std::vector<json *> stack_;  // the open objects and arrays; pointers stay valid while they are open
    std::string key_;

    bool fail(const std::string &why) {
        error = "malformed: " + why;
        return false;
    }
    json *add(json &&v) {
        if (stack_.empty()) {
            root = std::move(v);
            return &root;
        }
        json &parent = *stack_.back();
        if (parent.is_array()) {
            parent.push_back(std::move(v));
            return &parent.back();
        }
        return &(parent[key_] = std::move(v));
    }
    bool open(json &&v) {
        if (stack_.size() >= kMaxJsonDepth) return fail("nesting deeper than " + std::to_string(kMaxJsonDepth));
        stack_.push_back(add(std::move(v)));
        return true;
    }
    bool close() {
        stack_.pop_back();
        return true;
    }
};

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

std::string base_of(const std::string &path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

constexpr char kTempInfix[] = ".dst-tmp.";
constexpr size_t kTempRandom = 6;  // the XXXXXX of mkostemp: [A-Za-z0-9]

// True when `name` is "<base>.dst-tmp.XXXXXX", the temporary-file name of a save of <base>.
bool is_temp_of(const std::string &name, const std::string &base) {
    const std::string head = base + kTempInfix;
    if (name.size() != head.size() + kTempRandom || name.compare(0, head.size(), head) != 0) return false;
    for (size_t i = head.size(); i < name.size(); ++i) {
        const char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
    }
    return true;
}

// Removes the temporary files that killed saves of `path` left behind (see write_file in the header).
// Best effort: a file that cannot be examined or removed is left as it is.
void remove_stale_temps(const std::string &path) {
    const std::string dir = dir_of(path), base = base_of(path);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    DIR *d = ::fdopendir(dfd);
    if (!d) {
        ::close(dfd);
        return;
    }
    std::vector<std::string> names;
    while (const struct dirent *e = ::readdir(d))
        if (is_temp_of(e->d_name, base)) names.push_back(e->d_name);
    const time_t now = ::time(nullptr);
    for (const std::string &n : names) {
        const int fd = ::openat(dfd, n.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
        if (fd < 0) continue;
        struct stat a, b;
        // Unlocked: its writer is gone (the lock is released when the process dies, even by SIGKILL).
        const bool stale = ::fstat(fd, &a) == 0 && S_ISREG(a.st_mode) && a.st_uid == ::geteuid() &&
                           now - a.st_mtime >= kStaleTempSeconds && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
        // Still the same file under that name (not replaced since it was opened).
        if (stale && ::fstatat(dfd, n.c_str(), &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            (void)::unlinkat(dfd, n.c_str(), 0);
        ::close(fd);  // releases the lock
    }
    ::closedir(d);  // closes dfd
}

}  // namespace

bool valid_utf8(const char *s, size_t n, size_t *bad_at) {
    const unsigned char *p = reinterpret_cast<const unsigned char *>(s);
    size_t i = 0;
    while (i < n) {
        const unsigned c = p[i];
        size_t len = 0;
        unsigned lo = 0x80, hi = 0xBF;  // range of the second byte
        if (c < 0x80) len = 1;
        else if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;        // no overlong forms
            else if (c == 0xED) hi = 0x9F;   // no surrogates
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;        // no overlong forms
            else if (c == 0xF4) hi = 0x8F;   // nothing past U+10FFFF
        }
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; ++k) {
            const unsigned b = p[i + k];
            ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        }
        if (!ok) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += len;
    }
    return true;
}

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
    HeaderBuilder builder;
    bool parsed = false;
    try {
        parsed = json::sax_parse(text, text + text_len, &builder);
    } catch (const json::exception &e) {
        builder.error = std::string("not valid JSON: ") + e.what();
    }
    if (!parsed)
        return set_error(DST_ERR_FORMAT, "%s: '%s': the safetensors header is %s", fn, path,
                         builder.error.empty() ? "not valid JSON" : builder.error.c_str());
    const json &root = builder.root;
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
    // O_NONBLOCK: opening a FIFO for reading would wait for a writer. The type is checked on the open
    // descriptor (no race with a rename), and a regular file ignores the flag for its reads anyway.
    int fd;
    do {
        fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return set_error(DST_ERR_IO, "%s: cannot open '%s': %s", fn, path, errno_text(errno).c_str());
    fd_ = fd;
    struct stat sb;
    if (::fstat(fd, &sb) != 0)
        return set_error(DST_ERR_IO, "%s: cannot stat '%s': %s", fn, path, errno_text(errno).c_str());
    if (!S_ISREG(sb.st_mode))
        return set_error(DST_ERR_IO, "%s: '%s' is not a regular file (a %s)", fn, path,
                         S_ISFIFO(sb.st_mode) ? "FIFO" : S_ISDIR(sb.st_mode) ? "directory"
                         : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "device" : S_ISSOCK(sb.st_mode) ? "socket"
                                                                                                       : "special file");
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
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

namespace {

// Writes `path` atomically (see write_file in the header): a locked temporary file in the same folder
// receives the content from `emit`, is flushed and renamed over `path`. `emit` returns 0, an errno value
// of a failed write, or -1 after storing a status (with its message set) in *status.
dst_status write_atomic(const char *fn, const std::string &path,
                        const std::function<int(int fd, dst_status *status)> &emit) {
    const std::string dir = dir_of(path);
    remove_stale_temps(path);
    std::vector<char> tmpl(path.begin(), path.end());
    tmpl.insert(tmpl.end(), kTempInfix, kTempInfix + sizeof kTempInfix - 1);
    tmpl.insert(tmpl.end(), kTempRandom, 'X');
    tmpl.push_back('\0');
    const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0)
        return set_error(DST_ERR_IO, "%s: cannot create a temporary file in '%s' for '%s': %s", fn, dir.c_str(),
                         path.c_str(), errno_text(errno).c_str());
    const std::string tmp(tmpl.data());
    // Held until the file is renamed or removed: a later save sees the writer is alive.
    (void)::flock(fd, LOCK_EX);
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

    dst_status emitted = DST_OK;
    const int err = emit(fd, &emitted);
    if (err < 0) {
        ::close(fd);
        ::unlink(tmp.c_str());
        return emitted;
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

}  // namespace

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

    return write_atomic(fn, path, [&](int fd, dst_status *status) -> int {
        int err = write_full(fd, len8, 8);
        if (!err) err = write_full(fd, json.data(), json.size());
        std::vector<char> buf;
        for (const OutTensor &t : tensors) {
            for (const Piece &p : t.pieces) {
                if (err) return err;
                if (p.mem || p.bytes == 0) {
                    err = write_full(fd, p.mem, static_cast<size_t>(p.bytes));
                    continue;
                }
                const uint64_t chunk = uint64_t(8) << 20;
                buf.resize(static_cast<size_t>(std::min(chunk, p.bytes)));
                for (uint64_t done = 0; done < p.bytes && !err;) {
                    const uint64_t n = std::min(chunk, p.bytes - done);
                    *status = p.src->read(fn, *p.entry, p.offset + done, n, buf.data());
                    if (*status != DST_OK) return -1;
                    err = write_full(fd, buf.data(), static_cast<size_t>(n));
                    done += n;
                }
            }
        }
        return err;
    });
}

dst_status write_text_file(const char *fn, const std::string &path, const std::string &text) {
    return write_atomic(fn, path, [&](int fd, dst_status *) { return write_full(fd, text.data(), text.size()); });
}

}  // namespace dst::st
