/* Checksums built on hash_step, which lives in the static archive. */
#include "sample.h"

unsigned checksum(const char *text) {
    unsigned hash = 2166136261u;
    for (; *text; text++)
        hash = hash_step(hash, (unsigned char)*text);
    return hash;
}

unsigned checksum_ints(const int *values, int count) {
    unsigned hash = 2166136261u;
    for (int i = 0; i < count; i++)
        hash = hash_step(hash, (unsigned)values[i]);
    return hash;
}
