/* One FNV-1a step; scripts/sample-link.sh puts this module in the static archive libsample.a. */
#include "sample.h"

unsigned hash_step(unsigned hash, unsigned value) {
    return (hash ^ value) * 16777619u;
}
