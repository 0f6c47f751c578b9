from gridkit import area, clamp, in_bounds, manhattan, neighbours


def test_manhattan():
    assert manhattan((0, 0), (3, 4)) == 7
    assert manhattan((5, 1), (2, 3)) == 5


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0
    assert clamp(2, 0, 3) == 2
    assert clamp(3, 0, 3) == 3


def test_clamp_bad_range():
    try:
        clamp(1, 3, 0)
    except ValueError:
        return
    raise AssertionError("clamp with low > high must raise ValueError")


def test_neighbours_corner():
    assert neighbours(0, 0, 3, 3) == [(1, 0), (0, 1)]


def test_neighbours_edge():
    assert neighbours(2, 1, 3, 3) == [(2, 0), (2, 2), (1, 1)]


def test_area():
    assert area(3, 4) == 12
    assert area(1, 1) == 1


def test_in_bounds():
    assert in_bounds(0, 0, 2, 2) and in_bounds(1, 1, 2, 2)
    assert not in_bounds(2, 0, 2, 2) and not in_bounds(0, -1, 2, 2)
