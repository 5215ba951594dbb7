#include "stats.h"

long sum(const long *values, int n) {
    long total = 0;
    for (int i = 0; i < n; i++)
        total += values[i];
    return total;
}
