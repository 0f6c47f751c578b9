from intervals import merge


def test_overlap():
    assert merge([(1, 5), (2, 3)]) == [(1, 5)]
