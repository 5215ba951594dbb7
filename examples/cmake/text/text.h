#ifndef TEXT_H
#define TEXT_H
void print_measure(const char *what, long side, long value);
#endif
