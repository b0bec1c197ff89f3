// Distinct keys of a batch without sorting them.
//
// Every training step deduplicates its ids before asking for rows; a sort
// (torch.unique) costs more than the whole hash pass, and nothing downstream
// needs the keys in order. Distinct keys come out in first-occurrence order,
// with each input key's position among them (the inverse).
#pragma once

#include <cstdint>

namespace recstore {

// Writes the distinct keys of keys[0..n) to unique_out (first occurrence
// first) and, for every i, inverse_out[i] = position of keys[i] in unique_out;
// returns how many distinct keys there are. Both outputs hold n entries.
int64_t unique_keys(int64_t n, const int64_t* keys, int64_t* unique_out, int64_t* inverse_out);

}  // namespace recstore
