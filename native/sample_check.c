/* dataload's per-batch check: every sample of a batch against the bytes its index defines
 * (microbench/probes/dataload/dataset.py), in one call per batch. In Python the check cost
 * about 1.4 us a sample, about 4 % of a tar-shard sample's whole read on the 2-core VM, which
 * the probe would have added to what it reports; here it is one memcmp a sample. */
#include <stdint.h>
#include <string.h>

#include "mb_common.h"

/* Sample `index`'s size: low when the size is fixed, else dataset.sample_size's hash. */
static uint64_t sample_size(uint64_t index, uint64_t low, uint64_t high) {
  if (low == high) return low;
  unsigned __int128 product = (unsigned __int128)index * 2654435761u;
  return low + (uint64_t)(product % (high - low + 1));
}

int mb_sample_wrong(int64_t index, const unsigned char *data, size_t size, uint64_t low, uint64_t high,
                    const unsigned char *base, size_t base_len, uint64_t span, uint64_t stride) {
  if (index < 0) return 1;
  uint64_t want = sample_size((uint64_t)index, low, high);
  if (size != want) return 1;
  size_t head = size < 8 ? size : 8;
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)(((uint64_t)index >> (8 * i)) & 0xff);
  if (memcmp(data, le, head) != 0) return 1;
  uint64_t start = (uint64_t)(((unsigned __int128)(uint64_t)index * stride) % span) + head;
  if (start + (size - head) > base_len) return 1;
  return memcmp(data + head, base + start, size - head) != 0;
}

/* A member name's index: the digits after the last '/' up to the first '.', or -1. */
int64_t mb_member_index(const char *name, size_t len) {
  const char *p = name + len;
  while (p > name && p[-1] != '/') p--;
  const char *end = name + len;
  int64_t value = 0;
  int digits = 0;
  for (; p < end && *p != '.'; p++) {
    if (*p < '0' || *p > '9' || digits >= 18) return -1;
    value = value * 10 + (*p - '0');
    digits++;
  }
  return digits ? value : -1;
}
