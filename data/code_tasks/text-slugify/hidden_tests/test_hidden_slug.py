from textkit import slugify


def test_collapse():
    assert slugify("Hello,  World!") == "hello-world"
    assert slugify("a -- b") == "a-b"


def test_simple():
    assert slugify("Hello") == "hello"
    assert slugify("abc123") == "abc123"


def test_strip():
    assert slugify("  x ") == "x"
