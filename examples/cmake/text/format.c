#include <stdio.h>
#include "text.h"

static const char *unit(const char *what) { return what[0] == 'a' ? "square units" : "units"; }

void print_measure(const char *what, long side, long value) {
    printf("%s of a square of side %ld: %ld %s\n", what, side, value, unit(what));
}
