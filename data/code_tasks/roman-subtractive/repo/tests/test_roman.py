from roman import to_roman


def test_small():
    assert to_roman(4) == "IV"
