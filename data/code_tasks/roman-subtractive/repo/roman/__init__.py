"""Roman numerals."""

_TABLE = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"),
          (4, "IV"), (1, "I")]


def to_roman(n):
    """Roman numeral of 1 <= n < 4000."""
    if not 0 < n < 4000:
        raise ValueError(f"to_roman: {n} is out of range 1..3999")
    out = []
    for value, symbol in _TABLE:
        count, n = divmod(n, value)
        out.append(symbol * count)
    return "".join(out)
