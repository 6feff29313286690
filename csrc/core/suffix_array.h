// Suffix-array construction by induced sorting (SA-IS, Nong-Zhang-Chan) for integer alphabets.
//
// Suffixes compare as if the text were followed by a unique symbol smaller than every symbol (a virtual
// sentinel), so a suffix that is a proper prefix of another sorts first. Runs in O(n + alphabet) time.
// Working memory beyond the output array: one bit per symbol, one bucket array of `alphabet` entries, and
// the same for the reduced problem (at most n/2 symbols), whose text lives inside the output array.
#pragma once
#include <cstdint>

namespace sssd {

// sa must have room for n entries; every symbol of text must be < alphabet.
void build_suffix_array(const uint16_t* text, int32_t* sa, int64_t n, int64_t alphabet);
void build_suffix_array(const uint32_t* text, int32_t* sa, int64_t n, int64_t alphabet);
void build_suffix_array(const uint16_t* text, int64_t* sa, int64_t n, int64_t alphabet);
void build_suffix_array(const uint32_t* text, int64_t* sa, int64_t n, int64_t alphabet);

}  // namespace sssd
