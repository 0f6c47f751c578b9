/* A record reader: [len:u8][payload...]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PAYLOAD 16

static int read_record(const unsigned char *data, size_t size) {
    if (size < 1) return -1;
    size_t len = data[0];
    char *payload = malloc(MAX_PAYLOAD);
#ifdef FIXED
    if (len > MAX_PAYLOAD || len > size - 1) { free(payload); return -1; }
#else
    if (len > size - 1) { free(payload); return -1; }
#endif
    memcpy(payload, data + 1, len);
    int sum = 0;
    for (size_t i = 0; i < len; i++) sum += payload[i];
    free(payload);
    return sum;
}

int main(int argc, char **argv) {
    unsigned char buf[1024];
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    printf("%d\n", read_record(buf, n));
    return 0;
}
