from lru import LRUCache


def test_evicts_least_recent():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert c.get("b") is None
    assert c.get("a") == 1 and c.get("c") == 3


def test_capacity():
    c = LRUCache(1)
    c.put("x", 1)
    c.put("x", 2)
    assert len(c) == 1 and c.get("x") == 2


def test_bad_capacity():
    try:
        LRUCache(0)
    except ValueError:
        return
    raise AssertionError("capacity 0 must raise ValueError")
