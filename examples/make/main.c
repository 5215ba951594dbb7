#include "stats.h"

int main(void) {
    const long primes[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29};
    report("sum of the first ten primes", sum(primes, 10));
    report("their mean, rounded down", mean(primes, 10));
    return 0;
}
