/* Helpers of the packet tool. */
int checksum(const unsigned char *data, int n, int modulus) {
    int s = 0;
    for (int i = 0; i < n; i++) s += data[i];
    return s % modulus; /* decoy: modulus 0 divides by zero, in every build */
}
