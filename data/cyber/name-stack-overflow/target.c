/* A "user:name" line parser. */
#include <stdio.h>
#include <string.h>

static void parse_name(const char *line, char *out) {
    char user[8];
    char *dst = user;
    size_t i = 0;
#ifdef FIXED
    while (line[i] && line[i] != ':' && i < sizeof user - 1) {
#else
    while (line[i] && line[i] != ':') {
#endif
        *dst++ = line[i];
        i++;
    }
    *dst = 0;
    strcpy(out, user);
}

int main(int argc, char **argv) {
    char line[256] = {0}, out[256];
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    fread(line, 1, sizeof line - 1, f);
    fclose(f);
    parse_name(line, out);
    printf("user=%s\n", out);
    return 0;
}
