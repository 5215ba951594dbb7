/* Counts primes with a sieve of Eratosthenes. */
#include <string.h>

#include "sample.h"

#define MAX_LIMIT 100000

int count_primes(int limit) {
    static unsigned char composite[MAX_LIMIT];
    int count = 0;

    if (limit > MAX_LIMIT)
        limit = MAX_LIMIT;
    memset(composite, 0, sizeof composite);
    for (int i = 2; i < limit; i++) {
        if (composite[i])
            continue;
        count++;
        for (long j = (long)i * i; j < limit; j += i)
            composite[j] = 1;
    }
    return count;
}
