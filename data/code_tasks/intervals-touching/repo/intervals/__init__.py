"""Interval arithmetic on closed integer intervals given as (start, end) tuples."""


def merge(intervals):
    """Merge overlapping or touching closed intervals; returns a sorted list."""
    out = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total_length(intervals):
    return sum(end - start for start, end in merge(intervals))
