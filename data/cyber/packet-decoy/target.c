/* A packet tool: [type:u8][modulus:u8][count:u8][values...]. type 'D' decodes, type 'S' checksums. */
#include <stdio.h>
#include <stdlib.h>

int checksum(const unsigned char *data, int n, int modulus);

static int decode_payload(const unsigned char *data, int count) {
    int *values = malloc(4 * sizeof(int));
#ifdef FIXED
    if (count > 4) count = 4;
#endif
    int sum = 0;
    for (int i = 0; i < count; i++) {
        values[i] = data[i];
        sum += values[i];
    }
    free(values);
    return sum;
}

int main(int argc, char **argv) {
    unsigned char buf[300] = {0};
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (n < 3) return 1;
    if (buf[0] == 'D') printf("%d\n", decode_payload(buf + 3, buf[2]));
    else if (buf[0] == 'S') printf("%d\n", checksum(buf + 3, (int)n - 3, buf[1]));
    return 0;
}
