/* A session command interpreter: O = open, C = close, R = read, one byte per command. */
#include <stdio.h>
#include <stdlib.h>

struct session { int id; int reads; };

static struct session *current;

static void cmd_close(void) {
    free(current);
#ifdef FIXED
    current = NULL;
#endif
}

static int cmd_read(void) {
#ifdef FIXED
    if (!current) return -1;
#endif
    current->reads++;
    return current->id;
}

int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    int c, total = 0;
    while ((c = fgetc(f)) != EOF) {
        if (c == 'O' && !current) { current = calloc(1, sizeof *current); current->id = 7; }
        else if (c == 'C' && current) cmd_close();
        else if (c == 'R' && current) total += cmd_read();
#ifdef FIXED
        else if (c == 'R') total -= 1;
#endif
    }
    fclose(f);
    printf("%d\n", total);
    return 0;
}
