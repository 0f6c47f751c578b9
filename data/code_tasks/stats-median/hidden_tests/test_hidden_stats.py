from stats import mean, median


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5
    assert median([10, 20]) == 15


def test_median_odd():
    assert median([5, 3, 1]) == 3


def test_mean():
    assert mean([2, 4]) == 3


def test_median_empty():
    try:
        median([])
    except ValueError:
        return
    raise AssertionError("median([]) must raise ValueError")
