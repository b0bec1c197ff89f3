// Distinct keys of a batch without sorting them, and the range a batch spans.
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

// The smallest and largest of keys[0..n) (n >= 1), over the cores for a large
// batch: the SDK checks a dense table's ids against its rows with these before
// any call, and torch.aminmax's OpenMP pass costs several times a pull's
// gather on a busy machine (it waits for every thread it started).
void key_bounds(int64_t n, const int64_t* keys, int64_t* smallest, int64_t* largest);

}  // namespace recstore
