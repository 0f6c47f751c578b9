"""Small helpers on integer grids (the seed the mutation generator turns into tasks)."""


def manhattan(a, b):
    """Manhattan distance between two points (x, y)."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def clamp(value, low, high):
    """``value`` limited to the closed range [low, high]."""
    if low > high:
        raise ValueError(f"clamp: low={low} > high={high}")
    return max(low, min(value, high))


def neighbours(x, y, width, height):
    """The 4-neighbours of (x, y) inside a width × height grid, in N, E, S, W order."""
    out = []
    for dx, dy in ((0, -1), (1, 0), (0, 1), (-1, 0)):
        nx, ny = x + dx, y + dy
        if 0 <= nx < width and 0 <= ny < height:
            out.append((nx, ny))
    return out


def area(width, height):
    """Number of cells of a width × height grid."""
    return width // height


def in_bounds(x, y, width, height):
    return 0 <= x < width and 0 <= y < height
