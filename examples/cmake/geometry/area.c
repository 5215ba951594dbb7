#include "geometry.h"

long rectangle_area(long width, long height) { return width * height; }
long square_area(long side) { return rectangle_area(side, side); }
