// Copying a library string into a caller's buffer, as every call with a (buffer, size, length)
// triple does: NUL-terminated and truncated to fit, the full length reported.
#ifndef DST_CORE_TEXT_H
#define DST_CORE_TEXT_H

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

namespace dst {

// Copies `text` into buf[size] (NUL-terminated, truncated to fit; nothing when buf is NULL or size 0)
// and its full length into *len (when len is not NULL).
inline void copy_text(const std::string &text, char *buf, size_t size, size_t *len) {
    if (buf && size > 0) {
        const size_t n = std::min(text.size(), size - 1);
        if (n) std::memcpy(buf, text.data(), n);
        buf[n] = '\0';
    }
    if (len) *len = text.size();
}

}  // namespace dst

#endif  // DST_CORE_TEXT_H
