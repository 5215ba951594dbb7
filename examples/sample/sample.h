/* Declarations shared by the sample program's modules (see main.c). */
#ifndef SAMPLE_H
#define SAMPLE_H

/* hash.c (archived into libsample.a) */
unsigned hash_step(unsigned hash, unsigned value);

/* primes.c */
int count_primes(int limit);

/* collatz.c */
int collatz_steps(long n);
long longest_collatz(long limit, int *steps);

/* checksum.c */
unsigned checksum(const char *text);
unsigned checksum_ints(const int *values, int count);

#endif
