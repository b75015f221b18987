// Host-side binary16 and bfloat16 storage types with round-to-nearest-even conversion.
// Used by the CPU backend (fp16/bf16 layers store in these and compute in fp32) and by the
// host copy-in/copy-out helpers. Bit-exact: no compiler extensions, NaN stays NaN.
#ifndef DST_CORE_HALF_H
#define DST_CORE_HALF_H

#include <cstdint>
#include <cstring>

namespace dst {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// float -> binary16, round to nearest even; overflow to ±inf; NaN kept quiet.
inline uint16_t float_to_half_bits(float f) {
    const uint32_t x = float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t absx = x & 0x7FFFFFFFu;
    if (absx >= 0x7F800000u) {                       // inf or NaN
        return static_cast<uint16_t>(sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u : 0u));
    }
    if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
    if (absx < 0x38800000u) {                        // result is subnormal or zero (|f| < 2^-14)
        if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
        const uint32_t exp = absx >> 23;
        const uint32_t mant = (absx & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 126u - exp;           // value = mant * 2^(exp-150); half ulp = 2^-24
        uint32_t r = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return static_cast<uint16_t>(sign | r);
    }
    uint32_t r = ((absx - 0x38000000u) >> 13);       // rebias exponent 127 -> 15
    const uint32_t rem = absx & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
}

inline float half_bits_to_float(uint16_t h) {
    const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    if (exp == 0) {
        if (mant == 0) return bits_float(sign);
        // subnormal: mant * 2^-24
        float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_float(sign | 0x7F800000u | (mant << 13));
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// float -> bfloat16, round to nearest even; NaN kept quiet.
inline uint16_t float_to_bf16_bits(float f) {
    const uint32_t x = float_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    const uint32_t lsb = (x >> 16) & 1u;
    return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);
}

inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Storage types. Arithmetic happens in float after an explicit conversion.
struct half_t {
    uint16_t bits;
    half_t() = default;
    explicit half_t(float f) : bits(float_to_half_bits(f)) {}
    explicit operator float() const { return half_bits_to_float(bits); }
};
struct bf16_t {
    uint16_t bits;
    bf16_t() = default;
    explicit bf16_t(float f) : bits(float_to_bf16_bits(f)) {}
    explicit operator float() const { return bf16_bits_to_float(bits); }
};
static_assert(sizeof(half_t) == 2 && sizeof(bf16_t) == 2, "16-bit storage types");

}  // namespace dst

#endif  // DST_CORE_HALF_H
