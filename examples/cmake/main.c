#include "geometry.h"
#include "text.h"

int main(void) {
    for (long side = 1; side <= 3; side++) {
        print_measure("area", side, square_area(side));
        print_measure("perimeter", side, square_perimeter(side));
    }
    return 0;
}
