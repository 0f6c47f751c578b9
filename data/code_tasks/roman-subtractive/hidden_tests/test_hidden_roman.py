from roman import to_roman


def test_subtractive_hundreds():
    assert to_roman(900) == "CM"
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(444) == "CDXLIV"


def test_small():
    assert to_roman(3) == "III"
    assert to_roman(49) == "XLIX"


def test_range():
    try:
        to_roman(0)
    except ValueError:
        return
    raise AssertionError("to_roman(0) must raise ValueError")
