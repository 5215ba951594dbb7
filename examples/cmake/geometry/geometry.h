#ifndef GEOMETRY_H
#define GEOMETRY_H
long rectangle_area(long width, long height);
long square_area(long side);
long rectangle_perimeter(long width, long height);
long square_perimeter(long side);
#endif
