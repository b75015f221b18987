#include "checkpoint/verified.h"

#include <algorithm>

#include "checkpoint/checksum.h"  // defines: Checksum
#include "core/error.h"           // defines: set_error, DST_TRY

namespace dst::st {

namespace {
constexpr char kFormatKey[] = "format";
constexpr char kChecksumKey[] = "checksum";

std::string shape_text(const std::vector<int64_t> &s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}
}  // namespace

dst_status write_verified(const char *fn, const std::string &path, const char *format,
                          const std::vector<OutTensor> &tensors, std::map<std::string, std::string> metadata) {
    Checksum sum;
    for (const OutTensor &t : tensors)
        for (const Piece &p : t.pieces) {
            if (!p.mem && p.bytes > 0)
                return set_error(DST_ERR_INTERNAL, "%s: tensor \"%s\" is not in host memory", fn, t.name.c_str());
            sum.update(p.mem, static_cast<size_t>(p.bytes));
        }
    metadata[kFormatKey] = format;
    metadata[kChecksumKey] = Checksum::hex(sum.value());
    return write_file(fn, path, tensors, metadata);
}

dst_status read_verified(const char *fn, const std::string &path, const char *format, VerifiedFile *out) {
    Reader rd;
    DST_TRY(rd.open(fn, path.c_str()));
    const Header &h = rd.header();
    const auto f = h.metadata.find(kFormatKey);
    if (f == h.metadata.end() || f->second != format)
        return set_error(DST_ERR_FORMAT, "%s: '%s' is not a %s file (its __metadata__ \"format\" is %s)", fn,
                         path.c_str(), format, f == h.metadata.end() ? "missing" : ("\"" + f->second + "\"").c_str());
    const auto c = h.metadata.find(kChecksumKey);
    if (c == h.metadata.end())
        return set_error(DST_ERR_FORMAT, "%s: '%s' has no __metadata__ \"checksum\"", fn, path.c_str());
    // The writer packs tensors back to back in its order: reading them by offset hashes the data section.
    std::vector<const Entry *> order;
    for (const Entry &e : h.tensors) order.push_back(&e);
    std::sort(order.begin(), order.end(), [](const Entry *a, const Entry *b) { return a->begin < b->begin; });
    VerifiedFile v;
    Checksum sum;
    uint64_t expect_begin = 0;
    for (const Entry *e : order) {
        if (e->begin != expect_begin)
            return set_error(DST_ERR_FORMAT, "%s: '%s': the data section has a gap before tensor \"%s\"", fn,
                             path.c_str(), e->name.c_str());
        std::vector<char> &buf = v.data[e->name];
        buf.resize(static_cast<size_t>(e->bytes()));
        DST_TRY(rd.read(fn, *e, 0, e->bytes(), buf.data()));
        sum.update(buf.data(), buf.size());
        expect_begin = e->end;
    }
    if (expect_begin != h.data_size)
        return set_error(DST_ERR_FORMAT, "%s: '%s': %llu bytes after the last tensor", fn, path.c_str(),
                         (unsigned long long)(h.data_size - expect_begin));
    const std::string got = Checksum::hex(sum.value());
    if (got != c->second)
        return set_error(DST_ERR_FORMAT,
                         "%s: '%s' is corrupt: the checksum of its data is %s, its metadata says %s", fn, path.c_str(),
                         got.c_str(), c->second.c_str());
    v.header = h;
    v.path = path;
    *out = std::move(v);
    return DST_OK;
}

dst_status VerifiedFile::tensor(const char *fn, const std::string &name, const char *dtype,
                                const std::vector<int64_t> &shape, const std::vector<char> **out) const {
    const Entry *e = header.find(name);
    if (!e) return set_error(DST_ERR_FORMAT, "%s: tensor \"%s\" is missing from '%s'", fn, name.c_str(), path.c_str());
    if (e->dtype != dtype || e->shape != shape)
        return set_error(DST_ERR_FORMAT, "%s: tensor \"%s\" in '%s' is %s %s, expected %s %s", fn, name.c_str(),
                         path.c_str(), e->dtype.c_str(), shape_text(e->shape).c_str(), dtype,
                         shape_text(shape).c_str());
    *out = &data.at(name);
    return DST_OK;
}

}  // namespace dst::st
