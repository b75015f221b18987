#include "train/checkpoint_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "checkpoint/safetensors.h"  // defines: st::valid_utf8
#include "core/error.h"              // defines: set_error

namespace dst::ckdir {

namespace {

std::string err_text(int e) { return std::strerror(e); }

std::string parent_of(const std::string &path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

void fsync_dir(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)::fsync(fd);
        ::close(fd);
    }
}

std::vector<std::string> entries(const std::string &dir) {
    std::vector<std::string> out;
    if (DIR *d = ::opendir(dir.c_str())) {
        while (const struct dirent *e = ::readdir(d))
            if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.push_back(e->d_name);
        ::closedir(d);
    }
    return out;
}

// After an exchange: `old` holds the previous tag folder, `final` the new one.
void retire(const std::string &old, const std::string &final, const std::vector<std::string> &ours) {
    for (const std::string &n : entries(old)) {
        const std::string from = old + "/" + n;
        const bool mine = std::find(ours.begin(), ours.end(), n) != ours.end() ||
                          n.find(".dst-tmp.") != std::string::npos;
        struct stat sb;
        if (!mine && ::lstat((final + "/" + n).c_str(), &sb) != 0) (void)::rename(from.c_str(), (final + "/" + n).c_str());
        else if (mine) (void)::unlink(from.c_str());
    }
    (void)::rmdir(old.c_str());
}

}  // namespace

bool is_dir(const std::string &path) {
    struct stat sb;
    return ::stat(path.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

dst_status check_tag(const char *fn, const char *arg, const std::string &tag) {
    size_t bad = 0;
    if (tag.empty()) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is empty", fn, arg);
    if (tag.size() > 255)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s has %zu bytes, at most 255 (one folder name)", fn, arg,
                         tag.size());
    if (!st::valid_utf8(tag.data(), tag.size(), &bad))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is not valid UTF-8 (byte %zu)", fn, arg, bad);
    if (tag[0] == '.')
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s \"%s\" starts with '.' (reserved for temporary folders)",
                         fn, arg, tag.c_str());
    for (unsigned char c : tag)
        if (c == '/' || c < 0x20 || c == 0x7f)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: %s \"%s\" contains '/' or a control character; a tag is one folder name", fn, arg,
                             tag.c_str());
    return DST_OK;
}

dst_status make_dirs(const char *fn, const std::string &path) {
    if (is_dir(path)) return DST_OK;
    std::string part;
    size_t pos = 0;
    while (pos != std::string::npos) {
        pos = path.find('/', pos + 1);
        part = path.substr(0, pos);
        if (part.empty() || is_dir(part)) continue;
        if (::mkdir(part.c_str(), 0777) != 0 && errno != EEXIST)
            return set_error(DST_ERR_IO, "%s: cannot create the folder '%s': %s", fn, part.c_str(), err_text(errno).c_str());
        if (!is_dir(part))
            return set_error(DST_ERR_IO, "%s: '%s' exists and is not a folder", fn, part.c_str());
    }
    return DST_OK;
}

dst_status make_temp_dir(const char *fn, const std::string &parent, const std::string &tag, std::string *out) {
    std::string t = parent + "/." + tag + ".dst-tmp.XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data()))
        return set_error(DST_ERR_IO, "%s: cannot create a temporary folder in '%s': %s", fn, parent.c_str(),
                         err_text(errno).c_str());
    *out = buf.data();
    return DST_OK;
}

void remove_dir(const std::string &path) {
    for (const std::string &n : entries(path)) (void)::unlink((path + "/" + n).c_str());
    (void)::rmdir(path.c_str());
}

dst_status publish(const char *fn, const std::string &tmp, const std::string &final,
                   const std::vector<std::string> &ours) {
    fsync_dir(tmp);
    struct stat sb;
    const std::string parent = parent_of(final);
    if (::lstat(final.c_str(), &sb) != 0) {
        if (errno != ENOENT)
            return set_error(DST_ERR_IO, "%s: cannot examine '%s': %s", fn, final.c_str(), err_text(errno).c_str());
        if (::rename(tmp.c_str(), final.c_str()) != 0)
            return set_error(DST_ERR_IO, "%s: cannot rename '%s' to '%s': %s", fn, tmp.c_str(), final.c_str(),
                             err_text(errno).c_str());
        fsync_dir(parent);
        return DST_OK;
    }
    if (!S_ISDIR(sb.st_mode))
        return set_error(DST_ERR_IO, "%s: '%s' exists and is not a folder", fn, final.c_str());
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) == 0) {
        fsync_dir(parent);
        retire(tmp, final, ours);  // tmp now names the previous folder
        return DST_OK;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EXDEV)
        return set_error(DST_ERR_IO, "%s: cannot exchange '%s' with '%s': %s", fn, tmp.c_str(), final.c_str(),
                         err_text(errno).c_str());
    // No atomic exchange here: move the old folder aside (over an empty placeholder), then the new one in.
    std::string old;
    const size_t slash = final.find_last_of('/');
    const std::string tag = slash == std::string::npos ? final : final.substr(slash + 1);
    DST_TRY(make_temp_dir(fn, parent, tag + ".old", &old));
    if (::rename(final.c_str(), old.c_str()) != 0) {
        const int e = errno;
        (void)::rmdir(old.c_str());
        return set_error(DST_ERR_IO, "%s: cannot move '%s' aside: %s", fn, final.c_str(), err_text(e).c_str());
    }
    if (::rename(tmp.c_str(), final.c_str()) != 0) {
        const int e = errno;
        (void)::rename(old.c_str(), final.c_str());
        return set_error(DST_ERR_IO, "%s: cannot rename '%s' to '%s': %s", fn, tmp.c_str(), final.c_str(),
                         err_text(e).c_str());
    }
    fsync_dir(parent);
    retire(old, final, ours);
    return DST_OK;
}

dst_status read_latest(const char *fn, const std::string &dir, std::string *tag) {
    const std::string path = dir + "/latest";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return set_error(DST_ERR_IO, "%s: cannot open '%s': %s (no checkpoint was saved with save_latest there?)", fn,
                         path.c_str(), err_text(errno).c_str());
    struct stat sb;
    if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ::close(fd);
        return set_error(DST_ERR_IO, "%s: '%s' is not a regular file", fn, path.c_str());
    }
    char buf[512];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    if (n < 0) return set_error(DST_ERR_IO, "%s: cannot read '%s': %s", fn, path.c_str(), err_text(errno).c_str());
    if (static_cast<size_t>(n) == sizeof buf)
        return set_error(DST_ERR_FORMAT, "%s: '%s' is longer than a tag can be", fn, path.c_str());
    std::string t(buf, static_cast<size_t>(n));
    const size_t b = t.find_first_not_of(" \t\r\n"), e = t.find_last_not_of(" \t\r\n");
    t = b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
    const dst_status s = check_tag(fn, "the tag in 'latest'", t);
    if (s != DST_OK) {
        const std::string why = dst::last_error();
        return set_error(DST_ERR_FORMAT, "%s (file '%s')", why.c_str(), path.c_str());
    }
    *tag = t;
    return DST_OK;
}

}  // namespace dst::ckdir
