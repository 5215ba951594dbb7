/* Collatz chain lengths; longest_collatz calls collatz_steps, which ThinLTO may inline. */
#include "sample.h"

int collatz_steps(long n) {
    int steps = 0;
    while (n != 1) {
        n = (n % 2) ? 3 * n + 1 : n / 2;
        steps++;
    }
    return steps;
}

long longest_collatz(long limit, int *steps) {
    long best = 1;
    *steps = 0;
    for (long n = 1; n < limit; n++) {
        int s = collatz_steps(n);
        if (s > *steps) {
            *steps = s;
            best = n;
        }
    }
    return best;
}
