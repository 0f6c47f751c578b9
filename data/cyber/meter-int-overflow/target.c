/* An energy meter: reads "<kwh>" as a decimal int and prints the total in Wh. */
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>

static long long to_wh(int kwh) {
#ifdef FIXED
    return (long long)kwh * 1000;
#else
    int wh = kwh * 1000;
    return wh;
#endif
}

int main(int argc, char **argv) {
    char text[64] = {0};
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    fread(text, 1, sizeof text - 1, f);
    fclose(f);
    long v = strtol(text, NULL, 10);
    if (v < 0 || v > INT_MAX) return 1;
    printf("%lld\n", to_wh((int)v));
    return 0;
}
