from intervals import merge, total_length


def test_touching():
    assert merge([(1, 2), (2, 3)]) == [(1, 3)]
    assert merge([(5, 6), (1, 5)]) == [(1, 6)]


def test_overlap():
    assert merge([(1, 5), (2, 3), (7, 9)]) == [(1, 5), (7, 9)]


def test_disjoint():
    assert merge([(3, 4), (0, 1)]) == [(0, 1), (3, 4)]
    assert total_length([(0, 1), (3, 4)]) == 2
