#include <stdio.h>
#include "stats.h"

void report(const char *name, long value) { printf("%s: %ld\n", name, value); }
