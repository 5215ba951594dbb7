/* The sample program that scripts/sample-link.sh links through dtlto-reapi: a few modules that
 * call one another (so ThinLTO imports and inlines across modules), one of them (hash.c) inside a
 * static archive, printing results that are the same on every machine. */
#include <stdio.h>

#include "sample.h"

int main(void) {
    int steps = 0;
    long start = longest_collatz(100000, &steps);
    int firsts[] = {count_primes(10), count_primes(100), count_primes(1000), count_primes(10000)};

    printf("primes below 10, 100, 1000, 10000: %d %d %d %d\n", firsts[0], firsts[1], firsts[2],
           firsts[3]);
    printf("longest Collatz chain below 100000 starts at %ld (%d steps)\n", start, steps);
    printf("checksum(\"dtlto-reapi\") = %08x\n", checksum("dtlto-reapi"));
    printf("checksum of the prime counts = %08x\n", checksum_ints(firsts, 4));
    return 0;
}
