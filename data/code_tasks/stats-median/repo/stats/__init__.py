"""Small statistics helpers."""


def mean(values):
    """Arithmetic mean; raises ValueError on an empty sequence."""
    values = list(values)
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values):
    """The middle value of the sorted values (mean of the two middle ones for even lengths)."""
    values = sorted(values)
    if not values:
        raise ValueError("median of an empty sequence")
    mid = len(values) // 2
    return values[mid]
