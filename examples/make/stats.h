#ifndef STATS_H
#define STATS_H
long sum(const long *values, int n);
long mean(const long *values, int n);
void report(const char *name, long value);
#endif
