// A 64-bit checksum of a byte stream, for the training-state files: written into their metadata and
// checked when they are read, so a truncated, flipped or mixed-up data section is reported instead of
// loaded. Not cryptographic: it detects accidents, not tampering. Every step is a bijection of the
// running value for a fixed input word, so changing any single 8-byte word always changes the result.
// The bytes are taken as little-endian words, so the value does not depend on the host.
#ifndef DST_CHECKPOINT_CHECKSUM_H
#define DST_CHECKPOINT_CHECKSUM_H

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace dst::st {

class Checksum {
public:
    void update(const void *data, size_t n) {
        const unsigned char *p = static_cast<const unsigned char *>(data);
        total_ += n;
        while (n > 0 && tail_n_ > 0) {
            tail_[tail_n_++] = *p++;
            --n;
            if (tail_n_ == 8) {
                word(load(tail_));
                tail_n_ = 0;
            }
        }
        for (; n >= 8; p += 8, n -= 8) word(load(p));
        for (; n > 0; --n) tail_[tail_n_++] = *p++;
    }

    uint64_t value() const {
        uint64_t h = h_;
        if (tail_n_ > 0) {
            unsigned char last[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            std::memcpy(last, tail_, tail_n_);
            h = mix(h, load(last));
        }
        h = mix(h, total_);
        h ^= h >> 30;  // splitmix64's finalizer
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 27;
        h *= 0x94D049BB133111EBull;
        return h ^ (h >> 31);
    }

    static std::string hex(uint64_t v) {
        char buf[17];
        std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
        return buf;
    }

private:
    static uint64_t load(const unsigned char *p) {
        uint64_t w = 0;
        for (int i = 7; i >= 0; --i) w = (w << 8) | p[i];
        return w;
    }
    static uint64_t mix(uint64_t h, uint64_t w) {
        h ^= w;
        h *= 0x100000001B3ull;  // FNV-1a's 64-bit prime (odd: a bijection)
        return h ^ (h >> 31);
    }
    void word(uint64_t w) { h_ = mix(h_, w); }

    uint64_t h_ = 0xCBF29CE484222325ull;
    uint64_t total_ = 0;
    unsigned char tail_[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t tail_n_ = 0;
};

}  // namespace dst::st

#endif  // DST_CHECKPOINT_CHECKSUM_H
