#include "geometry.h"

long rectangle_perimeter(long width, long height) { return 2 * (width + height); }
long square_perimeter(long side) { return rectangle_perimeter(side, side); }
